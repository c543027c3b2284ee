"""What several frameworks' readers share: the optimizer, attention and dtype names they use, and the account of
every key (read, noted, known not to matter, or unknown)."""

from __future__ import annotations

import re

from profkit.configs.reading import Part, expect

# Keys that change neither memory nor time of a step: where things are written, logged, evaluated and scheduled.
NOT_MEMORY = re.compile(
    r"^(output_dir|out_dir|logging|log_|logger|save|eval|evals_|hub_|push_to_hub|wandb|report_to|run_name|seed|"
    r"data_seed|lr|learning_rate|min_lr|warmup|num_train_epochs|num_epochs|epochs|max_steps|max_steps_per_epoch|"
    r"weight_decay|adam_|betas|lr_scheduler|scheduler|dataset|datasets|data|tokenizer|chat_template|special_tokens|"
    r"resume|overwrite|do_train|do_eval|do_predict|val_|test_|shuffle|preprocessing_|dataloader_|ddp_timeout|"
    r"max_grad_norm|gradient_clipping|clip_grad_norm|max_norm|plot_|template|streaming|model_revision|revision|"
    r"trust_remote_code|bf16_full_eval|fp16_full_eval|remove_unused_columns|group_by_length|label_names|"
    r"use_liger$|neftune|loss_watchdog|early_stopping|metric_|greater_is_better|load_best|prediction_|include_|"
    r"per_device_eval|eval_batch_size|max_samples|cutoff_|tf32|hf_use_auth_token|use_auth_token|token$|"
    r"profiler|compute_environment|debug|machine_rank|main_process|main_training_function|rdzv_|same_network|"
    r"tpu_|enable_cpu_affinity|downcast_bf16|dynamo_config|description|name$|tags|model_card|callbacks|"
    r"num_workers|dataset_num_proc|strict|low_cpu_ram|save_adapter|steps_per_print|wall_clock_breakdown|"
    r"zero_allow_untested_optimizer|zero_force_ds_cpu_optimizer|comms_logger|flops_profiler|tensorboard|"
    r"csv_monitor|checkpoint$|checkpointer|output_|is_local|gc_steps|ddp_find_unused|ddp_backend|"
    r"sequence_parallel_degree_?|vocab_size_check|prompt_style|mask_prompt|ignore_index|torchdata|chat_format|"
    r"system_prompt|use_reentrant|auto_find_batch_size|disable_tqdm|torch_empty_cache_steps|hub|optim_args|"
    r"strategy|gpu_memory_limit|unfrozen_parameters|train_on_inputs|max_prompt_len|max_length_prompt|"
    r"dpo_|beta|rpo_alpha|reward|num_generations|temperature|top_p|use_vllm|vllm_|max_completion_length|"
    r"generation_|callbacks|benchmark|ddp_bucket_cap_mb|local_rank|device_map_auto)")

OPTIMIZERS = {
    "adamw": "adamw", "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_hf": "adamw",
    "adamw_apex_fused": "adamw", "adam": "adamw", "torch.optim.adamw": "adamw", "adamw_torch_4bit": None,
    "adamw_bnb_8bit": "adamw-8bit", "adamw_8bit": "adamw-8bit", "bnb.optim.adamw8bit": "adamw-8bit",
    "adam8bit": "adamw-8bit", "bitsandbytes.optim.adamw8bit": "adamw-8bit",
    "paged_adamw_8bit": "paged-adamw-8bit", "bitsandbytes.optim.pagedadamw8bit": "paged-adamw-8bit",
    "bitsandbytes.optim.pagedadamw": "paged-adamw-8bit", "paged_adamw_32bit": "paged-adamw-8bit",
    "sgd": "sgd", "torch.optim.sgd": "sgd",
}

ATTENTIONS = {"flash_attention_2": "flash", "flash_attention_3": "flash", "flash": "flash", "sdpa": "sdpa",
              "eager": "eager", "flex_attention": "sdpa"}

DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "torch.bfloat16": "bf16", "float16": "fp16", "fp16": "fp16",
          "half": "fp16", "torch.float16": "fp16", "float32": "fp32", "fp32": "fp32", "torch.float32": "fp32",
          "auto": None}


def optimizer(part: Part, key: str, value) -> None:
    """An optimizer by any framework's name (a class path or a Trainer ``optim``)."""
    if value is None:
        return
    name = str(value).strip().lower()
    found = OPTIMIZERS.get(name, OPTIMIZERS.get(name.rsplit(".", 1)[-1]))
    if found is None:
        part.note(key, f"{value}: an optimizer profkit does not model; estimated as AdamW (two fp32 states per "
                       "trainable parameter)")
        found = "adamw"
    elif name == "paged_adamw_32bit" or name.endswith("pagedadamw"):
        part.note(key, f"{value}: 32-bit paged AdamW estimated as the 8-bit paged one (both keep their state outside "
                       "PyTorch's allocator)")
    part.set("settings.optimizer", found, key)


def attention(part: Part, key: str, value) -> None:
    if value is None:
        return
    found = ATTENTIONS.get(str(value).strip().lower())
    if found is None:
        part.note(key, f"{value}: an attention profkit does not model; estimated with SDPA")
        found = "sdpa"
    part.set("settings.attention", found, key)


def dtype(value) -> str | None:
    return DTYPES.get(str(value).strip().lower()) if value is not None else None


def lora_targets(part: Part, key: str, value) -> None:
    """peft's target_modules: a list, a name, or all-linear (axolotl's lora_target_linear, peft's "all-linear")."""
    if value is None:
        return
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("all-linear", "all_linear", "all"):
            part.set("settings.lora_targets", "all-linear", key)
            return
        if text.startswith("(") or "*" in text or "\\" in text:  # a regular expression over module names
            part.note(key, f"{text}: a pattern of module names; estimated on q_proj and v_proj, peft's default for "
                           "most decoders")
            return
    targets = expect(part.path, key, value, list)
    if targets:
        part.set("settings.lora_targets", ",".join(str(t) for t in targets), key)


def account(part: Part, data: dict, read: set[str], noted: dict[str, str] | None = None) -> None:
    """Every key of ``data`` not in ``read``: noted with what was assumed (``noted``: key -> note, where the key's
    value is truthy), known not to matter (``NOT_MEMORY``), or listed as unknown."""
    for key, value in data.items():
        if key in read:
            continue
        if noted and key in noted:
            if value not in (None, False, "", [], {}, "none", "None"):
                part.note(key, noted[key])
            continue
        if NOT_MEMORY.match(key):
            continue
        part.unknown.append(key)
