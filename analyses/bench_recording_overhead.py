"""Benchmark: profkit's unprofiled (timed) steps against a plain training loop of the same model.

For each method, one process builds the workload with profkit (same model, optimizer, data, precision and
DeepSpeed engine), then alternates blocks of steps: the plain loop (the workload's own step: forward, backward,
optimizer step, zero_grad -- what a user writes) and the same loop stepping a ``profkit.Session`` in its timed
phase (its always-on hooks count tokens and keep the loss, ``step()`` reads the loss back and times the step).
The figure is the ratio of median step times measured in the same run. Target: within 3%.

Usage: python analyses/bench_recording_overhead.py [--methods lora full qlora] [--preset tiny] [--device cpu]
       [--rounds 7] [--output FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.launch.workload import build
from profkit.model.build import resolve_device
from profkit.record.session import Session

OUT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks" / "recording_overhead.json"


def block(step, n: int, sync) -> float:
    times = []
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["lora", "full", "qlora"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-block", type=int, default=5)
    parser.add_argument("--output", type=Path, default=OUT)
    args = parser.parse_args()

    results = {}
    for name in args.methods:
        r = results[name] = measure(name, args.preset, args.device, args.rounds, args.steps_per_block)
        print(f"{name:8s} plain {r['plain_step_s'] * 1e3:7.2f} ms  profkit {r['profkit_step_s'] * 1e3:7.2f} ms  "
              f"ratio {r['ratio']:.3f}")
    summary = {"preset": args.preset, "device": resolve_device(args.device), "torch_threads": torch.get_num_threads(),
               "rounds": args.rounds, "steps_per_block": args.steps_per_block, "methods": results}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(summary, indent=2))
    print(f"-> {args.output}")


if __name__ == "__main__":
    main()
