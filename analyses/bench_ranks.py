"""Benchmark: the cross-rank analysis of 64 ranks, profkit against HTA (traceinsight) on the same set.

Three sets of 64 ranks are synthesised from real fixtures (``../shared/fixtures/gpu-traces``): the 8-rank DLRM
set repeated 8 times, the A100 rank pair repeated 32 times, and the MI300X trace (with memory events) 64 times,
each copy given its own rank in ``distributedInfo``. The last is large enough for profkit to use worker processes. Each tool runs in a fresh process, the two interleaved, ``--repeats`` times:
  - HTA: ``TraceAnalysis(trace_dir=...)`` (its parallel parse of every rank), ``get_temporal_breakdown()`` and
    ``get_comm_comp_overlap()``;
  - profkit: ``breakdown([dir])`` (ranks analysed in parallel worker processes), ``ranks.rank_summary`` and
    ``ranks.across_ranks``.
Wall time is measured around the whole call, imports excluded; peak memory is the highest total RSS of the
process and all its children, sampled every 20 ms. Figures are ratios measured in the same run: speed-up =
HTA wall / profkit wall, memory = profkit peak / HTA peak. Both tools' communication overlap per rank is
compared as a check that they analysed the same thing.

Usage: python analyses/bench_ranks.py [--repeats 3] [--ranks 64]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "gpu-traces"
OUT = ROOT / "reports" / "benchmarks" / "ranks_vs_hta.json"
SETS = {"dlrm_8rank": sorted((FIXTURES / "dlrm_8rank").glob("*.json.gz")),
        "a100_pair": [FIXTURES / "a100_distributed_rank0.json.gz", FIXTURES / "a100_distributed_rank1.json.gz"],
        # Large enough (about 400 MB) that profkit analyses the ranks in worker processes.
        "mi300x_x64": [FIXTURES / "mi300x_qwen1.5-0.5b_hf_memory.json.gz"]}

MEASURE = r"""
import json, logging, sys, time, warnings
tool, folder = sys.argv[1], sys.argv[2]
warnings.filterwarnings("ignore")
if tool == "hta":
    from hta.trace_analysis import TraceAnalysis
    logging.disable(logging.CRITICAL)
else:
    from profkit.analyze import breakdown, ranks
print("ready", flush=True)
sys.stdin.readline()
t0 = time.perf_counter()
error = None
if tool == "hta":
    ta = TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
    ta.get_temporal_breakdown(visualize=False)
    try:
        overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank").comp_comm_overlap_pctg.to_dict()
    except Exception as exc:  # HTA fails on ranks without communication kernels
        overlap, error = {}, f"get_comm_comp_overlap: {type(exc).__name__}: {exc}"
else:
    bd = breakdown([folder])
    s = ranks.rank_summary(bd)
    ranks.across_ranks(bd)
    total = s.communication_s + s.communication_overlapped_s
    overlap = {int(r["rank"]): round(100 * r.communication_overlapped_s / t, 2) for (_, r), t in zip(s.iterrows(), total) if t > 0}
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "overlap": {str(k): v for k, v in overlap.items()}, "error": error}), flush=True)
"""


def synthesise(sources: list[Path], n_ranks: int, folder: Path) -> int:
    total = 0
    for k in range(n_ranks):
        with gzip.open(sources[k % len(sources)], "rt") as fh:
            trace = json.load(fh)
        info = trace.setdefault("distributedInfo", {})
        info.update(rank=k, world_size=n_ranks)
        data = json.dumps(trace).encode()
        total += len(data)
        with gzip.open(folder / f"rank{k}.json.gz", "wb", compresslevel=1) as fh:
            fh.write(data)
    return total


def measure(tool: str, folder: Path) -> dict:
    proc = subprocess.Popen([sys.executable, "-c", MEASURE, tool, str(folder)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "ready"
    base = psutil.Process(proc.pid).memory_info().rss
    peak = [base]
    done = threading.Event()

    def sample() -> None:
        parent = psutil.Process(proc.pid)
        while not done.is_set():
            try:
                rss = parent.memory_info().rss + sum(c.memory_info().rss for c in parent.children(recursive=True))
                peak[0] = max(peak[0], rss)
            except psutil.Error:
                pass
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{tool} failed on {folder}: {proc.stderr.read()[-2000:]}")
    result = json.loads(line)
    done.set()
    sampler.join()
    proc.wait()
    return {**result, "peak_rss_bytes": peak[0], "rss_before_bytes": base}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=64)
    args = parser.parse_args()
    results = {"ranks": args.ranks, "cpu_count": psutil.cpu_count(), "repeats": args.repeats, "sets": {}}
    for name, sources in SETS.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            size = synthesise(sources, args.ranks, folder)
            runs = {"hta": [], "profkit": []}
            for _ in range(args.repeats):
                for tool in runs:
                    runs[tool].append(measure(tool, folder))
        wall = {t: statistics.median(r["wall_s"] for r in rs) for t, rs in runs.items()}
        peak = {t: statistics.median(r["peak_rss_bytes"] for r in rs) for t, rs in runs.items()}
        hta_overlap, ours = runs["hta"][0]["overlap"], runs["profkit"][0]["overlap"]
        worst = max((abs(hta_overlap[k] - ours[k]) for k in hta_overlap if k in ours), default=None)
        results["sets"][name] = {
            "uncompressed_bytes": size, "wall_s": wall, "peak_rss_bytes": peak,
            "speedup_vs_hta": wall["hta"] / wall["profkit"], "peak_ratio_vs_hta": peak["profkit"] / peak["hta"],
            "overlap_max_abs_diff_pct_points": worst, "runs": runs}
        print(f"{name}: {args.ranks} ranks, {size / 1e6:.0f} MB: profkit {wall['profkit']:.2f} s, HTA {wall['hta']:.2f} s "
              f"(speed-up {wall['hta'] / wall['profkit']:.2f}x); peak RSS profkit {peak['profkit'] / 2**20:.0f} MiB, "
              f"HTA {peak['hta'] / 2**20:.0f} MiB ({peak['profkit'] / peak['hta']:.2f}x); overlap differs by at most "
              + (f"{worst:.2f} points" if worst is not None else "- (no communication to compare)"))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(results, indent=2))
    print(f"written {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
