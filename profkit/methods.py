"""The method registry: every fine-tuning and inference method is data.

A method is a frozen dataclass; variants are derived with ``dataclasses.replace``
and registered in exactly one place (``METHODS``). This module imports no torch,
so listing and validating methods is instant and works anywhere.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Literal


@dataclass(frozen=True)
class Method:
    name: str
    kind: Literal["train", "infer"]
    description: str
    adapter: Literal["none", "lora"] = "none"
    # Storage format of the frozen base weights: None keeps the model dtype, "nf4" is bitsandbytes 4-bit.
    quantization: Literal["nf4"] | None = None
    gradient_checkpointing: bool = False
    zero_stage: Literal[0, 2, 3] = 0
    learning_rate: float = 2e-5
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")

    def settings(self) -> dict:
        """The method's settings as a JSON-ready dict (for manifests and tables)."""
        out = asdict(self)
        out["lora_targets"] = list(self.lora_targets)
        if self.adapter != "lora":
            for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets"):
                out.pop(key)
        if self.kind == "infer":
            for key in ("learning_rate", "gradient_checkpointing", "zero_stage"):
                out.pop(key)
        return out


def full() -> Method:
    return Method("full", "train", "full fine-tuning, AdamW on every parameter")


def lora() -> Method:
    return Method("lora", "train", "LoRA adapters on attention projections, base frozen", adapter="lora", learning_rate=2e-4)


def qlora() -> Method:
    return replace(lora(), name="qlora", description="LoRA over an NF4-quantized frozen base (bitsandbytes)", quantization="nf4")


def with_gc(method: Method) -> Method:
    return replace(method, name=f"{method.name}_gc", gradient_checkpointing=True,
                   description=f"{method.description}; gradient checkpointing")


def with_zero(method: Method, stage: Literal[2, 3]) -> Method:
    base = method.name.removesuffix("_gc")
    name = f"{base}_zero{stage}" + ("_gc" if method.gradient_checkpointing else "")
    return replace(method, name=name, zero_stage=stage,
                   description=f"{method.description}; DeepSpeed ZeRO-{stage}")


def infer_fp16() -> Method:
    return Method("infer_fp16", "infer", "generate() at batch size 1 in half precision (bf16/fp32 on CPU)")


def infer_int4() -> Method:
    return replace(infer_fp16(), name="infer_int4", quantization="nf4",
                   description="generate() at batch size 1 with NF4-quantized weights (bitsandbytes)")


def _registry() -> dict[str, Method]:
    train = [full(), with_gc(full()), lora(), with_gc(lora()), qlora(), with_gc(qlora())]
    for base in (lora(), qlora()):
        for stage in (2, 3):
            train += [with_zero(base, stage), with_zero(with_gc(base), stage)]
    methods = train + [infer_fp16(), infer_int4()]
    return {m.name: m for m in methods}


METHODS: dict[str, Method] = _registry()


class UnknownMethodError(ValueError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(name) from None


def resolve(names: list[str], all_methods: bool = False) -> list[Method]:
    """Methods for a command line: every name validated before anything runs."""
    if all_methods:
        return list(METHODS.values())
    return [get_method(n) for n in dict.fromkeys(names)]
