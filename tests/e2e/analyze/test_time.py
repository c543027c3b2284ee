"""

The tests that record, train or start a process; those on stored fixtures are in ``tests/analyze/test_time.py``."""

import pytest

from profkit.analyze import breakdown
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.core.methods import METHODS


@pytest.fixture(scope="module")
def bd(matrix):
    return breakdown([matrix])


@pytest.mark.parametrize("name", list(METHODS))
def test_host_time_is_covered_and_adds_up(bd, name):
    t = bd.time[(bd.time.run == name) & (bd.time.resource == "cpu")]
    run = bd.runs.set_index("run").loc[name]
    assert set(t.category) <= set(TIME_CATEGORIES)
    # Self times of the profiled thread add up to the profiled step's wall time.
    assert t.seconds.sum() == pytest.approx(run.profiled_step_time_s, rel=1e-3)
    # Covered by ops and runtime calls, unless the profiled steps' threads waited for a CPU (another process on
    # every core, as the session's background recordings are in CI): then the gaps are waiting, and the run says so.
    assert run.coverage_cpu >= 0.95 or (run.profiled_contended and run.coverage_cpu >= 0.5), \
        (run.coverage_cpu, run.profiled_contended)
    phases = set(t.phase)
    assert phases >= ({"forward", "backward", "optimizer"} if METHODS[name].kind == "train" else {"generate"})


def cat_time(bd, run, category):
    t = bd.time[(bd.time.run == run) & (bd.time.category == category)]
    return t.seconds.sum()


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.kind == "train"])
def test_context_categories_follow_the_method(bd, name):
    m = METHODS[name]
    assert (cat_time(bd, name, "recompute") > 0) == m.gradient_checkpointing
    assert (cat_time(bd, name, "quantization") > 0) == (m.quantization == "nf4")
    assert (cat_time(bd, name, "communication") > 0) == bool(m.zero_stage)
    for cat in ("gemm", "attention", "norm", "embedding_loss", "optimizer"):
        assert cat_time(bd, name, cat) > 0, cat


def test_recompute_is_forward_work_rerun_in_backward(bd):
    rec = bd.time[(bd.time.run == "lora_gc") & (bd.time.category == "recompute")]
    assert set(rec.phase) == {"backward"}
