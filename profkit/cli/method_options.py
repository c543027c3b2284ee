"""The method settings that ``record`` and ``estimate`` both take on top of a method name: each maps onto one
field of ``profkit.core.methods.Method`` (``methods.OVERRIDES``); the registry gives the defaults."""

from __future__ import annotations

from typing import Optional

import typer

from profkit.cli.common import fail_usage
from profkit.core.methods import (ALL_LINEAR, ATTENTIONS, OPTIMIZERS, PRECISIONS, QUANT_TYPES, ZERO_OFFLOADS, Method,
                                  OverrideError, with_overrides)

PANEL = "Method settings (default: the registry's; `profkit methods`)"


def _option(flag: str, help: str, **kwargs):
    return typer.Option(None, flag, help=help, rich_help_panel=PANEL, show_default=False, **kwargs)


LORA_RANK = _option("--lora-rank", "LoRA rank r.", min=1)
LORA_ALPHA = _option("--lora-alpha", "LoRA alpha (scaling = alpha / r).", min=1)
LORA_DROPOUT = _option("--lora-dropout", "LoRA dropout probability.", min=0.0, max=0.99)
LORA_TARGETS = _option("--lora-targets", f"Comma list of module names (q_proj,v_proj), or {ALL_LINEAR}.")
QUANT_TYPE = _option("--quant-type", f"4-bit format: {', '.join(QUANT_TYPES)}.")
DOUBLE_QUANT = typer.Option(None, "--double-quant/--no-double-quant", help="4-bit: quantize the block scales too.",
                            rich_help_panel=PANEL, show_default=False)
PRECISION = _option("--precision", f"{', '.join(PRECISIONS)} (pure: weights, gradients and optimizer state in bf16).")
OPTIMIZER = _option("--optimizer", f"{', '.join(OPTIMIZERS)}.")
ATTENTION = _option("--attention", f"{', '.join(ATTENTIONS)} (what the model is built with; flash on CPU runs sdpa).")
ZERO_OFFLOAD = _option("--zero-offload", f"ZeRO-Offload to host memory: {', '.join(ZERO_OFFLOADS)}.")


def apply(methods: list[Method], lora_rank: Optional[int], lora_alpha: Optional[int], lora_dropout: Optional[float],
          lora_targets: Optional[str], quant_type: Optional[str], double_quant: Optional[bool],
          precision: Optional[str], optimizer: Optional[str], attention: Optional[str],
          zero_offload: Optional[str]) -> tuple[list[Method], dict]:
    """The methods with the settings given, and those settings (for ``RunSettings.overrides``); exits 2 with the
    reason when a setting makes no sense for a method."""
    given = {k: v for k, v in dict(lora_rank=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                                   lora_targets=lora_targets, quant_type=quant_type, double_quant=double_quant,
                                   precision=precision, optimizer=optimizer, attention=attention,
                                   zero_offload=zero_offload).items() if v is not None}
    try:
        return [with_overrides(m, **given) for m in methods], given
    except OverrideError as exc:
        fail_usage(str(exc))
