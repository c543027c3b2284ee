"""Published measured peaks (``tests/data/published/peaks.csv``: source, full settings, the counter and the unit
each reports) set beside ``profkit estimate`` for the same settings. The estimate predicts PyTorch's allocated
bytes (``max_memory_allocated``); a figure read from nvidia-smi also holds the CUDA context and the allocator's
cache, which the estimate does not predict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}


def compare(table: Path) -> pd.DataFrame:
    """One row per published figure: the estimate's peak and the relative error, or why there is none."""
    from transformers import AutoConfig

    from profkit.estimate import estimate
    from profkit.methods import get_method, with_overrides

    rows = []
    for _, r in pd.read_csv(table).iterrows():
        config = AutoConfig.for_model("llama", **{k: (bool(r[k]) if k == "tie_word_embeddings" else int(r[k])) for k in (
            "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings")})
        settings = {"lora_rank": int(r.lora_r), "lora_alpha": int(r.lora_alpha),
                    "lora_targets": r.lora_targets.replace("+", ","), "precision": r.precision, "optimizer": r.optimizer}
        if r.method.startswith("qlora"):
            settings.update(quant_type=r.quant_type, double_quant=bool(r.double_quant))
        method = with_overrides(get_method(r.method + ("_gc" if r.gradient_checkpointing else "")), **settings)
        e = estimate(method, config, int(r.batch_size), int(r.seq_len), 1, "cuda", r.model)
        measured = float(r.measured) * UNITS[r.unit]
        weights = sum(e.at_peak()[c] for c in ("parameters_trainable", "parameters_frozen", "parameters_quantized"))
        rows.append({"source": r.source, "model": r.model, "method": method.label, "batch_size": int(r.batch_size),
                     "seq_len": int(r.seq_len), "counter": r.counter, "measured_bytes": measured,
                     "estimated_bytes": e.peak_bytes, "error": e.peak_bytes / measured - 1,
                     "possible": measured >= weights, "notes": r.notes})
    return pd.DataFrame(rows)
