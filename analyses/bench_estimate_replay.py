"""Benchmark: what the allocator replay (``predict.step_replay``) costs an estimate, against the estimate itself
measured in the same run.

``estimate()`` counts the allocated peak from one meta-device forward; the reserved figure replays two whole
training steps (forward, backward with recomputation, optimizer) through the caching allocator's policy, run the
first time reserved memory is asked for, and ``reserved_if_lengths_grow()`` four steps of growing lengths. For
each setting, rounds alternate: a fresh ``estimate()`` (the reference), then its ``reserved()`` (the replay), then
``reserved_if_lengths_grow()``. The figures are the ratios of the medians.

Usage: python analyses/bench_estimate_replay.py [--rounds 3] [--output reports/benchmarks/estimate_replay.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from profkit.core.methods import get_method, with_overrides
from profkit.predict.estimate import estimate
from profkit.predict.published import config_of

ROOT = Path(__file__).resolve().parents[1]
MODELS = json.loads((ROOT / "tests/data/published/models.json").read_text())
# (model, method, overrides, batch, sequence, ranks): published settings of the held-out and used sets
SETTINGS = [
    ("Mistral 7B", "lora_gc", {"lora_rank": 16, "precision": "bf16-pure", "loss": "fp32-shifted"}, 4, 4096, 1),
    ("santacoder", "full_gc", {"precision": "bf16-pure", "loss": "logits-dtype"}, 4, 2048, 1),
    ("Llama 2 7B", "qlora_gc", {"lora_rank": 64, "precision": "bf16-pure"}, 8, 2048, 1),
    ("Mistral 7B", "lora_fsdp_gc", {"lora_rank": 16, "precision": "bf16-pure", "loss": "fp32-shifted"}, 2, 4096, 2),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "reports/benchmarks/estimate_replay.json")
    args = parser.parse_args()
    results = []
    for model, name, overrides, batch, seq, ranks in SETTINGS:
        method = with_overrides(get_method(name), **overrides)
        config = config_of(MODELS[model])
        estimate_s, replay_s, growing_s = [], [], []
        for _ in range(args.rounds):
            start = time.perf_counter()
            e = estimate(method, config, batch, seq, ranks, "cuda", model, "trainer")
            estimate_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            e.reserved()
            replay_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            e.reserved_if_lengths_grow()
            growing_s.append(time.perf_counter() - start)
        row = {"model": model, "method": method.label, "batch_size": batch, "seq_len": seq, "ranks": ranks,
               "estimate_s": statistics.median(estimate_s), "replay_s": statistics.median(replay_s),
               "replay_over_estimate": statistics.median(replay_s) / statistics.median(estimate_s),
               "growing_s": statistics.median(growing_s),
               "growing_over_estimate": statistics.median(growing_s) / statistics.median(estimate_s),
               "estimate_rounds_s": estimate_s, "replay_rounds_s": replay_s, "growing_rounds_s": growing_s}
        results.append(row)
        print(f"{model} {name} {batch}x{seq} ranks {ranks}: estimate {row['estimate_s']:.2f} s, replay "
              f"{row['replay_s']:.2f} s ({row['replay_over_estimate']:.2f}x), growing lengths {row['growing_s']:.2f} s "
              f"({row['growing_over_estimate']:.2f}x)")
    args.output.write_text(json.dumps({"torch_threads": torch.get_num_threads(), "rounds": args.rounds,
                                       "settings": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
