"""LLaMA-Factory's YAML (``llamafactory-cli train``): transformers' training arguments with its own model,
finetuning and data arguments (src/llamafactory/hparams/). It trains through transformers' Trainer."""

from __future__ import annotations

from profkit.configs.formats import common, trainer
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return "finetuning_type" in data or ("stage" in data and "model_name_or_path" in data)


NOTED = {**trainer.NOTED,
         "use_galore": "GaLore's low-rank optimizer state: not modelled; estimated as AdamW",
         "use_badam": "BAdam: not modelled; estimated as AdamW over every parameter",
         "use_unsloth": "unsloth's kernels: not modelled",
         "enable_liger_kernel": "", "pref_loss": "", "pref_beta": ""}


def read(part: Part, data: dict) -> None:
    path = part.path
    stage = str(data.get("stage") or "sft")
    if stage not in ("sft", "pt"):
        part.note("stage", f"{stage}: a preference or reward stage; estimated as supervised training of the policy "
                           "alone (a reference model and rejected sequences are not counted)")
    kind = str(data.get("finetuning_type") or "lora").lower()
    bits = expect(path, "quantization_bit", data.get("quantization_bit"), int)
    if kind == "lora":
        part.set("adapter", "qlora" if bits == 4 else "lora", "finetuning_type")
        part.set("settings.lora_rank", expect(path, "lora_rank", data.get("lora_rank"), int), "lora_rank")
        part.set("settings.lora_alpha", expect(path, "lora_alpha", data.get("lora_alpha"), int), "lora_alpha")
        part.set("settings.lora_dropout", expect(path, "lora_dropout", data.get("lora_dropout"), float),
                 "lora_dropout")
        common.lora_targets(part, "lora_target", data.get("lora_target"))
    else:
        if kind != "full":
            part.note("finetuning_type", f"{kind}: estimated as full fine-tuning")
        part.set("adapter", "none", "finetuning_type")
    if bits is not None and bits != 4:
        part.note("quantization_bit", f"{bits}-bit weights: not modelled; estimated in 16 bits")
    if bits == 4 and str(data.get("quantization_method") or "bnb").lower() != "bnb":
        part.note("quantization_method", f"{data['quantization_method']}: estimated as bitsandbytes NF4")
    if bits == 4:
        part.set("settings.quant_type", str(data.get("quantization_type") or "nf4").lower(), "quantization_type")
        part.set("settings.double_quant", expect(path, "double_quantization", data.get("double_quantization"), bool)
                 if "double_quantization" in data else True, "double_quantization")
    trainer.read(part, {k: v for k, v in data.items() if k in TRAINER_KEYS}, adapters=False)
    part.set("stack.loop", "trainer", "(LLaMA-Factory's Trainer)")
    part.set("seq_len", expect(path, "cutoff_len", data.get("cutoff_len"), int), "cutoff_len")
    if "seq_len" in part.origin and not expect(path, "packing", data.get("packing"), bool):
        part.note("packing", f"off: batches are padded to their longest sample; the estimate is at a batch that "
                             f"reaches {part.seq_len} tokens")
    if expect(path, "disable_gradient_checkpointing", data.get("disable_gradient_checkpointing"), bool):
        part.set("checkpointing", False, "disable_gradient_checkpointing")
    elif "gradient_checkpointing" not in data:
        part.set("checkpointing", True, "(LLaMA-Factory checkpoints unless disable_gradient_checkpointing)")
    if "flash_attn" in data:
        common.attention(part, "flash_attn", {"fa2": "flash_attention_2", "sdpa": "sdpa", "disabled": "eager",
                                              "auto": None}.get(str(data["flash_attn"]).lower(), data["flash_attn"]))
    # LLaMA-Factory loads in the compute dtype and upcasts what trains to fp32 unless pure_bf16
    if expect(path, "pure_bf16", data.get("pure_bf16"), bool):
        part.set("settings.precision", "bf16-pure", "pure_bf16")
    half = part.half
    if half and kind != "lora":
        part.set("loaded_in", half if expect(path, "pure_bf16", data.get("pure_bf16"), bool) else "fp32",
                 "pure_bf16")
    if expect(path, "enable_liger_kernel", data.get("enable_liger_kernel"), bool):
        part.set("settings.loss", "chunked", "enable_liger_kernel")
    common.account(part, data, READ | TRAINER_KEYS, NOTED)


TRAINER_KEYS = {"per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "optim",
                "bf16", "fp16", "deepspeed", "fsdp", "fsdp_config", "model_name_or_path", "torch_dtype"}
READ = {"stage", "finetuning_type", "quantization_bit", "quantization_method", "quantization_type",
        "double_quantization", "lora_rank", "lora_alpha", "lora_dropout", "lora_target", "cutoff_len", "packing",
        "disable_gradient_checkpointing", "flash_attn", "pure_bf16", "enable_liger_kernel", "galore_rank",
        "galore_target", "galore_scale", "galore_layerwise", "use_v1_kernels", "overwrite_cache", "dataset_dir"}
