"""The parameters: counted once per tensor (tied weights once), NF4 ones as bitsandbytes stores them (two 4-bit values
per byte, one absmax per 64-value block, stored as uint8 with double quantization, plus an fp32 absmax per 256 of
those, a 256-entry code and an offset, or fp32 without; and a 16-entry code per layer)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from profkit.predict.memory.contribution import Contribution

NF4_BLOCK = 64  # bitsandbytes' default 4-bit blocksize, which transformers' BitsAndBytesConfig keeps
NF4_NESTED_BLOCK = 256  # blocksize of double quantization's second level


def nf4_bytes(shape: tuple[int, ...], double_quant: bool, cpu_packed: bool = False) -> int:
    """Bytes bitsandbytes stores for one NF4 weight with its quantization state.

    ``cpu_packed``: the layout bitsandbytes converts a layer to at its first inference pass on a CPU with
    AVX512-BF16 (``_convert_weight_packed_for_cpu``): the same 4-bit values repacked, the absmax
    dequantized to one bf16 per block, the nested state dropped (its offset scalar stays)."""
    numel = math.prod(shape)
    packed = (numel + 1) // 2
    blocks = math.ceil(numel / NF4_BLOCK)
    code = 16 * 4
    if cpu_packed:
        return packed + blocks * 2 + (4 if double_quant else 0) + code
    if not double_quant:
        return packed + blocks * 4 + code
    nested_blocks = math.ceil(blocks / NF4_NESTED_BLOCK)
    return packed + blocks + 4 + nested_blocks * 4 + 256 * 4 + code



@dataclass
class Parameters:
    counts: dict[str, int]  # trainable / frozen / quantized element counts
    bytes: dict[str, int]  # the parameter categories' bytes (buffers count as frozen)
    trainable: list[torch.Tensor]

    def contribution(self) -> Contribution:
        part = Contribution()
        for category, size in self.bytes.items():
            part.throughout(category, size)
        return part


def count_parameters(model, quantized: set[str], double_quant: bool, cpu_packed: bool = False) -> Parameters:
    """Element counts and bytes of the parameters, once per tensor (tied embeddings are one tensor), NF4 ones
    as bitsandbytes stores them; buffers count as frozen. Also the trainable tensors."""
    params = {"trainable": 0, "frozen": 0, "quantized": 0}
    parts = {"parameters_trainable": 0, "parameters_frozen": 0, "parameters_quantized": 0}
    trainable: list[torch.Tensor] = []
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if name in quantized:
            params["quantized"] += p.numel()
            parts["parameters_quantized"] += nf4_bytes(tuple(p.shape), double_quant, cpu_packed)
        elif p.requires_grad:
            params["trainable"] += p.numel()
            parts["parameters_trainable"] += p.numel() * p.element_size()
            trainable.append(p)
        else:
            params["frozen"] += p.numel()
            parts["parameters_frozen"] += p.numel() * p.element_size()
    parts["parameters_frozen"] += sum(b.numel() * b.element_size() for b in model.buffers())
    return Parameters(params, parts, trainable)

