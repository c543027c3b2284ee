"""Benchmark: profkit's full breakdown against HTA's TraceAnalysis parse of the same trace.

Records one run of ``lora`` on the ``tiny`` preset with many profiled steps (a time trace of 100+ MB
uncompressed), then, in fresh processes and interleaved, times and measures the peak memory of
  - HTA (traceinsight): ``TraceAnalysis(trace_files={0: time trace})`` -- parsing only;
  - profkit: ``profkit.analyze.breakdown([run dir])`` -- time AND memory breakdowns of the run.
Peak memory is the process's peak RSS minus its RSS after imports. Figures are ratios to HTA, measured
in the same run. Targets: profkit no slower than HTA's parse alone; peak memory under 4x the trace size.

Usage: python analyses/bench_analysis.py [--steps 50] [--repeats 3] [--run DIR]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks" / "analysis_vs_hta.json"

MEASURE = r"""
import json, resource, sys, time, psutil
tool, path = sys.argv[1], sys.argv[2]
if tool == "hta":
    from hta.trace_analysis import TraceAnalysis
else:
    from profkit.analyze import breakdown
base = psutil.Process().memory_info().rss
t0 = time.perf_counter()
if tool == "hta":
    TraceAnalysis(trace_files={0: path + "/time.pt.trace.json.gz"}, trace_dir=path, include_last_profiler_step=True)
else:
    bd = breakdown([path])
    assert not bd.failed and len(bd.memory) and len(bd.time), bd.problems
wall = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"wall_s": wall, "peak_increase_bytes": peak - base}))
"""


def measure(tool: str, run: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", MEASURE, tool, str(run)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="profiled steps (about 2.3 MB of trace each)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run", type=Path, help="an existing run directory instead of recording one")
    args = parser.parse_args()

    run = args.run
    if run is None:
        root = Path(tempfile.mkdtemp(prefix="profkit-bench-")) / "traces"
        subprocess.run([sys.executable, "-m", "profkit", "record", "lora", "--preset", "tiny", "--device", "cpu",
                        "--steps", "2", "--profiled-steps", str(args.steps), "-o", str(root)], check=True)
        run = root / "lora"
    trace = run / "time.pt.trace.json.gz"
    size = sum(len(chunk) for chunk in iter(lambda f=gzip.open(trace): f.read(1 << 24), b""))
    results: dict[str, list[dict]] = {"hta": [], "profkit": []}
    for _ in range(args.repeats):
        for tool in results:  # interleaved, so drift hits both alike
            results[tool].append(measure(tool, run))
    med = {tool: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "peak_increase_bytes")}
           for tool, rs in results.items()}
    summary = {
        "trace": str(trace), "trace_bytes_uncompressed": size, "trace_bytes_gzip": trace.stat().st_size,
        "repeats": args.repeats, "median": med, "runs": results,
        "profkit_time_over_hta_parse": med["profkit"]["wall_s"] / med["hta"]["wall_s"],
        "profkit_peak_memory_over_trace_size": med["profkit"]["peak_increase_bytes"] / size,
        "hta_peak_memory_over_trace_size": med["hta"]["peak_increase_bytes"] / size,
        "cpu_count": os.cpu_count(),
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    print(f"trace: {size / 2**20:.1f} MiB uncompressed ({trace.stat().st_size / 2**20:.1f} MiB gzip)")
    for tool, m in med.items():
        print(f"{tool:8s} {m['wall_s']:7.2f} s   peak +{m['peak_increase_bytes'] / 2**20:7.1f} MiB")
    print(f"profkit full breakdown / HTA parse: time x{summary['profkit_time_over_hta_parse']:.2f}; "
          f"profkit peak memory = {summary['profkit_peak_memory_over_trace_size']:.2f}x trace size "
          f"(HTA {summary['hta_peak_memory_over_trace_size']:.2f}x)  -> {OUT}")


if __name__ == "__main__":
    main()
