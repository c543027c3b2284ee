"""Several ranks of one job, recorded by others: the cross-rank view, checked against the raw JSON and
against HTA reading the same set of ranks."""

import gzip
import json
import shutil

import pytest

from profkit.analyze import breakdown, ranks
from profkit.report import findings
from tests.conftest import GPU_TRACES, run_cli

DLRM = GPU_TRACES / "dlrm_8rank"


@pytest.fixture(scope="module")
def dlrm():
    return breakdown([DLRM])


def raw(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def test_ranks_are_read_from_distributed_info(dlrm):
    (group, runs), = ranks.groups(dlrm).items()
    assert group == "dlrm_8rank (8 of 8 ranks)"
    expected = {p.name.removesuffix(".json.gz"): raw(p)["distributedInfo"]["rank"] for p in DLRM.glob("*.json.gz")}
    assert {r: int(dlrm.runs.set_index("run").loc[r, "rank"]) for r in runs} == expected


def test_step_start_skew_equals_the_raw_timestamps(dlrm):
    first = {}
    for p in DLRM.glob("*.json.gz"):
        steps = [e["ts"] for e in raw(p)["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")
                 and e.get("ph") == "X" and e.get("cat") in ("user_annotation", "cpu_op")]
        first[p.name.removesuffix(".json.gz")] = min(steps)
    earliest = min(first.values())
    s = ranks.rank_summary(dlrm).set_index("run")
    for run, ts in first.items():
        assert s.loc[run, "start_skew_ms"] == pytest.approx((ts - earliest) / 1e3, abs=1e-9)


def test_gpu_busy_time_per_rank_equals_hta_on_the_whole_set(dlrm):
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(DLRM), include_last_profiler_step=True)
    hta = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    runs = dlrm.runs.set_index("run")
    for run, row in runs.iterrows():
        gpu = dlrm.time[(dlrm.time.run == run) & (dlrm.time.resource == "gpu") & (dlrm.time.category != "idle")]
        busy_us = gpu.seconds.sum() * row.profiled_steps * 1e6
        h = hta.loc[int(row["rank"])]
        assert busy_us == pytest.approx(h["compute_time(us)"] + h["non_compute_time(us)"], rel=1e-9)


def test_across_ranks_table_and_finding(dlrm):
    across = ranks.across_ranks(dlrm)
    comm = across[across.category == "communication"].iloc[0]
    per_rank = ranks.rank_summary(dlrm)
    assert comm.max_s == pytest.approx(per_rank.communication_s.max())  # exposed communication, per step
    assert int(per_rank.loc[per_rank.communication_s.idxmax(), "rank"]) == comm.slowest_rank
    text = " ".join(findings.rank_sentences(dlrm))
    slowest = int(per_rank.loc[per_rank.step_s.idxmax(), "rank"])
    assert f"the slowest rank is {slowest}" in text


def test_two_ranks_of_a_larger_job_and_the_cli(tmp_path):
    for name in ("a100_distributed_rank0.json.gz", "a100_distributed_rank1.json.gz"):
        shutil.copy(GPU_TRACES / name, tmp_path / name)
    bd = breakdown([tmp_path])
    (group, runs), = ranks.groups(bd).items()
    assert group.endswith("(2 of 128 ranks)") and len(runs) == 2
    out = run_cli("breakdown", str(DLRM), env={"COLUMNS": "80"})
    assert out.returncode == 0 and "time per step across ranks" in out.stdout and "start skew" in out.stdout


def test_the_report_names_the_slowest_rank(dlrm, tmp_path):
    from profkit.report.document import write_report

    rep = write_report([DLRM], tmp_path / "ranks")
    text = rep.markdown_path.read_text()
    assert "the slowest rank is" in text
    assert tmp_path / "ranks" / "ranks.png" in rep.images and "![Ranks of one job side by side](ranks.png)" in text
    assert "| communication exposed |" in text.replace("  ", " ") or "communication exposed" in text


@pytest.mark.parametrize("names", [None, ("a100_distributed_rank0.json.gz", "a100_distributed_rank1.json.gz")])
def test_communication_overlap_per_rank_equals_hta(names, tmp_path):
    """HTA's comm/compute overlap (communication kernel time under compute kernels, over all communication time)
    from profkit's exposed and overlapped communication, rank by rank."""
    from hta.trace_analysis import TraceAnalysis

    folder = DLRM
    if names:
        folder = tmp_path
        for name in names:
            shutil.copy(GPU_TRACES / name, tmp_path / name)
    hta = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True).get_comm_comp_overlap(
        visualize=False).set_index("rank")
    summary = ranks.rank_summary(breakdown([folder]))
    assert len(summary) == len(hta)
    for _, r in summary.iterrows():
        ours = 100 * r.communication_overlapped_s / (r.communication_s + r.communication_overlapped_s)
        assert ours == pytest.approx(hta.loc[r["rank"], "comp_comm_overlap_pctg"], abs=0.005 + 1e-9)


def test_ranks_analysed_in_worker_processes_give_the_same_tables(dlrm):
    import pandas as pd

    parallel = breakdown([DLRM], jobs=2)
    for name in ("runs", "time", "time_by_name"):
        pd.testing.assert_frame_equal(getattr(parallel, name), getattr(dlrm, name))
    pd.testing.assert_frame_equal(ranks.rank_summary(parallel), ranks.rank_summary(dlrm))
