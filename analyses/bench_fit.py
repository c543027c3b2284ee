"""Benchmark: one estimate and one fit search of a 7B model, against the import time of torch, transformers and peft
measured in the same run (a fresh ``python -c "import torch, transformers, peft"``).

Where an estimate's time goes, in this process after the imports: the accounting (the model built on meta and one
forward that counts what autograd saves), the step's allocations traced on meta (one step; the steady second step
is the first's calls again), one pass of those calls through the caching allocator's policy, the pass with a
GPU's room (``fits``), and the four steps of growing lengths the estimate table also shows. Then the commands as a
user runs them, each a fresh process: ``profkit estimate`` and ``profkit fit`` of the same method.

Usage: python analyses/bench_fit.py [--rounds 3] [--output reports/benchmarks/fit.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from profkit.configs.models import resolve_model
from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.predict.estimate import estimate_run

ROOT = Path(__file__).resolve().parents[1]
MODEL = "meta-llama/Llama-2-7b-hf"
SETTINGS = [("lora_gc", 1, 512), ("qlora_gc", 4, 1024)]
GPU, GPU_BYTES = "RTX-4090", 24 * 2**30


def _median_wall(argv: list[str], rounds: int) -> tuple[float, list[float]]:
    walls = []
    for _ in range(rounds):
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLUMNS": "100"})
        walls.append(time.perf_counter() - start)
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return statistics.median(walls), walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path, default=ROOT / "reports/benchmarks/fit.json")
    args = parser.parse_args()
    imports_s, imports_rounds = _median_wall([sys.executable, "-c", "import torch, transformers, peft"], args.rounds)
    print(f"import torch, transformers, peft: {imports_s:.1f} s")
    model_dir, _ = resolve_model(MODEL)
    profkit = [sys.executable, "-m", "profkit"]
    results = []
    for name, batch, seq in SETTINGS:
        method = get_method(name)
        settings = RunSettings(method=name, model_path=str(model_dir), batch_size=batch, seq_len=seq)
        parts: dict[str, list[float]] = {}

        def timed(part, work):
            start = time.perf_counter()
            out = work()
            parts.setdefault(part, []).append(time.perf_counter() - start)
            return out

        for _ in range(args.rounds):
            e = timed("accounting_s", lambda: estimate_run(method, settings, "cuda"))
            timed("trace_s", lambda: e.trace)
            timed("allocator_pass_s", lambda: e.replay)
            timed("allocator_pass_with_room_s", lambda: e.on_device(GPU_BYTES))
            timed("growing_lengths_s", lambda: e.growing_replay)
        row = {"model": MODEL, "method": name, "batch_size": batch, "seq_len": seq,
               **{k: statistics.median(v) for k, v in parts.items()},
               "rounds_s": parts}
        common = ["--model", str(model_dir), "--batch-size", str(batch), "--seq-len", str(seq), "--format", "json"]
        row["estimate_cli_s"], row["estimate_cli_rounds_s"] = _median_wall(
            [*profkit, "estimate", name, *common], args.rounds)
        row["fit_cli_s"], row["fit_cli_rounds_s"] = _median_wall([*profkit, "fit", name, *common, "--gpu", GPU],
                                                                 args.rounds)
        row["estimate_cli_over_imports"] = row["estimate_cli_s"] / imports_s
        row["fit_cli_over_imports"] = row["fit_cli_s"] / imports_s
        results.append(row)
        print(f"{name} {batch}x{seq}: " + ", ".join(f"{k} {row[k]:.1f}" for k in parts)
              + f"; profkit estimate {row['estimate_cli_s']:.1f} s ({row['estimate_cli_over_imports']:.2f}x the "
              f"imports), profkit fit {row['fit_cli_s']:.1f} s ({row['fit_cli_over_imports']:.2f}x)")
    args.output.write_text(json.dumps({"torch_threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                                       "rounds": args.rounds, "imports_s": imports_s,
                                       "imports_rounds_s": imports_rounds, "settings": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
