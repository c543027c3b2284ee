"""A training step's estimate: the parts (parameters, the optimizer with or without ZeRO, FSDP, DDP, the forward's
activations and the loss, the stack's effects, gradient accumulation), each computed by its module, combined."""

from __future__ import annotations

import functools

import torch

from profkit.core.methods import Method
from profkit.model.build import check_sequence, meta_model
from profkit.model.zero import zero3_linear
from profkit.predict.memory.accumulation import accumulation
from profkit.predict.memory.activations import forward_and_loss, saved_for_backward
from profkit.predict.memory.contribution import Contribution, combine
from profkit.predict.memory.ddp import ddp
from profkit.predict.memory.fsdp import fsdp
from profkit.predict.memory.optimizer import unsharded
from profkit.predict.memory.parameters import count_parameters, nf4_bytes
from profkit.predict.memory.result import CATEGORIES, Estimate, EstimateError
from profkit.predict.memory.stack_effects import stack_effects
from profkit.predict.memory.zero import zero
from profkit.predict.stand_ins import Target
from profkit.predict.step_replay import AllocationTrace, ShardedStep, trace_step


def estimate_training(method: Method, config, batch_size: int, seq_len: int, world_size: int, target: Target,
                      model_name: str, engine: str) -> Estimate:
    if method.zero_stage and method.optimizer != "adamw" and engine == "trainer":
        raise EstimateError(f"{method.label}: the Trainer engine with ZeRO and {method.optimizer} is not modelled")
    if world_size < 1:
        raise EstimateError(f"world size must be at least 1, got {world_size}")
    model, quantized, plan = meta_model(method, config, target, torch.bfloat16 if target == "cuda" else None, engine)
    check_sequence(model, seq_len)
    notes = list(plan.notes)
    if target == "cuda" and method.precision == "auto" and not method.fsdp:
        notes.append("CUDA target: bf16 autocast and bf16 frozen weights (a GPU with bf16 support); flash "
                     "attention where PyTorch would pick it")
    weights = count_parameters(model, quantized, method.double_quant if quantized else False)
    if not weights.trainable:
        raise EstimateError(f"{method.name}: no trainable parameters in this model")
    optimizer = (zero(method, model, quantized, weights, plan, engine, world_size, target) if method.zero_stage
                 else unsharded(method, weights.trainable, target))
    four_bit = frozenset(id(p) for n, p in model.named_parameters() if n in quantized)
    sharded = fsdp(model, quantized, world_size, plan, method, target) if method.fsdp else None
    if plan.fsdp_param_dtype is not None:
        # FSDP's mixed precision: each unit computes with its gathered parameters in the half dtype (no autocast)
        for prm in model.parameters():
            if prm.is_floating_point() and id(prm) not in four_bit:
                prm.data = prm.data.to(plan.fsdp_param_dtype)
    with zero3_linear(optimizer.zero3_linear_saves, unless=four_bit):
        saved = saved_for_backward(model, batch_size, seq_len, target, plan.autocast, optimizer.gathered, method.loss,
                                   builds_cache=method.keeps_kv_cache)
    parts = [Contribution(notes=notes), weights.contribution(), optimizer.contribution,
             forward_and_loss(saved, method, config, plan, engine, batch_size, seq_len),
             stack_effects(method, model, plan, saved, batch_size, seq_len, target)]
    if world_size > 1 and not method.sharded:
        parts.append(ddp(weights.trainable, world_size))
    if sharded is not None:
        parts.append(sharded.contribution())
    step = combine(parts)
    if sharded is not None:
        step = sharded.sharded_step(step, saved.loss_backward)
    if method.grad_accum > 1:
        step = combine([step, accumulation(method, optimizer.accumulated, sharded)])
    instants = {name: {c: int(v.get(c, 0)) for c in CATEGORIES} for name, v in step.instants.items()}
    tracer = None
    if target == "cuda" and not method.zero_stage:
        tracer = functools.partial(_trace, model, quantized, method, plan, batch_size, target, step.notes,
                                   sharded.step if sharded else None)
    settings = {"batch_size": batch_size, "seq_len": seq_len, "world_size": world_size, "device": target,
                "model": model_name, "precision": plan.precision, "engine": engine, "method": method.settings()}
    return Estimate(method.label, settings, instants, weights.counts, step.detail, step.notes,
                    {k: int(v) for k, v in step.host.items() if v}, tracer=tracer)


def _trace(model, quantized: set[str], method: Method, plan, batch_size: int, target: Target, notes: list[str],
           sharding: ShardedStep | None, lengths: tuple[int, ...]) -> AllocationTrace | None:
    """The step's allocations, to replay through the caching allocator's policy (``predict.step_replay``), or None,
    with the reason in ``notes``, where an op of the model has no meta kernel for its backward."""
    double_quant = method.double_quant and bool(quantized)
    sizes = [(t, nf4_bytes(tuple(t.shape), double_quant) if n in quantized else t.untyped_storage().nbytes())
             for n, t in [*model.named_parameters(), *model.named_buffers()]]
    compute = plan.quantization.bnb_4bit_compute_dtype if plan.quantization is not None else torch.bfloat16
    try:
        return trace_step(model, sizes, quantized, method, batch_size, lengths, target, plan.autocast, compute,
                          sharding)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        notes.append(f"reserved memory from the measured reserved/allocated ratio: the step could not be replayed "
                     f"on the meta device ({type(exc).__name__}: {first[:160]})")
        return None

