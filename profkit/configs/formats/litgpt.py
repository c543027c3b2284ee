"""litgpt's finetune YAML (config_hub/finetune/<model>/{full,lora,qlora}.yaml): Lightning Fabric's precision and
quantization, the LoRA layers by litgpt's names, ``train.micro_batch_size`` and ``max_seq_length``; on several
devices litgpt shards with Fabric's FSDPStrategy (FSDP1)."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.reading import Part, expect

LORA_LAYERS = {"lora_query": ["q_proj"], "lora_key": ["k_proj"], "lora_value": ["v_proj"],
               "lora_projection": ["o_proj"], "lora_mlp": ["gate_proj", "up_proj", "down_proj"], "lora_head": ["lm_head"]}


def recognise(data: dict) -> bool:
    return "checkpoint_dir" in data and isinstance(data.get("train"), dict)


def read(part: Part, data: dict) -> None:
    path = part.path
    part.set("stack.loop", "litgpt", "(litgpt)")
    checkpoint = str(data.get("checkpoint_dir") or "")
    part.set("model", checkpoint.split("checkpoints/", 1)[-1] if checkpoint else None, "checkpoint_dir")
    lora = any(k in data for k in ("lora_r", *LORA_LAYERS))
    quantize = str(data.get("quantize") or "")
    if quantize and not quantize.startswith("bnb.nf4") and not quantize.startswith("bnb.fp4"):
        part.note("quantize", f"{quantize}: not modelled; estimated in 16 bits")
    four_bit = quantize.startswith(("bnb.nf4", "bnb.fp4"))
    part.set("adapter", ("qlora" if four_bit else "lora") if lora else "none", "lora_r")
    if four_bit:
        part.set("settings.quant_type", quantize[4:7], "quantize")
        part.set("settings.double_quant", quantize.endswith("-dq"), "quantize")
    if lora:
        part.set("settings.lora_rank", expect(path, "lora_r", data.get("lora_r"), int), "lora_r")
        part.set("settings.lora_alpha", expect(path, "lora_alpha", data.get("lora_alpha"), int), "lora_alpha")
        part.set("settings.lora_dropout", expect(path, "lora_dropout", data.get("lora_dropout"), float),
                 "lora_dropout")
        layers = [name for key, names in LORA_LAYERS.items() if expect(path, key, data.get(key), bool)
                  for name in names]
        if layers:
            part.set("settings.lora_targets", ",".join(layers), "lora_query")
    precision = str(data.get("precision") or "bf16-true").lower()
    if precision.endswith("-true"):
        part.set("settings.precision", "bf16-pure" if precision.startswith(("bf16", "16")) else "fp32", "precision")
    elif precision.endswith("-mixed"):
        part.set("half", "bf16" if precision.startswith("bf16") else "fp16", "precision")
        part.set("loaded_in", "fp32", "precision")
    elif precision in ("32", "32-true", "fp32"):
        part.set("settings.precision", "fp32", "precision")
    train = expect(path, "train", data.get("train"), dict)
    micro = expect(path, "train.micro_batch_size", train.get("micro_batch_size"), int)
    part.set("batch_size", micro, "train.micro_batch_size")
    part.set("seq_len", expect(path, "train.max_seq_length", train.get("max_seq_length"), int), "train.max_seq_length")
    devices = expect(path, "devices", data.get("devices"), int) or 1
    nodes = expect(path, "num_nodes", data.get("num_nodes"), int) or 1
    part.set("world_size", devices * nodes, "devices")
    total = expect(path, "train.global_batch_size", train.get("global_batch_size"), int)
    if total and micro:
        part.set("settings.grad_accum", max(1, total // (micro * devices * nodes)), "train.global_batch_size")
    if devices * nodes > 1:  # litgpt's finetune scripts: FSDPStrategy(auto_wrap_policy={Block},
        # activation_checkpointing_policy={Block}): FSDP1 over the blocks, each block checkpointed
        part.set("sharding", "fsdp", "devices")
        part.set("stack.fsdp", "fsdp1", "(litgpt's FSDPStrategy)")
        part.set("checkpointing", True, "(litgpt's FSDPStrategy checkpoints every Block)")
    if four_bit:  # litgpt's finetune scripts replace the optimizer with bitsandbytes' PagedAdamW when quantizing
        part.set("settings.optimizer", "paged-adamw-8bit", "quantize")
        part.note("quantize", "litgpt steps a 4-bit run with bitsandbytes' PagedAdamW, whatever the config's "
                              "optimizer (estimated as the 8-bit paged one: both keep their state outside PyTorch's "
                              "allocator)")
    elif isinstance(data.get("optimizer"), dict):
        common.optimizer(part, "optimizer.class_path", data["optimizer"].get("class_path"))
    elif data.get("optimizer"):
        common.optimizer(part, "optimizer", data["optimizer"])
    else:
        part.set("settings.optimizer", "adamw", "(litgpt's default, AdamW)")
    common.account(part, data, {"checkpoint_dir", "quantize", "lora_r", "lora_alpha", "lora_dropout", *LORA_LAYERS,
                                "precision", "train", "devices", "num_nodes", "optimizer", "eval", "access_token"})
