"""Benchmark: what recording costs a training step, against a plain loop of the same model in the same run.

``--cycle timed`` (default): profkit's unprofiled (timed) steps against the plain loop.

For each method, one process builds the workload with profkit (same model, optimizer, data, precision and
DeepSpeed engine), then alternates blocks of steps: the plain loop (the workload's own step: forward, backward,
optimizer step, zero_grad -- what a user writes) and the same loop stepping a ``profkit.Session`` in its timed
phase (its always-on hooks count tokens and keep the loss, ``step()`` reads the loss back and times the step).
The figure is the ratio of median step times measured in the same run. Target: within 3%.

``--cycle memory``: what following storage lifetimes costs a memory-profiled step. Blocks of steps alternate:
plain; inside ``StorageLifetimes`` with the session's gradient marks (``MemoryCycleFollower``); inside
``torch.profiler.profile(profile_memory=True, record_shapes=True, with_stack=True)`` (not exported: only the
collection is timed); the tracker inside that profiler's warm-up step, as the memory cycle runs it (the profiler
records nothing then, so the tracker's Python calls stay out of the trace). Ratios to plain. Timed steps never
run either.

Usage: python analyses/bench_recording_overhead.py [--cycle timed|memory] [--methods lora full qlora]
       [--preset tiny] [--device cpu] [--rounds 7] [--output FILE]
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
from torch.profiler import ProfilerActivity, profile, schedule

from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.launch.workload import build
from profkit.model.build import resolve_device
from profkit.record.session import Session
from profkit.record.storages import MemoryCycleFollower

REPORTS = Path(__file__).resolve().parents[1] / "reports" / "benchmarks"
OUT = {"timed": REPORTS / "recording_overhead.json", "memory": REPORTS / "storage_lifetimes_overhead.json"}


def block(step, n: int, sync, context=contextlib.nullcontext) -> float:
    """The median time of ``n`` steps, run inside ``context()`` (entering and leaving it is not timed)."""
    times = []
    with context():
        for _ in range(n):
            t0 = time.perf_counter()
            step()
            sync()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(name: str, preset: str, device: str, rounds: int, steps_per_block: int) -> dict:
    """The plain loop and the profkit-stepped loop of one method, alternating, in this process."""
    device = resolve_device(device)
    settings = RunSettings(method=name, preset=preset, device=device).resolved()
    w = build(get_method(name), settings, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # A session that stays in its timed phase for the whole benchmark (closed as incomplete at the end).
    session = Session(Path(tempfile.mkdtemp()) / name, w.model, w.optimizer, warmup_steps=0, timed_steps=10**9)
    session.start()

    def profkit_step() -> None:
        w.step()
        session.step()

    for _ in range(3):  # warm-up both paths
        w.step()
        profkit_step()
    sync()
    plain_t, profkit_t = [], []
    for _ in range(rounds):
        plain_t.append(block(w.step, steps_per_block, sync))
        profkit_t.append(block(profkit_step, steps_per_block, sync))
    session.close()
    return {"plain_step_s": statistics.median(plain_t), "profkit_step_s": statistics.median(profkit_t),
            "ratio": statistics.median(profkit_t) / statistics.median(plain_t), "plain_blocks_s": plain_t,
            "profkit_blocks_s": profkit_t}


def measure_memory_cycle(name: str, preset: str, device: str, rounds: int, steps: int) -> dict:
    """The plain step, and inside the storage tracker, the profiler, and the tracker in the profiler's warm-up,
    alternating, in this process."""
    device = resolve_device(device)
    settings = RunSettings(method=name, preset=preset, device=device).resolved()
    w = build(get_method(name), settings, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    scratch = Path(tempfile.mkdtemp())

    @contextlib.contextmanager
    def lifetimes():
        follower = MemoryCycleFollower(w.model, w.optimizer, getattr(w, "inner_optimizer", None), lambda: "step")
        try:
            yield
        finally:
            follower.stop(scratch / "lifetimes.json.gz")

    def profiler(**kwargs):
        return profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else []),
                       profile_memory=True, record_shapes=True, with_stack=True, **kwargs)

    @contextlib.contextmanager
    def in_warmup():
        with profiler(schedule=schedule(wait=0, warmup=1, active=1, repeat=1)), lifetimes():
            yield  # the block's steps all run in the schedule's warm-up: step() is never called

    modes = {"plain": contextlib.nullcontext, "lifetimes": lifetimes, "profiler": profiler, "in_warmup": in_warmup}
    for _ in range(3):
        w.step()
    times = {mode: [] for mode in modes}
    for _ in range(rounds):
        for mode, context in modes.items():
            times[mode].append(block(w.step, steps, sync, context))
    medians = {mode: statistics.median(t) for mode, t in times.items()}
    return {**{f"{m}_step_s": v for m, v in medians.items()},
            **{f"{m}_over_plain": medians[m] / medians["plain"] for m in modes if m != "plain"},
            "blocks_s": times}


def describe(name: str, r: dict) -> str:
    if "ratio" in r:
        return f"{name:8s} plain {r['plain_step_s'] * 1e3:7.2f} ms  profkit {r['profkit_step_s'] * 1e3:7.2f} ms  " \
               f"ratio {r['ratio']:.3f}"
    return (f"{name:8s} plain {r['plain_step_s'] * 1e3:8.2f} ms  lifetimes x{r['lifetimes_over_plain']:.3f}  "
            f"profiler x{r['profiler_over_plain']:.3f}  lifetimes in the profiler's warm-up "
            f"x{r['in_warmup_over_plain']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycle", choices=sorted(OUT), default="timed")
    parser.add_argument("--methods", nargs="+", default=["lora", "full", "qlora"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args()

    run = measure if args.cycle == "timed" else measure_memory_cycle
    output = args.output or OUT[args.cycle]
    results = {}
    for name in args.methods:
        results[name] = run(name, args.preset, args.device, args.rounds, args.steps_per_block)
        print(describe(name, results[name]))
    summary = {"preset": args.preset, "device": resolve_device(args.device), "torch_threads": torch.get_num_threads(),
               "rounds": args.rounds, "steps_per_block": args.steps_per_block, "methods": results}
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(summary, indent=2))
    print(f"-> {output}")


if __name__ == "__main__":
    main()
