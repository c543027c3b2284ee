"""The buffers older transformers built in every layer, which the installed one does not: a run on such a version
holds them on the device beside the weights.

- Rotary tables: before 4.41 (Llama), 4.42 (Mistral), 4.45 (Qwen2, Qwen2-MoE, Phi and Falcon from 4.36, GPT-NeoX
  from 4.35) and 4.48 (Mixtral) each attention layer built cos and sin tables over every position
  (``max_position_embeddings`` x the rotary dimension), in the dtype the model was built in (GPT-NeoX in fp32 from
  4.37). Mistral 7B at 32,768 positions: 0.54 GB; today one table of inverse frequencies is computed from per
  forward.
- Causal-mask tables: GPT-2 (through 4.x), GPT-J (before 4.45) and GPT-NeoX (before 4.49) kept a boolean
  lower-triangular mask over every pair of positions in each attention layer; Llama and Gemma kept one for the
  whole model in 4.38.

Read from those versions' modelling code and checked against the models they build: ``analyses/legacy_buffers.py``
builds each architecture of the published set under each version's wheel on the meta device, and
``tests/data/legacy_buffers.json`` keeps what they held, which ``tests/test_legacy_buffers.py`` holds these rules to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Version = tuple[int, int]


@dataclass(frozen=True)
class LegacyTable:
    model_types: frozenset[str]
    kind: Literal["rotary", "layer_mask", "model_mask"]
    since: Version  # the first version that built it
    until: Version  # the first version that did not
    fp32_since: Version | None = None  # rotary tables built in fp32 from this version on, not in the model dtype


TABLES = (
    LegacyTable(frozenset({"llama"}), "rotary", (4, 0), (4, 41)),
    LegacyTable(frozenset({"mistral"}), "rotary", (4, 0), (4, 42)),
    LegacyTable(frozenset({"mixtral"}), "rotary", (4, 0), (4, 48)),
    LegacyTable(frozenset({"qwen2", "qwen2_moe"}), "rotary", (4, 0), (4, 45)),
    LegacyTable(frozenset({"phi", "falcon"}), "rotary", (4, 36), (4, 45)),
    # before 4.35 GPT-NeoX kept its tables as plain attributes, which a move to the GPU leaves on the host
    LegacyTable(frozenset({"gpt_neox"}), "rotary", (4, 35), (4, 45), fp32_since=(4, 37)),
    LegacyTable(frozenset({"gpt2"}), "layer_mask", (4, 0), (5, 0)),
    LegacyTable(frozenset({"gptj"}), "layer_mask", (4, 0), (4, 45)),
    LegacyTable(frozenset({"gpt_neox"}), "layer_mask", (4, 0), (4, 49)),
    LegacyTable(frozenset({"llama", "gemma"}), "model_mask", (4, 38), (4, 39)),
)


def _positions(config) -> int:
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 2048)


def _rotary_dim(config) -> int:
    """The rotary dimension as those versions computed it: the hidden size over the heads (they read no ``head_dim``
    from the config), times the rotary fraction (GPT-NeoX's ``rotary_pct``, Phi's ``partial_rotary_factor``, which
    transformers 5 keeps in ``rope_parameters``)."""
    rope = getattr(config, "rope_parameters", None) or {}
    fraction = (getattr(config, "rotary_pct", None) or getattr(config, "partial_rotary_factor", None)
                or rope.get("partial_rotary_factor") or 1.0)
    return int(config.hidden_size // config.num_attention_heads * fraction)


def legacy_buffers(config, version: Version, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype, int]]:
    """(name, shape, dtype, how many) of each table ``version`` built for ``config`` beyond the installed
    transformers; ``dtype``: what the model was built in. Empty where that version built none."""
    model_type = getattr(config, "model_type", "")
    if model_type == "falcon" and getattr(config, "alibi", False):
        return []  # Falcon with ALiBi positions has no rotary tables
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", 0)
    positions = _positions(config)
    out = []
    for table in TABLES:
        if model_type not in table.model_types or not table.since <= version < table.until:
            continue
        if table.kind == "rotary":
            built = torch.float32 if table.fp32_since and version >= table.fp32_since else dtype
            out.append(("rotary cos and sin tables", (positions, _rotary_dim(config)), built, 2 * layers))
        elif table.kind == "layer_mask":
            out.append(("causal-mask table", (positions, positions), torch.bool, layers))
        else:
            out.append(("model causal-mask table", (positions, positions), torch.bool, 1))
    return out


def _bytes(shape: tuple[int, ...], dtype: torch.dtype, count: int) -> int:
    return torch.Size(shape).numel() * dtype.itemsize * count


def legacy_bytes(config, version: Version, dtype: torch.dtype) -> int:
    return sum(_bytes(shape, d, n) for _, shape, d, n in legacy_buffers(config, version, dtype))


def add_legacy_buffers(model: torch.nn.Module, layers: list[torch.nn.Module], config, version: Version,
                       dtype: torch.dtype) -> list[str]:
    """Register ``version``'s tables on the meta ``model`` (per-layer ones on each of ``layers``) as
    non-persistent buffers, as those versions did; returns a line per kind of table."""
    said = []
    for name, shape, built, count in legacy_buffers(config, version, dtype):
        per_layer = count // len(layers) if layers and count >= len(layers) else 0
        owners = [m for m in layers for _ in range(per_layer)] if per_layer else [model] * count
        for i, owner in enumerate(owners):
            owner.register_buffer(f"_legacy_{name.split()[0]}_{i}", torch.empty(shape, dtype=built, device="meta"),
                                  persistent=False)
        said.append(f"{count} {name} of {tuple(shape)} {str(built).removeprefix('torch.')} "
                    f"({_bytes(shape, built, count) / 1e9:,.2f} GB)")
    return said


def builds_tables(model_type: str, version: Version, or_earlier: bool = False) -> bool:
    """Whether ``version`` built tables for ``model_type`` that the installed transformers does not; with
    ``or_earlier`` (a figure whose date only bounds its version), only where every version before it built the
    same ones."""
    applying = [t for t in TABLES if model_type in t.model_types and t.since <= version < t.until]
    return bool(applying) and (not or_earlier or all(t.since == (4, 0) for t in applying))
