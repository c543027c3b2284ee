"""How much more the CUDA caching allocator reserves than it hands out, measured on real allocator snapshots of
training steps (``tests/data/cuda-snapshots``, recorded by others on real GPUs): peak reserved over peak allocated
of each. ``profkit estimate`` turns its predicted allocated peak into a reserved range with these ratios, so they
are data with their provenance, regenerated here, and a test re-derives them from the snapshots.

Usage: python analyses/allocator_overhead.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profkit.analyze.snapshot import analyse_snapshot

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOTS = ROOT / "tests" / "data" / "cuda-snapshots"
OUT = ROOT / "profkit" / "data" / "allocator" / "reserved_over_allocated.csv"
# Real training steps with an allocation history (the peaks need one). Left out: the mosaic file (synthetic, random
# sizes) and FlexGen's (a legacy dump with no history, so no peak).
TRAINING = {
    "cs336_gpt_medium_ctx128_training.pickle.gz": "CS336 Transformer LM medium, one training step, AdamW",
    "cs336_fullstep_fragmented_999seg.pickle.gz": "CS336 Transformer LM, one training step, AdamW (999 segments)",
    "cs336_fullstep_adamw_annot.pickle.gz": "CS336 Transformer LM, one training step, AdamW",
    "cs336_small_segment_alloc.pickle": "CS336 attention peak-memory run",
    "opt_finetune_zo_fedlearn_windows.pickle.gz": "OPT fine-tuning (transformers), zeroth-order, SGD, Windows",
}


def ratios(snapshots: Path = SNAPSHOTS) -> pd.DataFrame:
    rows = []
    for name, workload in TRAINING.items():
        device = analyse_snapshot(snapshots / name).devices.iloc[0]
        rows.append({"snapshot": name, "workload": workload, "peak_allocated_bytes": int(device.peak_allocated_bytes),
                     "peak_reserved_bytes": int(device.peak_reserved_bytes)})
    frame = pd.DataFrame(rows)
    frame["ratio"] = (frame.peak_reserved_bytes / frame.peak_allocated_bytes).round(4)
    return frame


def main() -> None:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    frame = ratios()
    frame.to_csv(OUT, index=False)
    print(frame.to_string(index=False))


if __name__ == "__main__":
    main()
