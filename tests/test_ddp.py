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

from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.model.build import build_model
from profkit.predict.estimate import estimate_run
from profkit.record.hf import is_trainer_ddp
from profkit.record.inventory import ddp_bucket_sizes


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
