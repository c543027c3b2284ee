"""axolotl's YAML (``axolotl train config.yml``): keys as axolotl's config schema names them
(src/axolotl/utils/schemas/config.py). It trains through its AxolotlTrainer, a subclass of transformers' Trainer;
``deepspeed:`` names a DeepSpeed JSON, ``fsdp_config`` holds accelerate's FSDP settings."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.formats.accelerate import read_fsdp
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return "base_model" in data and any(k in data for k in ("micro_batch_size", "sequence_len", "adapter",
                                                            "datasets", "pretraining_dataset"))


NOTED = {
    "rl": "a preference or RL trainer (DPO, ORPO, KTO, GRPO): estimated as supervised training of the policy alone; "
          "a reference model, a second forward per pair and generations are not counted",
    "activation_offloading": "activations offloaded to the host: not modelled; estimated as kept on the GPU (an "
                             "over-estimate of the activations)",
    "torch_compile": "torch.compile: not modelled; estimated eager (compiled kernels may hold less)",
    "tiled_mlp": "tiled MLP: not modelled; estimated untiled",
    "context_parallel_size": "context parallelism: not modelled; estimated with each rank holding the whole "
                             "sequence",
    "expert_parallel_size": "expert parallelism: not modelled; estimated with every expert on each rank",
    "use_scattermoe": "ScatterMoE kernels: not modelled; estimated with transformers' experts",
    "use_kernels": "Hugging Face kernels: not modelled; estimated with transformers' own modules",
    "lora_qkv_kernel": "axolotl's fused LoRA kernels: not modelled; estimated with peft's layers",
    "lora_o_kernel": "axolotl's fused LoRA kernels: not modelled; estimated with peft's layers",
    "lora_mlp_kernel": "axolotl's fused LoRA kernels: not modelled; estimated with peft's layers",
    "liger_rope": "Liger's fused kernel: not modelled (only its fused linear cross-entropy is)",
    "liger_rms_norm": "Liger's fused kernel: not modelled (only its fused linear cross-entropy is)",
    "liger_glu_activation": "Liger's fused kernel: not modelled (only its fused linear cross-entropy is)",
    "liger_layer_norm": "Liger's fused kernel: not modelled (only its fused linear cross-entropy is)",
    "liger_rms_norm_gated": "Liger's fused kernel: not modelled (only its fused linear cross-entropy is)",
    "lora_modules_to_save": "modules trained whole beside the adapters: not counted",
    "load_in_8bit": "8-bit weights (LLM.int8): not modelled; estimated in 16 bits",
    "reinit_weights": "", "resize_token_embeddings_to_32x": "the vocabulary padded to a multiple of 32: not counted",
}


def read(part: Part, data: dict) -> None:
    path = part.path
    part.set("stack.loop", "axolotl", "(axolotl)")
    part.set("model", expect(path, "base_model", data.get("base_model"), str), "base_model")
    adapter = expect(path, "adapter", data.get("adapter"), str)
    four_bit = expect(path, "load_in_4bit", data.get("load_in_4bit"), bool)
    if adapter not in (None, "lora", "qlora"):
        part.note("adapter", f"{adapter}: an adapter profkit does not model; estimated as LoRA")
        adapter = "lora"
    if adapter == "lora" and four_bit:
        adapter = "qlora"  # LoRA over a 4-bit base, as axolotl runs it
    part.set("adapter", adapter or "none", "adapter")
    if adapter:
        part.set("settings.lora_rank", expect(path, "lora_r", data.get("lora_r"), int), "lora_r")
        part.set("settings.lora_alpha", expect(path, "lora_alpha", data.get("lora_alpha"), int), "lora_alpha")
        dropout = expect(path, "lora_dropout", data.get("lora_dropout"), float)
        part.set("settings.lora_dropout", dropout, "lora_dropout")
        if expect(path, "lora_target_linear", data.get("lora_target_linear"), bool):
            part.set("settings.lora_targets", "all-linear", "lora_target_linear")
        else:
            common.lora_targets(part, "lora_target_modules", data.get("lora_target_modules"))
    if adapter == "qlora" and expect(path, "quantize_moe_experts", data.get("quantize_moe_experts"), bool):
        part.set("settings.quantize_experts", True, "quantize_moe_experts")
    sequence = expect(path, "sequence_len", data.get("sequence_len"), int)
    part.set("seq_len", sequence, "sequence_len")
    if sequence and not expect(path, "sample_packing", data.get("sample_packing"), bool) and not expect(
            path, "pad_to_sequence_len", data.get("pad_to_sequence_len"), bool):
        part.note("sample_packing", f"off: batches are padded to their longest sample; the estimate is at a batch "
                                    f"that reaches {sequence} tokens")
    part.set("batch_size", expect(path, "micro_batch_size", data.get("micro_batch_size"), int), "micro_batch_size")
    part.set("settings.grad_accum", expect(path, "gradient_accumulation_steps",
                                           data.get("gradient_accumulation_steps"), int), "gradient_accumulation_steps")
    part.set("checkpointing", _checkpointing(path, data.get("gradient_checkpointing")), "gradient_checkpointing")
    common.optimizer(part, "optimizer", data.get("optimizer"))
    common.attention(part, "attn_implementation", data.get("attn_implementation")
                     or ("flash_attention_2" if expect(path, "flash_attention", data.get("flash_attention"), bool)
                         else None))
    half = _half(path, data)
    part.set("half", half, "bf16" if half == "bf16" else "fp16")
    part.set("loaded_in", half, "bf16" if half == "bf16" else "fp16")  # axolotl loads the model in that dtype
    if expect(path, "liger_fused_linear_cross_entropy", data.get("liger_fused_linear_cross_entropy"), bool):
        part.set("settings.loss", "chunked", "liger_fused_linear_cross_entropy")
    plugins = [str(p) for p in expect(path, "plugins", data.get("plugins"), list) or []]
    if any("CutCrossEntropy" in p for p in plugins) or expect(path, "cut_cross_entropy",
                                                               data.get("cut_cross_entropy"), bool):
        part.set("settings.loss", "chunked", "plugins")
    if deepspeed := expect(path, "deepspeed", data.get("deepspeed"), str):
        part.refers_to.append(deepspeed)
    if data.get("fsdp") or data.get("fsdp_config"):
        read_fsdp(part, expect(path, "fsdp_config", data.get("fsdp_config"), dict) or {}, "fsdp_config",
                  data.get("fsdp_version"))
    common.account(part, data, READ, NOTED)


READ = {"base_model", "adapter", "load_in_4bit", "lora_r", "lora_alpha", "lora_dropout", "lora_target_linear",
        "lora_target_modules", "quantize_moe_experts", "sequence_len", "sample_packing", "pad_to_sequence_len",
        "micro_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "gradient_checkpointing_kwargs",
        "optimizer", "attn_implementation", "flash_attention", "bf16", "fp16", "liger_fused_linear_cross_entropy",
        "plugins", "cut_cross_entropy", "deepspeed", "fsdp", "fsdp_config", "fsdp_version", "model_type",
        "tokenizer_type", "lora_model_dir", "eval_sample_packing", "base_model_config", "experts_implementation",
        "model_config", "model_quantization_config", "model_quantization_config_kwargs", "eot_tokens", "tokens",
        "experimental_skip_move_to_device", "min_sample_len", "pretraining_dataset", "dataset_prepared_path",
        "trackio_space_id", "trackio_run_name", "trackio_project_name", "do_causal_lm_eval",
        "eval_causal_lm_metrics", "eval_max_new_tokens", "eval_table_size", "gpu_memory_limit"}


def _checkpointing(path: str, value) -> bool | None:
    if isinstance(value, str) and value.strip().lower() in ("offload", "offload_disk"):
        return True  # checkpointing with the saved inputs offloaded: at least as little as checkpointing
    return expect(path, "gradient_checkpointing", value, bool)


def _half(path: str, data: dict) -> str | None:
    """axolotl's ``bf16: auto`` is bf16 where the GPU has it (every GPU this estimates for but the V100 and T4)."""
    bf16 = data.get("bf16")
    if isinstance(bf16, str) and bf16.strip().lower() == "auto":
        return "bf16"
    if expect(path, "bf16", bf16, bool):
        return "bf16"
    if expect(path, "fp16", data.get("fp16"), bool):
        return "fp16"
    return None
