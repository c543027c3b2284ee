"""DeepSpeed's JSON config (deepspeed/runtime/config.py, zero/config.py): the ZeRO stage, offload, precision and
the batch; ``"auto"`` values are the Trainer's to fill (its arguments decide them)."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data or (
        isinstance(data.get("bf16"), dict) or isinstance(data.get("fp16"), dict))


def _value(part: Part, key: str, value, kind):
    """A value, or None where it is "auto" (the Trainer's arguments fill it)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    return expect(part.path, key, value, kind)


def read(part: Part, data: dict) -> None:
    zero = expect(part.path, "zero_optimization", data.get("zero_optimization"), dict) or {}
    stage = _value(part, "zero_optimization.stage", zero.get("stage"), int) or 0
    part.set("sharding", f"zero{stage}" if stage else "ddp", "zero_optimization.stage")
    optimizer = _device(part, zero, "offload_optimizer")
    params = _device(part, zero, "offload_param")
    if optimizer or params:
        part.set("settings.offload", "optimizer+params" if params and stage == 3 else "optimizer",
                 "zero_optimization.offload_optimizer")
    if params and stage != 3:
        part.note("zero_optimization.offload_param", f"parameter offload needs ZeRO-3; stage {stage} ignores it")
    for dtype in ("bf16", "fp16"):
        section = data.get(dtype)
        if isinstance(section, dict) and _value(part, f"{dtype}.enabled", section.get("enabled"), bool):
            part.set("half", dtype, f"{dtype}.enabled")
    part.set("batch_size", _value(part, "train_micro_batch_size_per_gpu", data.get("train_micro_batch_size_per_gpu"),
                                  int), "train_micro_batch_size_per_gpu")
    part.set("settings.grad_accum", _value(part, "gradient_accumulation_steps", data.get("gradient_accumulation_steps"),
                                           int), "gradient_accumulation_steps")
    if isinstance(data.get("optimizer"), dict):
        common.optimizer(part, "optimizer.type", data["optimizer"].get("type"))
    if data.get("activation_checkpointing"):
        part.note("activation_checkpointing", "DeepSpeed's own activation checkpointing (Megatron models): not "
                                              "modelled; the Trainer's gradient_checkpointing is")
    for key in zero:
        if key not in ZERO_KNOWN:
            part.unknown.append(f"zero_optimization.{key}")
    common.account(part, data, {"zero_optimization", "bf16", "fp16", "train_micro_batch_size_per_gpu",
                                "gradient_accumulation_steps", "optimizer", "train_batch_size",
                                "activation_checkpointing", "amp", "zero_optimization"},
                   {"sequence_parallel_size": "Ulysses sequence parallelism: not modelled; estimated with each rank "
                                              "holding the whole sequence"})


# Bucket and threshold sizes change the step's peak by at most a bucket; read for what they are, not modelled.
ZERO_KNOWN = {"stage", "offload_optimizer", "offload_param", "overlap_comm", "contiguous_gradients",
              "reduce_bucket_size", "allgather_bucket_size", "allgather_partitions", "reduce_scatter",
              "round_robin_gradients", "sub_group_size", "stage3_prefetch_bucket_size",
              "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "max_live_parameters", "max_reuse_distance", "prefetch_bucket_size", "param_persistence_threshold",
              "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save", "load_from_fp32_weights",
              "elastic_checkpoint", "ignore_unused_parameters", "cpu_offload", "zero_hpz_partition_size",
              "zero_quantized_weights", "zero_quantized_gradients", "mics_shard_size", "memory_efficient_linear",
              "stage3_module_granularity_threshold", "leaf_module"}


def _device(part: Part, zero: dict, key: str) -> bool:
    section = zero.get(key)
    if section is None:
        return False
    section = expect(part.path, f"zero_optimization.{key}", section, dict)
    device = str(section.get("device") or "none").lower()
    if device == "nvme":
        part.note(f"zero_optimization.{key}", "offload to NVMe: estimated as offload to the host")
    return device in ("cpu", "nvme")
