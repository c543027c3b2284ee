"""Published measured peaks (``tests/data/published/peaks.csv``: source, full settings, the counter and the unit
each reports; ``models.json``: each model's configuration) set beside ``profkit estimate`` for the same settings.
``split`` says whether a figure was used while the estimator was built (``used``) or only checked after
(``holdout``). The estimate predicts PyTorch's allocated
bytes (``max_memory_allocated``); a figure read from nvidia-smi also holds the CUDA context and the allocator's
cache, which the estimate does not predict."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from transformers import AutoConfig

from profkit.core.methods import get_method, with_overrides
from profkit.predict.estimate import estimate

UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}


def compare(table: Path, models: Path | None = None) -> pd.DataFrame:
    """One row per published figure: the estimate's peak and the relative error. ``models`` (default:
    ``models.json`` beside the table) holds each model's Hugging Face configuration with its source."""
    configs = json.loads((models or table.with_name("models.json")).read_text())
    rows = []
    for _, r in pd.read_csv(table, dtype={"quant_type": str}, keep_default_na=False).iterrows():
        spec = dict(configs[r.model]["config"])
        config = AutoConfig.for_model(spec.pop("model_type"), **spec)
        settings: dict = {}
        if r.kind == "train":
            settings = {"lora_rank": int(r.lora_r), "lora_alpha": int(r.lora_alpha),
                        "lora_targets": r.lora_targets.replace("+", ","), "precision": r.precision,
                        "optimizer": r.optimizer}
        if r.quant_type:
            settings.update(quant_type=r.quant_type, double_quant=r.double_quant == "true")
        name = r.method + ("_gc" if r.gradient_checkpointing == "true" else "")
        method = with_overrides(get_method(name), **settings)
        e = estimate(method, config, int(r.batch_size), int(r.seq_len), 1, "cuda", r.model,
                     new_tokens=int(r.max_new_tokens) if r.max_new_tokens else 1)
        measured = float(r.measured) * UNITS[r.unit]
        weights = sum(e.at_peak()[c] for c in ("parameters_trainable", "parameters_frozen", "parameters_quantized"))
        rows.append({"source": r.source, "split": r.split, "model": r.model, "kind": r.kind, "method": method.label,
                     "batch_size": int(r.batch_size), "seq_len": int(r.seq_len), "counter": r.counter,
                     "measured_bytes": measured, "estimated_bytes": e.peak_bytes, "error": e.peak_bytes / measured - 1,
                     "possible": measured >= weights, "notes": r.notes})
    return pd.DataFrame(rows)
