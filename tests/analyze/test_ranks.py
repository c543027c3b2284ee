"""Several ranks of one job, recorded by others: the cross-rank view, checked against the raw JSON and
against HTA reading the same set of ranks."""

import gzip
import json
import shutil

import pytest

from profkit.analyze import breakdown, ranks
from profkit.report import findings
from tests.conftest import invoke, GPU_TRACES

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
    assert int(per_rank.loc[per_rank.communication_s.idxmax(), "rank"]) == comm.rank_with_most
    text = " ".join(findings.rank_sentences(dlrm))
    # The rank that waits least in its collectives is the one the others wait for (not the slowest step's).
    waits_least = int(per_rank.loc[per_rank.communication_s.idxmin(), "rank"])
    assert f"the others wait for rank {waits_least}" in text


def test_two_ranks_of_a_larger_job_and_the_cli(tmp_path):
    for name in ("a100_distributed_rank0.json.gz", "a100_distributed_rank1.json.gz"):
        shutil.copy(GPU_TRACES / name, tmp_path / name)
    bd = breakdown([tmp_path])
    (group, runs), = ranks.groups(bd).items()
    assert group.endswith("(2 of 128 ranks)") and len(runs) == 2
    out = invoke("breakdown", str(DLRM), env={"COLUMNS": "80"})
    assert out.returncode == 0 and "time per step across ranks" in out.stdout and "start skew" in out.stdout


def test_the_report_names_the_rank_the_others_wait_for(dlrm, tmp_path):
    from profkit.report.document import write_report

    rep = write_report([DLRM], tmp_path / "ranks")
    text = rep.markdown_path.read_text()
    assert "the others wait for rank" in text
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


def synthetic_rank(path, rank: int, compute_ms: float, wait_ms: float, steps: int = 3):
    """A GPU trace of one rank of two: per step a GEMM for ``compute_ms`` then an NCCL all-reduce that lasts
    ``wait_ms`` (what it waits for the other rank, plus the transfer), each launched by a CPU op."""
    events, ts, corr = [], 0.0, 0
    step_us = (compute_ms + wait_ms) * 1e3 + 100
    for k in range(steps):
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k}", "pid": 1, "tid": 1,
                       "ts": ts, "dur": step_us})
        start = ts + 10
        for name, op, dur in (("ampere_sgemm_128x64_nn", "aten::mm", compute_ms * 1e3),
                              ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "c10d::allreduce_", wait_ms * 1e3)):
            corr += 1
            events += [{"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": start, "dur": 5},
                       {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                        "ts": start + 1, "dur": 3, "args": {"correlation": corr}},
                       {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": start + 5, "dur": dur,
                        "args": {"correlation": corr, "stream": 7, "device": 0}}]
            start += dur + 5
        ts += step_us
    path.write_text(json.dumps({"distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2},
                                "traceEvents": events}))


@pytest.mark.parametrize("times, expected", [
    (((8.0, 1.0), (4.0, 5.0)), ("straggler", 0)),  # rank 0 computes 4 ms more: rank 1 waits for it
    (((4.0, 5.0), (8.0, 1.0)), ("straggler", 1)),
    (((6.0, 3.0), (6.0, 3.02)), ("lockstep", None)),  # 20 µs apart: within the noise
])
def test_the_verdict_names_the_rank_the_others_wait_for(tmp_path, times, expected):
    for rank, (compute_ms, wait_ms) in enumerate(times):
        synthetic_rank(tmp_path / f"rank{rank}.json", rank, compute_ms, wait_ms)
    bd = breakdown([tmp_path])
    v = ranks.verdict(bd).iloc[0]
    assert v.verdict == expected[0]
    text = " ".join(findings.rank_sentences(bd))
    if expected[0] == "straggler":
        assert v["rank"] == expected[1]
        assert v.compute_s - v.peers_compute_s == pytest.approx(4e-3, rel=1e-6)
        assert v.peers_waiting_s - v.waiting_s == pytest.approx(4e-3, rel=1e-6)
        assert f"the others wait for rank {expected[1]}" in text and "computes 4.00 ms more" in text
    else:
        assert "in lockstep" in text


def test_every_figure_of_the_rank_tables_is_in_the_json(dlrm):
    """The per-rank table and the verdict as the terminal prints them, found again in ``--format json``."""
    from typer.testing import CliRunner

    from profkit.cli import app

    terminal = CliRunner().invoke(app, ["breakdown", str(DLRM)], env={"COLUMNS": "200"}).output
    records = json.loads(CliRunner().invoke(app, ["breakdown", str(DLRM), "-f", "json"]).output)["runs"]
    by_rank = {r["ranks"]["this_rank"]["rank"]: r["ranks"]["this_rank"] for r in records}
    table = terminal[terminal.index("each rank, per step"):]
    seen = 0
    for line in table.splitlines():
        cells = line.split()
        if len(cells) == 13 and cells[0].isdigit():  # rank, then six figures with their units
            row = by_rank[int(cells[0])]
            figures = [float(v) for v in cells[1::2]]
            expected = [row[k] * 1e3 for k in ("step_s", "compute_s", "communication_s", "idle_s",
                                               "communication_overlapped_s")] + [row["start_skew_ms"]]
            assert figures == pytest.approx([round(e, 2) for e in expected], abs=0.006)
            seen += 1
    assert seen == 8
    v = records[0]["ranks"]["verdict"]
    assert f"waits {v['waiting_s'] * 1e3:.2f} ms per step" in terminal.replace("\n", " ")
    assert f"a median of {v['peers_waiting_s'] * 1e3:.2f} ms" in terminal.replace("\n", " ")


def test_json_figures_hold_every_figure_of_the_runs_table(dlrm):
    """``figures`` carries every per-run column the analysis has (a foreign trace's profiled step, coverage and
    peak; a generation run's TTFT, TPOT and KV cache are columns of the same table)."""
    from profkit.report.formats import to_records

    records = {r["run"]: r for r in to_records(dlrm)}
    for _, row in dlrm.runs.iterrows():
        figures = records[row["run"]]["figures"]
        present = {k: v for k, v in row.items() if k != "settings" and not (isinstance(v, float) and v != v)
                   and v is not None}
        assert figures.keys() == present.keys()
        for k, v in present.items():
            assert figures[k] == (pytest.approx(v) if isinstance(v, float) else v), k


def test_a_directory_of_several_jobs_compares_only_the_ranks_that_can_be_told_apart(tmp_path):
    """Two traces of the same rank and world size in one directory are two jobs' traces: those ranks are not
    compared (nothing says which belong together), and the reason is in the terminal and the JSON; another job's
    ranks beside them still are."""
    for name in ("a100_distributed_rank0.json.gz", "a100_distributed_rank1.json.gz"):
        shutil.copy(GPU_TRACES / name, tmp_path / name)
    for name in ("dlrm_rank0.json.gz", "dlrm_rank1.json.gz"):
        shutil.copy(DLRM / name, tmp_path / name)
    shutil.copy(DLRM / "dlrm_rank1.json.gz", tmp_path / "another_job_rank1.json.gz")
    bd = breakdown([tmp_path])
    (group, runs), = ranks.groups(bd).items()
    assert group.endswith("(2 of 128 ranks)") and len(runs) == 2
    assert sorted(ranks.unmatched(bd)) == ["another_job_rank1", "dlrm_rank0", "dlrm_rank1"]
    terminal = invoke("breakdown", str(tmp_path), env={"COLUMNS": "80"})
    assert terminal.returncode == 0, terminal.stderr
    said = " ".join(terminal.stdout.split())
    assert said.count("traces of world size 8 repeat rank 1") == 1 and "Traceback" not in terminal.stderr
    records = {r["run"]: r for r in json.loads(invoke("breakdown", str(tmp_path), "-f", "json").stdout)["runs"]}
    assert "repeat rank 1" in records["dlrm_rank0"]["ranks"]["not_compared"]
    assert records["a100_distributed_rank0"]["ranks"]["group"] == group
