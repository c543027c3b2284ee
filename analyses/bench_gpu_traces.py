"""Benchmark: profkit's breakdown of real GPU traces against HTA (traceinsight) on the same files.

For every Kineto trace in ``../shared/fixtures/gpu-traces/`` (recorded by others on A100, H100, V100, MI300X,
RTX 2080 Ti GPUs) and for a trace of at least 1 GB built by repeating the profiler steps of a real GPU
trace, each tool runs in a fresh process, the two interleaved, ``--repeats`` times:
  - HTA: ``TraceAnalysis(trace_files={0: trace})`` (its parse) plus ``get_temporal_breakdown()``;
  - profkit: ``profkit.analyze.breakdown([trace])`` -- the whole time breakdown the CLI prints.
Each process first analyses a small trace (so lazy imports and first-use allocations are not counted), then
resets its peak RSS (/proc/self/clear_refs); wall time is measured around the call, peak memory is the peak
RSS during it minus the RSS before it.
Figures are ratios measured in the same run: speed-up = HTA wall / profkit wall, and profkit's peak over
the uncompressed trace size. Targets: speed-up >= 4, peak <= 2x the trace. The GPU busy time of both tools
is reported too (they must agree where HTA reads the trace).

Usage: python analyses/bench_gpu_traces.py [--repeats 3] [--big-gb 1.0] [--skip-big]
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

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "gpu-traces"
OUT = ROOT / "reports" / "benchmarks" / "gpu_traces_vs_hta.json"
SOURCE_OF_BIG = "v100_2rank_rank1_memory_events.json.gz"

MEASURE = r"""
import json, logging, os, re, sys, time, warnings
tool, path, warmup = sys.argv[1], sys.argv[2], sys.argv[3]
warnings.filterwarnings("ignore")
if tool == "hta":
    from hta.trace_analysis import TraceAnalysis
    logging.disable(logging.CRITICAL)
else:
    from profkit.analyze import breakdown


def status(key):
    return int(re.search(key + r":\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024


def run(trace):
    if tool == "hta":
        ta = TraceAnalysis(trace_files={0: trace}, trace_dir=os.path.dirname(trace), include_last_profiler_step=True)
        row = ta.get_temporal_breakdown(visualize=False).iloc[0]
        return float(row["compute_time(us)"] + row["non_compute_time(us)"])
    bd = breakdown([trace])
    assert not bd.failed, bd.problems
    r = bd.runs.iloc[0]
    gpu = bd.time[(bd.time.resource == "gpu") & (bd.time.category != "idle")]
    return float(gpu.seconds.sum() * r.profiled_steps * 1e6)


run(warmup)  # lazy imports and first-use allocations of both tools happen here, not in the measurement
open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS (VmHWM) to the current RSS
base = status("VmRSS")
t0 = time.perf_counter()
busy_us = run(path)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "peak_increase_bytes": status("VmHWM") - base, "gpu_busy_us": busy_us}))
"""
WARMUP = FIXTURES / "a100_alexnet_single.json.gz"


def measure(tool: str, trace: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, tool, str(trace), str(WARMUP)], capture_output=True,
                          text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def uncompressed_size(path: Path) -> int:
    if path.suffix != ".gz":
        return path.stat().st_size
    with gzip.open(path, "rb") as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 24), b""))


def build_big(source: Path, target_bytes: int, out: Path) -> Path:
    """Repeat the source's events (all of them, shifted in time past the previous copy, correlation ids
    and ProfilerStep numbers offset) until the uncompressed JSON reaches ``target_bytes``."""
    with gzip.open(source, "rt") as fh:
        trace = json.load(fh)
    events = trace.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(e["ts"] + e.get("dur", 0) for e in timed) - min(e["ts"] for e in timed) + 1000
    max_corr = max(int((e.get("args") or {}).get("correlation", 0)) for e in events) + 1
    steps = [int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_span = (max(steps) - min(steps) + 1) if steps else 0
    encoded = [json.dumps(e) for e in events]
    per_copy = sum(len(s) + 2 for s in encoded)
    copies = max(1, -(-target_bytes // per_copy))
    with out.open("w") as fh:
        head = json.dumps(trace)[:-1]
        fh.write(head + (", " if trace else "") + '"traceEvents": [\n')
        first = True
        for c in range(copies):
            for e, text in zip(events, encoded):
                if c:
                    e = dict(e)
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = e["ts"] + c * span
                    args = e.get("args")
                    if isinstance(args, dict) and "correlation" in args:
                        e["args"] = {**args, "correlation": int(args["correlation"]) + c * max_corr}
                    if str(e.get("name", "")).startswith("ProfilerStep#"):
                        e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + c * step_span}"
                    text = json.dumps(e)
                fh.write(("" if first else ",\n") + text)
                first = False
        fh.write("\n]}\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big-gb", type=float, default=1.0, help="size of the synthesized trace (uncompressed)")
    parser.add_argument("--skip-big", action="store_true")
    args = parser.parse_args()

    traces = sorted(p for p in FIXTURES.rglob("*.json.gz") if "memory_timeline" not in p.name)
    tmp = Path(tempfile.mkdtemp(prefix="profkit-bench-"))
    if not args.skip_big:
        big = build_big(FIXTURES / SOURCE_OF_BIG, int(args.big_gb * 1e9), tmp / "v100_repeated_steps.json")
        traces.append(big)
    results = {}
    for trace in traces:
        size = uncompressed_size(trace)
        repeats = 1 if size > 5e8 else args.repeats
        runs = {"hta": [], "profkit": []}
        for _ in range(repeats):
            for tool in ("hta", "profkit"):
                runs[tool].append(measure(tool, trace))
        row = {"trace": str(trace.relative_to(FIXTURES) if trace.is_relative_to(FIXTURES) else trace.name),
               "uncompressed_bytes": size, "repeats": repeats, "runs": runs}
        ok = {t: [r for r in rs if "error" not in r] for t, rs in runs.items()}
        if ok["profkit"]:
            pk_wall = statistics.median(r["wall_s"] for r in ok["profkit"])
            pk_peak = statistics.median(r["peak_increase_bytes"] for r in ok["profkit"])
            row.update(profkit_wall_s=pk_wall, profkit_peak_bytes=pk_peak, profkit_peak_over_trace=pk_peak / size)
        if ok["hta"] and ok["profkit"]:
            hta_wall = statistics.median(r["wall_s"] for r in ok["hta"])
            row.update(hta_wall_s=hta_wall, hta_peak_bytes=statistics.median(r["peak_increase_bytes"] for r in ok["hta"]),
                       speedup_vs_hta=hta_wall / row["profkit_wall_s"],
                       gpu_busy_us={"hta": ok["hta"][0]["gpu_busy_us"], "profkit": ok["profkit"][0]["gpu_busy_us"]})
        elif not ok["hta"]:
            row["hta_error"] = runs["hta"][0].get("error")
        results[row["trace"]] = row
        print(f"{row['trace']:48s} {size / 1e6:8.1f} MB  profkit {row.get('profkit_wall_s', float('nan')):6.2f} s "
              f"peak {row.get('profkit_peak_over_trace', float('nan')):4.2f}x trace  "
              f"HTA {row.get('hta_wall_s', float('nan')):6.2f} s  speed-up {row.get('speedup_vs_hta', float('nan')):5.2f}x",
              flush=True)
    summary = {"machine": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0]},
               "targets": {"speedup_vs_hta": 4.0, "peak_over_trace": 2.0}, "traces": results}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
