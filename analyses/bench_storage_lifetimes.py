"""Benchmark: what following storage lifetimes costs a memory-profiled step, against the same step plain and
against the same step under the profiler as the memory cycle runs it (``profile_memory``, shapes, stacks).

For each method, one process builds the workload with profkit (same model, optimizer, data, precision), then
alternates blocks of steps, each block's median step time measured in the same run:
  - plain: the workload's own step;
  - lifetimes: the step inside ``StorageLifetimes`` with the session's gradient marks (``MemoryCycleFollower``);
  - profiler: the step inside ``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)``
    (its trace is not exported: only the collection is timed);
  - both: the step as the memory cycle runs it, the lifetimes inside the profiler.
Ratios to plain. Timed steps never run either: this is the memory cycle's cost only.

Usage: python analyses/bench_storage_lifetimes.py [--methods lora full_gc qlora] [--preset tiny] [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.launch.workload import build
from profkit.model.build import resolve_device
from profkit.record.storages import MemoryCycleFollower

OUT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks" / "storage_lifetimes_overhead.json"


def timed_block(step, n: int, context) -> float:
    times = []
    with context():
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, preset: str, device: str, rounds: int, steps: int) -> dict:
    device = resolve_device(device)
    settings = RunSettings(method=name, preset=preset, device=device).resolved()
    w = build(get_method(name), settings, device)
    scratch = Path(tempfile.mkdtemp())

    @contextlib.contextmanager
    def lifetimes():
        follower = MemoryCycleFollower(w.model, w.optimizer, getattr(w, "inner_optimizer", None), lambda: "step")
        try:
            yield
        finally:
            follower.stop(scratch / "lifetimes.json.gz")

    def profiler():
        return profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True)

    @contextlib.contextmanager
    def both():
        with profiler(), lifetimes():
            yield

    modes = {"plain": contextlib.nullcontext, "lifetimes": lifetimes, "profiler": profiler, "both": both}
    for _ in range(3):
        w.step()
    times = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, context in modes.items():
            times[mode].append(timed_block(w.step, steps, context))
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    return {**{f"{m}_step_s": v for m, v in medians.items()},
            **{f"{m}_over_plain": medians[m] / medians["plain"] for m in modes if m != "plain"},
            "lifetimes_inside_profiler_over_profiler": medians["both"] / medians["profiler"], "blocks_s": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["lora", "full_gc", "qlora"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps-per-block", type=int, default=3)
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()
    results = {}
    for name in args.methods:
        r = results[name] = measure(name, args.preset, args.device, args.rounds, args.steps_per_block)
        print(f"{name:8s} plain {r['plain_step_s'] * 1e3:8.2f} ms  lifetimes x{r['lifetimes_over_plain']:.3f}  "
              f"profiler x{r['profiler_over_plain']:.3f}  both x{r['both_over_plain']:.3f}  "
              f"(lifetimes add x{r['lifetimes_inside_profiler_over_profiler']:.3f} to the profiled step)")
    summary = {"preset": args.preset, "device": resolve_device(args.device), "torch_threads": torch.get_num_threads(),
               "rounds": args.rounds, "steps_per_block": args.steps_per_block, "methods": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2))
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
