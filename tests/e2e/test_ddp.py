"""DDP, an unsharded method on several ranks: each rank holds a whole replica, and DDP's reducer a second copy of the
trainable gradients in its buckets, from the wrap on. The estimate's buckets are checked against those DDP allocates
when it wraps the real model (gloo, a group of one in this process: the buckets do not depend on the ranks), and a
user's DDP script recorded under torchrun against its estimate; the published pairs with and without DDP are in the
held-out comparison (rasbt's GPT-2 124M: 0.29 GiB measured between one GPU and four under DDP, the buckets' 0.30
GiB).

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_ddp.py``."""

from __future__ import annotations

import pytest

from profkit.analyze import breakdown
from tests.conftest import torchrun, users_distributed_script

USER_SCRIPT = users_distributed_script("my_ddp", "from torch.nn.parallel import DistributedDataParallel",
                                       "model = DistributedDataParallel(model)")


@pytest.mark.long
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
