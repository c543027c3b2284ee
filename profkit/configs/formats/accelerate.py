"""accelerate's config YAML (``accelerate launch --config_file``): the processes, the mixed precision, and FSDP's or
DeepSpeed's plugin settings (accelerate/commands/config/config_args.py). It launches someone's loop, most often
transformers' Trainer; FSDP settings are read the same way where axolotl or the Trainer carry them."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return "distributed_type" in data or "compute_environment" in data


NOTED = {
    "fp8_config": "FP8 training: not modelled; estimated in 16 bits",
    "megatron_lm_config": "Megatron-LM's model parallelism: not modelled",
    "dynamo_backend": "torch.compile (dynamo): not modelled; estimated eager",
}


def read(part: Part, data: dict) -> None:
    path = part.path
    kind = str(data.get("distributed_type") or "NO").upper()
    processes = expect(path, "num_processes", data.get("num_processes"), int)
    machines = expect(path, "num_machines", data.get("num_machines"), int) or 1
    part.set("world_size", processes * machines if processes else None, "num_processes")
    mixed = str(data.get("mixed_precision") or "no").lower()
    if mixed in ("bf16", "fp16"):
        part.set("half", mixed, "mixed_precision")
    elif mixed == "fp8":
        part.note("mixed_precision", "fp8: not modelled; estimated in bf16")
        part.set("half", "bf16", "mixed_precision")
    if kind == "FSDP":
        read_fsdp(part, expect(path, "fsdp_config", data.get("fsdp_config"), dict) or {}, "fsdp_config")
    elif kind == "DEEPSPEED":
        _deepspeed_plugin(part, expect(path, "deepspeed_config", data.get("deepspeed_config"), dict) or {})
    elif kind in ("MULTI_GPU", "MULTI_NPU", "MULTI_XPU"):
        part.set("sharding", "ddp", "distributed_type")
    elif kind not in ("NO", "MULTI_CPU"):
        part.note("distributed_type", f"{kind}: not modelled")
    if accumulation := expect(path, "gradient_accumulation_steps", data.get("gradient_accumulation_steps"), int):
        part.set("settings.grad_accum", accumulation, "gradient_accumulation_steps")
    common.account(part, data, {"distributed_type", "num_processes", "num_machines", "mixed_precision",
                                "fsdp_config", "deepspeed_config", "gradient_accumulation_steps", "use_cpu",
                                "gpu_ids", "use_autocast_during_eval"}, NOTED)


def _deepspeed_plugin(part: Part, config: dict) -> None:
    path = part.path
    if file := expect(path, "deepspeed_config_file", config.get("deepspeed_config_file"), str):
        part.refers_to.append(file)
    stage = expect(path, "zero_stage", config.get("zero_stage"), int)
    if stage is not None:
        part.set("sharding", f"zero{stage}" if stage else "ddp", "deepspeed_config.zero_stage")
    optimizer = str(config.get("offload_optimizer_device") or "none").lower()
    params = str(config.get("offload_param_device") or "none").lower()
    if optimizer == "cpu" or params == "cpu":
        part.set("settings.offload", "optimizer+params" if params == "cpu" and stage == 3 else "optimizer",
                 "deepspeed_config.offload_optimizer_device")
    if "nvme" in (optimizer, params):
        part.note("deepspeed_config", "offload to NVMe: estimated as offload to the host")
    for key, value in config.items():
        if key not in {"deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
                       "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher",
                       "gradient_accumulation_steps", "gradient_clipping"}:
            part.unknown.append(f"deepspeed_config.{key}")
    if accumulation := expect(path, "deepspeed_config.gradient_accumulation_steps",
                              config.get("gradient_accumulation_steps"), int):
        part.set("settings.grad_accum", accumulation, "deepspeed_config.gradient_accumulation_steps")


# accelerate's, and so the Trainer's and axolotl's, FSDP settings (FullyShardedDataParallelPlugin)
FSDP_READ = {"fsdp_version", "fsdp_sharding_strategy", "fsdp_reshard_after_forward", "fsdp_offload_params",
             "fsdp_use_orig_params", "fsdp_auto_wrap_policy", "fsdp_activation_checkpointing",
             "fsdp_transformer_layer_cls_to_wrap", "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading",
             "fsdp_sync_module_states", "fsdp_forward_prefetch", "fsdp_backward_prefetch", "fsdp_limit_all_gathers",
             "fsdp_min_num_params", "version", "sharding_strategy", "reshard_after_forward", "offload_params",
             "use_orig_params", "auto_wrap_policy", "activation_checkpointing", "transformer_layer_cls_to_wrap",
             "state_dict_type", "cpu_ram_efficient_loading", "sync_module_states", "forward_prefetch",
             "backward_prefetch", "limit_all_gathers"}


STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")


def read_fsdp(part: Part, config: dict, where: str, version=None) -> None:
    """FSDP's plugin settings, with or without their ``fsdp_`` prefix (axolotl drops it from 0.10)."""
    path = part.path

    def get(name):
        return config.get(f"fsdp_{name}", config.get(name))

    part.set("sharding", "fsdp", where)
    fsdp_version = expect(path, f"{where}.fsdp_version", get("version") or version, int) or 1
    part.set("stack.fsdp", "fsdp2" if fsdp_version == 2 else "fsdp1", f"{where}.fsdp_version")
    strategy = str(get("sharding_strategy") or "FULL_SHARD").upper()
    reshard = get("reshard_after_forward")
    if isinstance(reshard, str) and reshard.strip().upper() in STRATEGIES:  # FSDP1's: a sharding strategy's name
        strategy, reshard = reshard.strip().upper(), None
    reshard = expect(path, f"{where}.fsdp_reshard_after_forward", reshard, bool)
    if strategy in ("SHARD_GRAD_OP", "2") or reshard is False:
        part.set("settings.reshard_after_forward", False, f"{where}.fsdp_sharding_strategy")
    elif strategy in ("HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "4", "5"):
        part.note(f"{where}.fsdp_sharding_strategy", f"{strategy}: hybrid sharding not modelled; estimated as "
                                                     "FULL_SHARD over every rank")
    elif strategy in ("NO_SHARD", "3"):
        part.note(f"{where}.fsdp_sharding_strategy", "NO_SHARD: estimated as FULL_SHARD (FSDP's flat parameters "
                                                     "unsharded are not modelled)")
    if expect(path, f"{where}.fsdp_offload_params", get("offload_params"), bool):
        part.set("settings.offload", "optimizer+params", f"{where}.fsdp_offload_params")
    if fsdp_version == 1 and expect(path, f"{where}.fsdp_use_orig_params", get("use_orig_params"), bool) and \
            str(get("auto_wrap_policy") or "").upper() == "TRANSFORMER_BASED_WRAP":
        part.set("settings.fsdp_flat", True, f"{where}.fsdp_use_orig_params")
    if expect(path, f"{where}.fsdp_activation_checkpointing", get("activation_checkpointing"), bool):
        part.set("checkpointing", True, f"{where}.fsdp_activation_checkpointing")
    for key in config:
        if key not in FSDP_READ:
            part.unknown.append(f"{where}.{key}")
