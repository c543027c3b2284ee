"""Discovery: what ``breakdown`` analyses when given a run, a run of several ranks, or one rank's directory."""

import json
import shutil

import pytest

from profkit.analyze import breakdown, discover
from tests.conftest import GPU_TRACES

RANK_TRACES = [GPU_TRACES / "a100_distributed_rank0.json.gz", GPU_TRACES / "a100_distributed_rank1.json.gz"]


def _manifest(path, **fields):
    path.mkdir(parents=True, exist_ok=True)
    (path / "manifest.json").write_text(json.dumps({"schema_version": 3, "method": "lora", "run": "lora",
                                                    "status": "ok", **fields}))


@pytest.fixture
def two_ranks(tmp_path):
    """A complete run of two ranks: the run's record, and each rank's own record and time trace in rank<k>/."""
    run = tmp_path / "lora"
    _manifest(run, world_size=2, ranks=[{"rank": k, "status": "ok", "reason": None} for k in range(2)])
    for k, trace in enumerate(RANK_TRACES):
        _manifest(run / f"rank{k}", world_size=2, rank=k)
        shutil.copy(trace, run / f"rank{k}" / "time.pt.trace.json.gz")
    return run


def test_a_run_of_several_ranks_is_each_rank(two_ranks):
    sources, problems = discover([two_ranks])
    assert [(s.run, s.path) for s in sources] == [("lora/rank0", two_ranks / "rank0"),
                                                  ("lora/rank1", two_ranks / "rank1")]
    assert problems == []


@pytest.mark.parametrize("k", [0, 1])
def test_a_ranks_own_directory_is_that_rank(two_ranks, k):
    """A rank's record carries the run's world size; its directory holds no ranks of its own."""
    rank = two_ranks / f"rank{k}"
    sources, problems = discover([rank])
    assert [(s.run, s.path, s.record.rank) for s in sources] == [(f"lora/rank{k}", rank, k)]
    assert problems == []
    bd = breakdown([rank], jobs=1)
    assert not any("unreadable" in p.message or f"rank{k}/rank" in str(p.path) for p in bd.problems), bd.problems
    row = bd.runs.iloc[0]
    assert (row.run, row.status, int(row["rank"]), int(row.world_size)) == (f"lora/rank{k}", "ok", k, 2)
    assert bd.time.run.unique().tolist() == [f"lora/rank{k}"]
