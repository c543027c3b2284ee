"""Model presets: Llama-architecture configs, and one mixture of experts, built with random weights (no download).

Random weights are fine for profiling: shapes and kernels decide time and memory. MLP widths are
rounded up to a multiple of 64 as Llama rounds them (to 256), which also keeps every layer's output
size a multiple of 32, as bitsandbytes' CPU 4-bit inference kernel requires.
Each preset also carries the workload defaults it was sized for. Pure data, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    config: dict = field(default_factory=dict)
    # Workload defaults scaled to the preset (the reference study used batch 4, length 512).
    batch_size: int = 4
    seq_len: int = 512
    max_new_tokens: int = 64


_LLAMA_COMMON = dict(model_type="llama", hidden_act="silu", rms_norm_eps=1e-5, rope_theta=500000.0,
                     max_position_embeddings=2048, tie_word_embeddings=True)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "micro", "Llama architecture, ~0.4M parameters: for the test suite",
            {**_LLAMA_COMMON, "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096},
            batch_size=2, seq_len=64, max_new_tokens=8,
        ),
        Preset(
            "tiny", "Llama architecture, ~4M parameters: the default, sized for 2 CPU cores",
            {**_LLAMA_COMMON, "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
             "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 4096},
            batch_size=4, seq_len=128, max_new_tokens=32,
        ),
        Preset(
            "micro-moe", "Qwen2-MoE architecture, ~1M parameters: a router, 4 experts (2 per token) and a shared "
            "expert per layer; for the test suite",
            {"model_type": "qwen2_moe", "hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128,
             "max_position_embeddings": 2048, "tie_word_embeddings": True},
            batch_size=2, seq_len=64, max_new_tokens=8,
        ),
        Preset(
            "gpu-check", "Llama architecture, ~0.55B parameters: large enough for GPU effects to show, small enough "
            "for the whole GPU check in minutes (make gpu-check)",
            {**_LLAMA_COMMON, "hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 20,
             "num_attention_heads": 12, "num_key_value_heads": 4, "vocab_size": 32000,
             "max_position_embeddings": 4096},
            batch_size=4, seq_len=1024, max_new_tokens=128,
        ),
        Preset(
            "llama-3.2-3b", "the architecture of Llama-3.2-3B-Instruct (random weights): for GPUs",
            {**_LLAMA_COMMON, "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 28,
             "num_attention_heads": 24, "num_key_value_heads": 8, "vocab_size": 128256,
             "head_dim": 128, "max_position_embeddings": 131072,
             "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
            batch_size=4, seq_len=512, max_new_tokens=256,
        ),
    ]
}

DEFAULT_PRESET = "tiny"


class UnknownPresetError(ValueError):
    def __init__(self, name: str):
        super().__init__(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPresetError(name) from None
