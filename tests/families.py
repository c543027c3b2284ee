"""Tiny models of several families (random weights), for the tests that estimate and record them: saved once per
session as a user's own checkpoints (``family_checkpoints`` in ``tests/conftest.py``)."""

from __future__ import annotations

from pathlib import Path

SMALL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, vocab_size=4096)
# family -> (config beyond SMALL, LoRA targets where the default q/k/v/o projections do not exist)
FAMILIES = {
    "micro-moe": (None, None),  # the preset
    "mixtral": (dict(model_type="mixtral", num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2), None),
    "gpt_bigcode": (dict(model_type="gpt_bigcode", n_embd=64, n_layer=2, n_head=4, multi_query=True, n_positions=256,
                         n_inner=192, bos_token_id=0, eos_token_id=0), ("c_attn", "c_proj")),
    "gemma2": (dict(model_type="gemma2", num_key_value_heads=2, head_dim=16, sliding_window=16), None),
}


def save_family_checkpoints(root: Path) -> dict[str, Path]:
    """Each family's tiny model saved with random weights under ``root``, loaded as a user's own checkpoint
    would be."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from profkit.core.settings import RunSettings
    from profkit.model.build import tokenizer_for

    paths = {}
    for family, (spec, _) in FAMILIES.items():
        if spec is None:
            continue
        spec = {**SMALL, **spec}
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(spec.pop("model_type"), **spec))
        model.save_pretrained(root / family)
        tokenizer_for(RunSettings(method="", preset="micro")).save_pretrained(root / family)
        paths[family] = root / family
    return paths
