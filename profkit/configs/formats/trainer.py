"""transformers' ``TrainingArguments`` and TRL's ``SFTConfig``/``DPOConfig``/... with TRL's ``ModelConfig``, as
JSON or YAML (the TRL CLI's and alignment-handbook's recipes): the Trainer's batch, accumulation, checkpointing,
precision, optimizer and DeepSpeed or FSDP, and the model and its peft and 4-bit settings."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.formats.accelerate import read_fsdp
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return any(k in data for k in ("per_device_train_batch_size", "model_name_or_path", "gradient_checkpointing",
                                   "gradient_accumulation_steps", "optim"))


NOTED = {
    "beta": "a preference trainer (DPO, ORPO, ...): estimated as supervised training of the policy alone; a reference "
            "model and the rejected sequences are not counted",
    "num_generations": "GRPO's generations: not counted; estimated as supervised training",
    "use_vllm": "generation with vLLM: its memory is not counted",
    "padding_free": "padding-free batches: estimated at the full sequence length",
    "torch_compile": "torch.compile: not modelled; estimated eager",
    "load_in_8bit": "8-bit weights (LLM.int8): not modelled; estimated in 16 bits",
    "use_dora": "DoRA: estimated as LoRA (DoRA's magnitude vectors and its extra products are not counted)",
    "use_rslora": "",
}


def read(part: Part, data: dict, adapters: bool = True) -> None:
    """``adapters``: the file's own peft keys say whether it trains an adapter (LLaMA-Factory's say it instead)."""
    path = part.path
    part.set("stack.loop", "trainer", "(transformers' Trainer)")
    part.set("model", expect(path, "model_name_or_path", data.get("model_name_or_path"), str), "model_name_or_path")
    part.set("batch_size", expect(path, "per_device_train_batch_size", data.get("per_device_train_batch_size"), int),
             "per_device_train_batch_size")
    part.set("settings.grad_accum", expect(path, "gradient_accumulation_steps", data.get("gradient_accumulation_steps"),
                                           int), "gradient_accumulation_steps")
    part.set("checkpointing", expect(path, "gradient_checkpointing", data.get("gradient_checkpointing"), bool),
             "gradient_checkpointing")
    for key in ("max_length", "max_seq_length"):  # TRL's names for the cut (max_seq_length before 0.20)
        part.set("seq_len", expect(path, key, data.get(key), int), key)
    if "seq_len" in part.origin and not expect(path, "packing", data.get("packing"), bool):
        part.note("packing", f"off: batches are padded to their longest sample; the estimate is at a batch that "
                             f"reaches {part.seq_len} tokens")
    common.optimizer(part, "optim", data.get("optim"))
    common.attention(part, "attn_implementation", data.get("attn_implementation"))
    for dtype in ("bf16", "fp16"):
        if expect(path, dtype, data.get(dtype), bool):
            part.set("half", dtype, dtype)
    stated = data.get("torch_dtype", data.get("dtype"))
    if stated is None and adapters:
        part.note("torch_dtype", "not stated: the model taken as loaded in fp32, from_pretrained's default before "
                                 "transformers 5")
    part.set("loaded_in", common.dtype(stated) if stated is not None else "fp32", "torch_dtype")
    if expect(path, "use_liger_kernel", data.get("use_liger_kernel"), bool):
        part.set("settings.loss", "chunked", "use_liger_kernel")
    if adapters:
        _peft(part, data)
    if deepspeed := data.get("deepspeed"):
        if isinstance(deepspeed, str):
            part.refers_to.append(deepspeed)
        else:
            part.note("deepspeed", "an inline DeepSpeed config: give it as a file with --config to read it")
    if data.get("fsdp"):
        read_fsdp(part, expect(path, "fsdp_config", data.get("fsdp_config"), dict) or {}, "fsdp_config")
    common.account(part, data, READ, NOTED)


READ = {"model_name_or_path", "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
        "gradient_checkpointing_kwargs", "max_length", "max_seq_length", "packing", "packing_strategy", "optim",
        "attn_implementation", "bf16", "fp16", "torch_dtype", "dtype", "use_liger_kernel", "use_peft", "lora_r",
        "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit", "bnb_4bit_quant_type",
        "use_bnb_nested_quant", "deepspeed", "fsdp", "fsdp_config", "lora_task_type", "lora_modules_to_save",
        "max_prompt_length", "loss_type", "assistant_only_loss", "completion_only_loss", "average_tokens_across_devices",
        "eos_token", "pad_token", "logging_first_step", "log_completions", "hub_always_push", "save_only_model",
        "reward_funcs", "reward_weights", "lr_scheduler_kwargs"}


def _peft(part: Part, data: dict) -> None:
    path = part.path
    four_bit = expect(path, "load_in_4bit", data.get("load_in_4bit"), bool)
    if not expect(path, "use_peft", data.get("use_peft"), bool):
        part.set("adapter", "none", "use_peft")
        if four_bit:
            part.note("load_in_4bit", "4-bit weights without an adapter cannot be trained; ignored")
        return
    part.set("adapter", "qlora" if four_bit else "lora", "use_peft")
    part.set("settings.lora_rank", expect(path, "lora_r", data.get("lora_r"), int), "lora_r")
    part.set("settings.lora_alpha", expect(path, "lora_alpha", data.get("lora_alpha"), int), "lora_alpha")
    part.set("settings.lora_dropout", expect(path, "lora_dropout", data.get("lora_dropout"), float), "lora_dropout")
    common.lora_targets(part, "lora_target_modules", data.get("lora_target_modules"))
    if four_bit:
        kind = str(data.get("bnb_4bit_quant_type") or "nf4").lower()
        part.set("settings.quant_type", kind if kind in ("nf4", "fp4") else "nf4", "bnb_4bit_quant_type")
        part.set("settings.double_quant", expect(path, "use_bnb_nested_quant", data.get("use_bnb_nested_quant"),
                                                 bool) or False, "use_bnb_nested_quant")
