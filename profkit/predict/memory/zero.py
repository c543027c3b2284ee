"""DeepSpeed ZeRO: the flat fp32 master partition and the optimizer state of that partition, the reduce buckets
(DeepSpeed's defaults, or for the Trainer engine Hugging Face's "auto" sizes: ``model.zero.zero_buffers``), and what
ZeRO partitions across ``world_size`` ranks: stage 2 gradients and optimizer state, stage 3 parameters too;
ZeRO-Offload moves the optimizer's side (and the parameters' partitions) to pinned host memory."""

from __future__ import annotations

import math

import torch

from profkit.core.methods import Method
from profkit.model.build import decoder_layers
from profkit.model.zero import reduce_dtypes, zero_buffers
from profkit.predict.memory.contribution import Contribution
from profkit.predict.memory.optimizer import OptimizerPart, optimizer_state_bytes, paged_note, step_counter_bytes
from profkit.predict.memory.parameters import Parameters
from profkit.predict.stand_ins import Target

PARAMETER_OWNERS = ("parameters_trainable", "parameters_frozen", "parameters_quantized")


def zero3_storage_bytes(p: torch.Tensor, quantized: bool) -> int:
    """The bytes of the storage DeepSpeed partitions for one parameter: a 4-bit weight's packed values (bitsandbytes'
    uint8 storage, two values a byte), anything else whole."""
    return (p.numel() + 1) // 2 if quantized else p.numel() * p.element_size()


def zero(method: Method, model, quantized: set[str], parameters: Parameters, plan, engine: str, world_size: int,
         target: Target) -> OptimizerPart:
    trainable = parameters.trainable
    buffers = zero_buffers(method.zero_stage, model, engine)
    part = math.ceil(parameters.counts["trainable"] / world_size)
    trainable_elem = trainable[0].element_size()
    # One reduce buffer per dtype DeepSpeed communicates in (profkit's loop keeps autocast inside the engine
    # through its torch_autocast section, which reduces Linear layers' gradients in the autocast dtype;
    # another loop's config is not known to have it).
    comm = reduce_dtypes(model, trainable, plan.autocast if engine == "loop" else None)
    bucket = buffers["reduce_bucket_size"] * (sum(d.itemsize for d in comm) if method.zero_stage == 3
                                              else trainable_elem * len(comm))
    out = Contribution(detail={"zero_fp32_master_partition": part * 4})
    # The fp32 master partition and the optimizer's state of that one flat tensor.
    optimizer_state = part * 4 + optimizer_state_bytes(method.optimizer, [part], 4) + step_counter_bytes(target)
    grads_partition = part * 4
    # DeepSpeed sums each micro-batch's reduced gradients into a partition in the engine's model dtype (the
    # trainable weights' here); on the host under offload.
    accumulated = 0 if method.offload != "none" else part * trainable_elem
    result = OptimizerPart(out, accumulated)
    if method.zero_stage == 3:
        partitions = _stage3(out, result, model, quantized, parameters, buffers, bucket, world_size)
    else:
        out.detail["zero2_reduce_bucket"] = bucket
        out.add("temporaries", backward=bucket)
        partitions = {}
    optimizer_grads = (bucket if method.zero_stage == 3 else 0) + grads_partition
    # DeepSpeed steps AdamW on one flat partition: the foreach path on CUDA makes one temporary of its
    # size, the single-tensor path on CPU two.
    optimizer_temporaries = part * 4 * (1 if target == "cuda" else 2)
    if method.offload != "none":
        out.notes.append(f"ZeRO-Offload ({method.offload}): the optimizer state, the fp32 master partition and the "
                         "fp32 gradient partition the host optimizer steps on are in pinned host memory; the GPU keeps "
                         "the reduce bucket" + ("; the parameters' partitions are on the host too, gathered to the "
                                                "GPU for use" if method.offload == "optimizer+params" else ""))
        out.host.update(optimizer_state=optimizer_state, gradients=grads_partition)
        optimizer_grads -= grads_partition
        optimizer_state, optimizer_temporaries = 0, 0
        if method.offload == "optimizer+params":
            # The partitions live on the host; what stays whole on every rank (below the persistence threshold)
            # and the 4-bit weights' quantization state stay on the device.
            for key, moved in partitions.items():
                out.host[key] = moved
                out.throughout(key, -moved)
    out.notes += paged_note(method, target)
    out.detail["adamw_step_temporaries"] = optimizer_temporaries
    out.throughout("optimizer_state", optimizer_state)
    out.add("gradients", optimizer=optimizer_grads)
    out.add("temporaries", optimizer=optimizer_temporaries)
    return result


def _stage3(out: Contribution, result: OptimizerPart, model, quantized: set[str], parameters: Parameters,
            buffers: dict, bucket, world_size: int) -> dict[str, int]:
    """Stage 3's gradient buffers, its parameter partitions and, on several ranks, what it gathers in flight; returns
    each parameter owner's partitions on this rank."""
    # Stage 3 allocates the gradient partition once, at initialisation, and keeps it: alive at every instant
    # (measured: a CPU recording of micro's full_zero3 holds it through forward and backward).
    persistent = bucket + result.accumulated
    out.detail["zero3_reduce_bucket"] = bucket
    out.detail["zero3_gradient_partition"] = result.accumulated
    out.add("gradients", persistent, persistent)
    # Stage 3 partitions every parameter whose storage holds more elements than DeepSpeed's persistence
    # threshold (smaller ones stay whole on every rank) and, on more than one rank, gathers it into a fresh
    # buffer for each use: what ZeRO-3's linear saves of such a weight is that copy, held until backward.
    # A 4-bit weight is partitioned like any other by its packed storage (one byte per two values; its
    # quantization state is no parameter and stays whole), and bitsandbytes' matmul saves the gathered
    # packed weight for backward. On one rank the partition is the whole weight, and nothing is copied.
    threshold = buffers["param_persistence_threshold"]
    names = dict(model.named_parameters())
    stored = {n: zero3_storage_bytes(p, n in quantized) for n, p in names.items()}
    partitioned = {n for n, p in names.items()
                   if stored[n] // (1 if n in quantized else p.element_size()) > threshold}
    if world_size > 1:
        result.gathered = {id(names[n]): stored[n] for n in partitioned}
    result.zero3_linear_saves = bool(buffers["memory_efficient_linear"])
    shard_bytes = {n: stored[n] - math.ceil(stored[n] / world_size) for n in partitioned}
    owners = {"parameters_trainable": lambda n: names[n].requires_grad and n not in quantized,
              "parameters_frozen": lambda n: not names[n].requires_grad and n not in quantized,
              "parameters_quantized": lambda n: n in quantized}
    partitions, kept = {}, 0
    for key in PARAMETER_OWNERS:
        owner = owners[key]
        out.throughout(key, -sum(b for n, b in shard_bytes.items() if owner(n)))
        kept += parameters.bytes[key] - sum(b for n, b in shard_bytes.items() if owner(n))
        partitions[key] = sum(math.ceil(stored[n] / world_size) for n in partitioned if owner(n))
    if world_size > 1:
        by_id = {id(p): stored[n] for n, p in names.items()}
        per_layer = max((sum(by_id[id(p)] for p in m.parameters()) for m in decoder_layers(model)), default=0)
        # One layer gathered whole, plus DeepSpeed's prefetch bucket (elements, bf16).
        in_flight = min(per_layer + buffers["prefetch_bucket_size"] * 2, kept * world_size)
        out.detail["zero3_gathered_parameters"] = in_flight
        out.add("temporaries", in_flight, in_flight)
    return partitions
