"""DDP, an unsharded method on several ranks: each rank holds a whole replica, and DDP's reducer a second copy of the
trainable gradients in its buckets, from the wrap on. The estimate's buckets are checked against those DDP allocates
when it wraps the real model (gloo, a group of one in this process: the buckets do not depend on the ranks), and a
user's DDP script recorded under torchrun against its estimate; the published pairs with and without DDP are in the
held-out comparison (rasbt's GPT-2 124M: 0.29 GiB measured between one GPU and four under DDP, the buckets' 0.30
GiB)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from profkit.analyze import breakdown
from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.model.build import build_model
from profkit.predict.estimate import estimate_run
from profkit.record.hf import is_trainer_ddp
from profkit.record.inventory import ddp_bucket_sizes
from tests.conftest import torchrun, users_distributed_script


@pytest.fixture
def group_of_one():
    """A gloo group of this process alone, on an in-memory store: nothing set in the environment, which the
    tests' subprocesses inherit (accelerate would take RANK and WORLD_SIZE for a launch of its own)."""
    made = not dist.is_initialized()
    if made:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if made:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["full", "full_gc", "lora", "qlora"])
def test_the_estimate_holds_the_buckets_ddp_allocates(name, group_of_one):
    method = get_method(name)
    settings = RunSettings(method=name, preset="micro").resolved()
    alone, replicated = (estimate_run(method, settings, "cpu", ranks) for ranks in (1, 2))
    buckets = sum(ddp_bucket_sizes(DistributedDataParallel(build_model(method, settings, "cpu"))))
    assert buckets > 0 and replicated.detail["ddp_gradient_buckets"] == buckets
    for instant, categories in alone.instants.items():
        more = {c: replicated.instants[instant][c] - b for c, b in categories.items()}
        assert more == {c: buckets if c == "gradients" else 0 for c in categories}, (instant, more)
    assert any(n.startswith("DDP over 2 ranks") for n in replicated.notes)
    assert not any("DDP" in n for n in alone.notes)


USER_SCRIPT = users_distributed_script("my_ddp", "from torch.nn.parallel import DistributedDataParallel",
                                       "model = DistributedDataParallel(model)")


def test_a_users_ddp_script_under_torchrun(tmp_path):
    """Each rank's record holds DDP's buckets as DDP reports them, the breakdown counts them as gradients (no op
    saw them), and the estimate predicts the same bytes for the model found inside the wrapper."""
    torchrun(USER_SCRIPT, tmp_path)
    bd = breakdown([tmp_path / "traces" / "my_ddp"])
    assert set(bd.runs.status) == {"ok"} and list(bd.runs["rank"]) == [0, 1]
    runs = bd.runs.set_index("run")
    for k in range(2):
        run = f"my_ddp/rank{k}"
        record = bd.records[run]
        trainable = sum(r["bytes"] for r in record.inventory["rows"] if r["owner"] == "parameters_trainable")
        buckets = sum(r["bytes"] for r in record.inventory["rows"] if r["owner"] == "ddp_buckets")
        assert buckets == trainable == record.estimate["detail"]["ddp_gradient_buckets"]
        assert record.estimate["settings"]["world_size"] == 2 and record.model["found"]["data_parallel"]
        measured, predicted = runs.loc[run].measured_peak_bytes, runs.loc[run].predicted_peak_bytes
        assert abs(predicted - measured) <= 0.01 * measured, (measured, predicted)
        assert buckets > 0.1 * measured  # without them either side would be off by more than 10%
        peak = bd.memory[(bd.memory.run == run) & (bd.memory.phase == "peak")].set_index("category").bytes
        assert peak["gradients"] >= buckets and peak["unattributed"] == 0


@pytest.mark.parametrize("args, found, ddp", [
    ({"world_size": 2, "deepspeed": None, "fsdp": []}, {"fsdp": False, "zero_stage": 0}, True),
    ({"world_size": 1, "deepspeed": None, "fsdp": []}, {"fsdp": False, "zero_stage": 0}, False),
    ({"world_size": 2, "deepspeed": "ds.json", "fsdp": []}, {"fsdp": False, "zero_stage": 2}, False),
    ({"world_size": 2, "deepspeed": None, "fsdp": ["full_shard"]}, {"fsdp": True, "zero_stage": 0}, False),
])
def test_the_trainer_on_several_unsharded_processes_is_ddp(args, found, ddp):
    """The Trainer hands its callbacks the model unwrapped: DDP is read from its arguments and the method found."""
    session = SimpleNamespace(record=SimpleNamespace(model={"found": found}))
    assert is_trainer_ddp(SimpleNamespace(**args), session) is ddp
