"""Benchmark: profkit's unprofiled (timed) steps against a plain training loop of the same model.

For each method, one process builds the workload with profkit (same model, optimizer and data), then
alternates blocks of steps: a plain loop (forward, backward, optimizer step, zero_grad -- what a user
writes) and the same loop stepping a ``profkit.Session`` in its timed phase (its always-on hooks count tokens
and keep the loss, ``step()`` reads the loss back and times the step). The figure is the ratio of median
step times measured in the same run. Target: within 3%.

Usage: python analyses/bench_recording_overhead.py [--methods lora full qlora] [--preset tiny] [--rounds 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import tempfile

import torch

from profkit.methods import get_method
from profkit.settings import RunSettings
from profkit.session import Session
from profkit.workload import build, training_batches, tokenizer_for

OUT = Path(__file__).resolve().parents[1] / "reports" / "benchmarks" / "recording_overhead.json"


def block(step, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", nargs="+", default=["lora", "full", "qlora"])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps-per-block", type=int, default=5)
    args = parser.parse_args()

    results = {}
    for name in args.methods:
        settings = RunSettings(method=name, preset=args.preset, device="cpu").resolved()
        w = build(get_method(name), settings, "cpu")
        batches = training_batches(tokenizer_for(settings), settings, "cpu")
        model, opt = w.model, w.optimizer

        def plain() -> None:
            batch = next(batches)
            model(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        # A session that stays in its timed phase for the whole benchmark (closed as incomplete at the end).
        session = Session(Path(tempfile.mkdtemp()) / name, w.model, w.optimizer, warmup_steps=0,
                          timed_steps=10**9)
        session.start()

        def profkit_step() -> None:
            plain()
            session.step()

        for _ in range(3):  # warm-up both paths
            plain()
            profkit_step()
        plain_t, profkit_t = [], []
        for _ in range(args.rounds):
            plain_t.append(block(plain, args.steps_per_block))
            profkit_t.append(block(profkit_step, args.steps_per_block))
        session.close()
        ratio = statistics.median(profkit_t) / statistics.median(plain_t)
        results[name] = {"plain_step_s": statistics.median(plain_t), "profkit_step_s": statistics.median(profkit_t),
                         "ratio": ratio, "plain_blocks_s": plain_t, "profkit_blocks_s": profkit_t}
        print(f"{name:8s} plain {statistics.median(plain_t) * 1e3:7.2f} ms  profkit "
              f"{statistics.median(profkit_t) * 1e3:7.2f} ms  ratio {ratio:.3f}")
    summary = {"preset": args.preset, "device": "cpu", "torch_threads": torch.get_num_threads(),
               "rounds": args.rounds, "steps_per_block": args.steps_per_block, "methods": results}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(summary, indent=2))
    print(f"-> {OUT}")


if __name__ == "__main__":
    main()
