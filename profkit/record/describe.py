"""What a training setup is, read from its live objects rather than from a name.

A user's model may be a peft model, a bitsandbytes-quantized model, a DeepSpeed engine, or wrapped by
accelerate or DDP; the optimizer may be DeepSpeed's or accelerate's wrapper. These functions unwrap them and
describe the method as a registry ``Method`` (adapter, quantization, gradient checkpointing, ZeRO stage or
FSDP2, LoRA settings), so a run recorded from a user's script is told apart and compared like profkit's own.

Duck-typed on attributes and class names, so this module imports none of those libraries.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from profkit.core.methods import Method
from profkit.record.inventory import parametrized_four_bit

# Optimizer wrappers that only forward to the optimizer they hold (accelerate's).
FORWARDING_WRAPPERS = ("AcceleratedOptimizer", "DeepSpeedOptimizerWrapper")


@dataclass(frozen=True)
class Parts:
    """The objects behind what the user handed over."""

    model: Any  # the nn.Module whose forward runs (a DeepSpeed engine's module, a peft model...)
    engine: Any  # DeepSpeed engine, or None
    optimizer: Any  # the optimizer whose step() does the update (DeepSpeed's ZeRO optimizer, or torch's)
    inner_optimizer: Any  # the torch optimizer that owns moment tensors
    ddp: Any = None  # the DistributedDataParallel wrapper it was handed over in, or None


def is_deepspeed_engine(obj: Any) -> bool:
    return type(obj).__name__ == "DeepSpeedEngine" or (
        type(obj).__module__.startswith("deepspeed") and hasattr(obj, "module") and hasattr(obj, "backward"))


def is_ddp(obj: Any) -> bool:
    return type(obj).__name__ == "DistributedDataParallel" and hasattr(obj, "module") and hasattr(obj, "reducer")


def unwrap(model: Any, optimizer: Any = None) -> Parts:
    ddp = model if is_ddp(model) else None
    if ddp is not None:
        model = ddp.module
    engine = model if is_deepspeed_engine(model) else None
    module = engine.module if engine is not None else model
    if optimizer is None and engine is not None:
        optimizer = engine.optimizer
    while optimizer is not None and type(optimizer).__name__ in FORWARDING_WRAPPERS:
        optimizer = optimizer.optimizer
    inner = optimizer
    while inner is not None and not hasattr(inner, "state") and getattr(inner, "optimizer", None) is not None:
        inner = inner.optimizer
    # DeepSpeed's ZeRO optimizers wrap a torch optimizer in .optimizer; its moments live there.
    if inner is not None and type(inner).__module__.startswith("deepspeed") and hasattr(inner, "optimizer"):
        inner = inner.optimizer
    return Parts(module, engine, optimizer, inner, ddp)


def zero_stage(parts: Parts) -> int:
    if parts.engine is not None and hasattr(parts.engine, "zero_optimization_stage"):
        return int(parts.engine.zero_optimization_stage())
    name = type(parts.optimizer).__name__ if parts.optimizer is not None else ""
    if name == "DeepSpeedZeroOptimizer_Stage3":
        return 3
    if name == "DeepSpeedZeroOptimizer":
        return 2 if getattr(parts.optimizer, "partition_gradients", False) else 1
    return 0


def _fsdp_units(model: Any) -> list:
    """The modules FSDP2's ``fully_shard`` made into units (it gives each a class derived from ``FSDPModule``)."""
    return [m for m in model.modules() if any(c.__name__ == "FSDPModule" for c in type(m).__mro__)]


def fsdp(model: Any) -> dict | None:
    """FSDP2's settings as the units hold them (None: not sharded with FSDP2); ``reshard_after_forward`` is read
    from a non-root unit (FSDP keeps the root gathered by default), from torch's private state, so it may be
    missing."""
    units = _fsdp_units(model)
    if not units:
        return None
    found: dict = {"units": len(units)}
    inner = next((u for u in units if u is not model), units[0])
    try:
        group = inner._get_fsdp_state()._fsdp_param_group
        found["reshard_after_forward"] = group.post_forward_mesh_info is not None
        found["offload"] = type(group.offload_policy).__name__ == "CPUOffloadPolicy"
    except Exception:  # torch's private state named otherwise: the settings are not known, the sharding is
        pass
    return found


def _peft_lora(model: Any) -> dict | None:
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        return None
    active = getattr(model, "active_adapter", None)
    config = configs.get(active) if isinstance(active, str) and active in configs else next(iter(configs.values()))
    if str(getattr(config, "peft_type", "")).split(".")[-1].upper() != "LORA":
        return {"adapter": str(getattr(config, "peft_type", "peft"))}
    targets = config.target_modules
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets or ()))
    return {"lora_r": int(config.r), "lora_alpha": int(config.lora_alpha), "lora_dropout": float(config.lora_dropout),
            "lora_targets": targets}


def _quant_states(model: Any):
    """bitsandbytes' 4-bit quantization states, on the weights or, where FSDP replaced a weight with its shard, on
    the layers (which keep them to restore at each forward)."""
    for p in model.parameters():
        qs = getattr(p, "quant_state", None)
        if qs is not None:
            yield qs
    for m in model.modules():
        if type(m).__module__.startswith("bitsandbytes") and getattr(m, "quant_state", None) is not None:
            yield m.quant_state


def _quantization(model: Any) -> str | None:
    for qs in _quant_states(model):
        return str(getattr(qs, "quant_type", "nf4"))
    if any(type(p).__name__ == "Int8Params" for p in model.parameters()):
        return "int8"
    return None


def _double_quant(model: Any) -> bool | None:
    for qs in _quant_states(model):
        return bool(getattr(qs, "nested", False))
    return None


def _gradient_checkpointing(model: Any) -> bool:
    # transformers sets this flag on the layers it checkpoints (its ``is_gradient_checkpointing`` property is
    # deprecated and warns); other code may call torch.utils.checkpoint directly, which leaves no mark until
    # it runs (the Session then labels the recompute in the trace).
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def dtypes(model: Any) -> dict[str, int]:
    """Parameter elements by dtype (a 4-bit weight counts its packed storage as uint8)."""
    counts: Counter = Counter()
    for p in model.parameters():
        counts[str(p.dtype).removeprefix("torch.")] += int(getattr(p, "ds_numel", p.numel()))
    return dict(counts)


def learning_rate(optimizer: Any) -> float | None:
    groups = getattr(optimizer, "param_groups", None)
    try:
        return float(groups[0]["lr"]) if groups else None
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def method_of(parts: Parts, inference: bool = False) -> Method:
    """The registry-shaped description of this setup, named like the registry names its methods."""
    lora = _peft_lora(parts.model)
    quant = _quantization(parts.model)
    gc = _gradient_checkpointing(parts.model)
    stage = zero_stage(parts)
    sharded = fsdp(parts.model)
    experts = {"quantize_experts": True} if quant and parametrized_four_bit(parts.model) else {}
    if inference:
        base = "infer_int4" if quant else "infer_fp16"
        return Method(base, "infer", "a user's inference", quantization=quant, **experts)
    adapter = "lora" if lora and "lora_r" in lora else ("none" if not lora else lora["adapter"])
    name = ("qlora" if quant and adapter == "lora" else adapter if adapter != "none" else "full")
    if stage:
        name += f"_zero{stage}"
    elif sharded:
        name += "_fsdp"
    if gc:
        name += "_gc"
    lr = learning_rate(parts.inner_optimizer)
    fields = {k: v for k, v in (lora or {}).items() if k.startswith("lora_")}
    optimizer = OPTIMIZER_OF.get(type(parts.inner_optimizer).__name__, "adamw")
    double_quant = _double_quant(parts.model)
    fsdp_fields = {} if not sharded else {"fsdp": True, **{k: sharded[k] for k in ("reshard_after_forward",)
                                                            if k in sharded},
                                          **({"offload": "optimizer+params"} if sharded.get("offload") else {})}
    return Method(name, "train", "found on the live objects", adapter=adapter, quantization=quant, **experts,
                  gradient_checkpointing=gc, zero_stage=stage, **fsdp_fields, **({"learning_rate": lr} if lr is not None else {}),
                  optimizer=optimizer, **({"double_quant": double_quant} if quant and double_quant is not None else {}),
                  **fields)


_HALF = {"torch.bfloat16": "bf16", "torch.float16": "fp16"}


def precision_of(model: Any, autocast: Any) -> str | None:
    """The registry's precision for what the forward ran with: ``autocast`` (the dtype autocast was on with inside
    the model's forward, or None) over the floating weights' dtypes. None where the registry has no name for it
    (half-precision weights beside fp32 trainable ones with no autocast: DeepSpeed turns a caller's autocast off
    inside its engine unless its config asks for torch's)."""
    trainable = {str(p.dtype) for p in model.parameters() if p.requires_grad and p.is_floating_point()}
    frozen = {str(p.dtype) for p in model.parameters() if not p.requires_grad and p.is_floating_point()}
    if str(autocast) in _HALF:
        half = _HALF[str(autocast)]
        # A frozen base in fp32 (a model loaded without a dtype) is amp; in half precision, or none frozen, mixed.
        # A 4-bit base keeps only its norms and embeddings floating, fp32 under either: mixed, the registry's.
        return f"{half}-amp" if frozen == {"torch.float32"} and not _quantization(model) else f"{half}-mixed"
    if autocast is not None:
        return None
    weights = trainable | frozen
    return {frozenset({"torch.float32"}): "fp32", frozenset({"torch.bfloat16"}): "bf16-pure"}.get(frozenset(weights))


# An optimizer's class -> the registry's name for what it holds (SGD is modelled without momentum).
OPTIMIZER_OF = {"AdamW": "adamw", "Adam": "adamw", "AdamW8bit": "adamw-8bit", "Adam8bit": "adamw-8bit",
                "PagedAdamW8bit": "paged-adamw-8bit", "SGD": "sgd"}


def model_info(parts: Parts) -> dict:
    model = parts.model
    config = getattr(model, "config", None)
    info = {"class": type(model).__name__, "dtypes": dtypes(model),
            "optimizer": type(parts.inner_optimizer).__name__ if parts.inner_optimizer is not None else None,
            "zero_optimizer": type(parts.optimizer).__name__ if parts.optimizer is not parts.inner_optimizer else None,
            "double_quant": _double_quant(model)}
    sharded = fsdp(model)
    if sharded:
        info["fsdp"] = sharded
    stage = zero_stage(parts)
    if stage:  # the bucket sizes DeepSpeed really uses, whatever config (default or "auto") set them
        info["zero"] = {"stage": stage, **{k: int(getattr(parts.optimizer, k)) for k in
                                           ("reduce_bucket_size", "allgather_bucket_size")
                                           if isinstance(getattr(parts.optimizer, k, None), (int, float))}}
    to_diff = getattr(config, "to_diff_dict", None)
    if callable(to_diff):
        try:
            info["config"] = to_diff()
        except Exception:  # a config that cannot serialize itself is not worth failing a run over
            pass
    return info
