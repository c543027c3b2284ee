"""The optimizer and the gradients it steps on, without ZeRO: AdamW's layout (two moment tensors like each trainable
parameter, plus a ``step`` scalar per tensor, a host tensor on CUDA so not GPU memory), bitsandbytes' 8-bit state, or
plain SGD's none."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from profkit.core.methods import Method
from profkit.predict.memory.contribution import Contribution
from profkit.predict.stand_ins import Target

BNB_8BIT_BLOCK = 256  # bitsandbytes' 8-bit optimizers: one fp32 absmax per 256 values of each state
BNB_MIN_8BIT_SIZE = 4096  # smaller tensors keep 32-bit state
BNB_QMAPS = 2 * 256 * 4  # the two 256-entry quantization maps, shared by every tensor


def optimizer_state_bytes(optimizer: str, numels: list[int], element_size: int) -> int:
    """State the optimizer holds for tensors of these sizes (AdamW's moments are in the parameters' dtype)."""
    if optimizer == "sgd":
        return 0  # plain SGD, no momentum
    if optimizer == "adamw":
        return sum(2 * n * element_size for n in numels)
    total = 0
    for n in numels:
        if n < BNB_MIN_8BIT_SIZE:
            total += 2 * n * 4
        else:
            total += 2 * n + 2 * math.ceil(n / BNB_8BIT_BLOCK) * 4
    return total + (BNB_QMAPS if any(n >= BNB_MIN_8BIT_SIZE for n in numels) else 0)


@dataclass
class OptimizerPart:
    """What the optimizer and its gradients add to a step, and what other parts need of them."""

    contribution: Contribution
    accumulated: int  # the gradients summed across micro-batches (bytes on the device)
    # ZeRO-3 on several ranks: id of each parameter gathered into a fresh buffer for each use -> that buffer's bytes
    gathered: dict[int, int] = field(default_factory=dict)
    zero3_linear_saves: bool = False  # ZeRO-3's memory-efficient linear saves its own inputs


def paged_note(method: Method, target: Target) -> list[str]:
    if method.optimizer == "paged-adamw-8bit" and target == "cuda":
        return [("paged 8-bit AdamW: its state is in CUDA unified memory (cudaMallocManaged), outside PyTorch's "
                 "allocator: max_memory_allocated does not count it, nvidia-smi does until the driver pages it out")]
    return []


def step_counter_bytes(target: Target) -> int:
    """AdamW's step counter per tensor: a host tensor for CUDA parameters, so none on the device."""
    return 4 if target == "cpu" else 0


def unsharded(method: Method, trainable: list, target: Target) -> OptimizerPart:
    """Each rank's whole optimizer state, and the gradients it steps on (the same every micro-batch sums into)."""
    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    largest = max(p.numel() * p.element_size() for p in trainable)
    state = optimizer_state_bytes(method.optimizer, [p.numel() for p in trainable], trainable[0].element_size()) + \
        (step_counter_bytes(target) * len(trainable) if method.optimizer == "adamw" else 0)
    # torch's AdamW on CUDA takes the foreach path (one temporary the size of the parameters); on CPU the
    # single-tensor path (two of the largest).
    temporaries = (0 if method.optimizer == "sgd" else
                   trainable_bytes if target == "cuda" and method.optimizer == "adamw" else 2 * largest)
    part = Contribution(detail={"adamw_step_temporaries": temporaries}, notes=paged_note(method, target))
    part.throughout("optimizer_state", state)
    part.add("gradients", optimizer=trainable_bytes)
    part.add("temporaries", optimizer=temporaries)
    return OptimizerPart(part, accumulated=trainable_bytes)
