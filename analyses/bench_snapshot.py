"""Benchmark: ``profkit snapshot``'s analysis of an allocator snapshot with a million history events.

The snapshot is synthesised from a real one (``cs336_gpt_medium_ctx128_training.pickle.gz``, one training step on a
GPU): the allocations of its history that are also freed within it (so each copy leaves the allocator as it found
it) are repeated, shifted in time, until the history holds ``--events`` entries; its segments are the real ones.
Each measurement runs in a fresh process, ``--repeats`` times:
  - reference: ``pickle.load`` of the same file with the default unpickler (what any reader pays first);
  - profkit: ``analyse_snapshot`` (restricted unpickler, state, history, live at the peak, timeline).
Wall time is measured around the call; peak memory is the process's peak RSS during it over its RSS before.
The figure is the ratio profkit / reference, and the absolute seconds.

Usage: python analyses/bench_snapshot.py [--events 1000000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "tests" / "data" / "cuda-snapshots" / "cs336_gpt_medium_ctx128_training.pickle.gz"
OUT = ROOT / "reports" / "benchmarks" / "snapshot_1m_events.json"

MEASURE = r"""
import json, pickle, re, resource, sys, time
tool, path = sys.argv[1], sys.argv[2]
def rss():
    return int(re.search(r"VmRSS:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
if tool == "profkit":
    from profkit.analyze.snapshot import analyse_snapshot
before = rss()
open("/proc/self/clear_refs", "w").write("5")  # reset the peak RSS counter
t0 = time.perf_counter()
if tool == "profkit":
    a = analyse_snapshot(path)
    extra = {"peak_allocated_bytes": int(a.devices.peak_allocated_bytes.iloc[0]), "notes": a.notes}
else:
    with open(path, "rb") as fh:
        pickle.load(fh)
    extra = {}
wall = time.perf_counter() - t0
peak = int(re.search(r"VmHWM:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) * 1024
print(json.dumps({"wall_s": wall, "peak_over_start_bytes": peak - before, **extra}))
"""


def synthesise(n_events: int, target: Path) -> int:
    with gzip.open(SOURCE, "rb") as fh:
        data = pickle.load(fh)  # our own test fixture: plain data
    events = data["device_traces"][0]
    allocated = {e["addr"] for e in events if e["action"] == "alloc"}
    freed = {e["addr"] for e in events if e["action"] == "free_completed"}
    paired = allocated & freed
    block = [e for e in events if e["action"] in ("alloc", "free_requested", "free_completed") and e["addr"] in paired]
    span = block[-1]["time_us"] - block[0]["time_us"] + 1
    out = []
    k = 0
    while len(out) < n_events:
        out += [{**e, "time_us": e["time_us"] + k * span} for e in block]
        k += 1
    data["device_traces"][0] = out[:n_events - n_events % len(block)] if n_events >= len(block) else out
    target.write_bytes(pickle.dumps(data))
    return len(data["device_traces"][0])


def measure(tool: str, path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, tool, str(path)], capture_output=True, text=True, cwd=ROOT,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.pickle"
        events = synthesise(args.events, path)
        size = path.stat().st_size
        runs = {"reference_pickle_load": [], "profkit": []}
        for _ in range(args.repeats):
            runs["reference_pickle_load"].append(measure("reference", path))
            runs["profkit"].append(measure("profkit", path))
    wall = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    peak = {k: statistics.median(r["peak_over_start_bytes"] for r in v) for k, v in runs.items()}
    result = {"events": events, "pickle_bytes": size, "wall_s": wall, "peak_over_start_bytes": peak,
              "wall_ratio_vs_pickle_load": wall["profkit"] / wall["reference_pickle_load"],
              "peak_ratio_vs_pickle_load": peak["profkit"] / peak["reference_pickle_load"], "runs": runs}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2))
    print(f"{events:,} events, {size / 2**20:.0f} MiB pickle: profkit {wall['profkit']:.2f} s "
          f"({result['wall_ratio_vs_pickle_load']:.1f}x a plain pickle.load, {wall['reference_pickle_load']:.2f} s); "
          f"peak memory {peak['profkit'] / 2**20:.0f} MiB ({result['peak_ratio_vs_pickle_load']:.2f}x the load's)")
    print(f"written {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
