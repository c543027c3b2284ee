"""torchtune's recipe configs (``tune run <recipe> --config``): components by ``_component_`` (the model builder,
the optimizer, the loss, the dataset), the batch, accumulation, dtype and checkpointing. Distributed recipes
shard with FSDP2 and reduce every micro-batch's gradients."""

from __future__ import annotations

import re
from pathlib import Path

from profkit.configs.formats import common
from profkit.configs.reading import Part, expect

# torchtune's model builders as Hugging Face names them (torchtune/models/*/_model_builders.py).
BUILDERS = {
    "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf", "llama3_8b": "meta-llama/Meta-Llama-3-8B",
    "llama3_70b": "meta-llama/Meta-Llama-3-70B", "llama3_1_8b": "meta-llama/Llama-3.1-8B",
    "llama3_1_70b": "meta-llama/Llama-3.1-70B", "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "llama3_3_70b": "meta-llama/Llama-3.3-70B-Instruct", "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b", "gemma2_2b": "google/gemma-2-2b",
    "gemma2_9b": "google/gemma-2-9b", "gemma2_27b": "google/gemma-2-27b", "phi3_mini": "microsoft/Phi-3-mini-4k-instruct",
    "phi4_14b": "microsoft/phi-4", "qwen2_0_5b": "Qwen/Qwen2-0.5B", "qwen2_1_5b": "Qwen/Qwen2-1.5B",
    "qwen2_7b": "Qwen/Qwen2-7B", "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b_base": "Qwen/Qwen2.5-1.5B",
    "qwen2_5_1_5b_instruct": "Qwen/Qwen2.5-1.5B-Instruct", "qwen2_5_3b": "Qwen/Qwen2.5-3B",
    "qwen2_5_7b_base": "Qwen/Qwen2.5-7B", "qwen2_5_7b_instruct": "Qwen/Qwen2.5-7B-Instruct",
    "qwen2_5_14b_base": "Qwen/Qwen2.5-14B", "qwen2_5_14b_instruct": "Qwen/Qwen2.5-14B-Instruct",
    "qwen2_5_32b_base": "Qwen/Qwen2.5-32B", "qwen2_5_32b_instruct": "Qwen/Qwen2.5-32B-Instruct",
    "qwen2_5_72b_base": "Qwen/Qwen2.5-72B", "qwen2_5_72b_instruct": "Qwen/Qwen2.5-72B-Instruct",
    "qwen3_0_6b_base": "Qwen/Qwen3-0.6B-Base", "qwen3_0_6b_instruct": "Qwen/Qwen3-0.6B",
    "qwen3_1_7b_base": "Qwen/Qwen3-1.7B-Base", "qwen3_1_7b_instruct": "Qwen/Qwen3-1.7B",
    "qwen3_4b_base": "Qwen/Qwen3-4B-Base", "qwen3_4b_instruct": "Qwen/Qwen3-4B",
    "qwen3_8b_base": "Qwen/Qwen3-8B-Base", "qwen3_8b_instruct": "Qwen/Qwen3-8B",
    "qwen3_14b_base": "Qwen/Qwen3-14B-Base", "qwen3_14b_instruct": "Qwen/Qwen3-14B",
    "qwen3_32b": "Qwen/Qwen3-32B", "llama4_scout_17b_16e": "meta-llama/Llama-4-Scout-17B-16E",
}
LORA_LAYERS = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}


def recognise(data: dict) -> bool:
    return isinstance(data.get("model"), dict) and "_component_" in data["model"]


NOTED = {
    "enable_activation_offloading": "activations offloaded to the host: not modelled; estimated as kept on the GPU",
    "compile": "torch.compile: not modelled; estimated eager",
    "optimizer_in_bwd": "the optimizer stepping inside backward: not modelled; every gradient estimated alive at "
                        "the step",
    "custom_sharded_layers": "", "tensor_parallel_dim": "tensor parallelism: not modelled",
}


def read(part: Part, data: dict) -> None:
    path = part.path
    part.set("stack.loop", "torchtune", "(torchtune)")
    _model(part, data["model"])
    part.set("batch_size", expect(path, "batch_size", data.get("batch_size"), int), "batch_size")
    part.set("settings.grad_accum", expect(path, "gradient_accumulation_steps", data.get("gradient_accumulation_steps"),
                                           int), "gradient_accumulation_steps")
    part.set("checkpointing", expect(path, "enable_activation_checkpointing",
                                     data.get("enable_activation_checkpointing"), bool) or False,
             "enable_activation_checkpointing")
    tokenizer = expect(path, "tokenizer", data.get("tokenizer"), dict) or {}
    part.set("seq_len", expect(path, "tokenizer.max_seq_len", tokenizer.get("max_seq_len"), int),
             "tokenizer.max_seq_len")
    dtype = str(data.get("dtype") or "bf16").lower()
    if dtype in ("bf16", "fp16"):  # torchtune trains every weight in that dtype, adapters too
        part.set("settings.precision", "bf16-pure", "dtype")
        if dtype == "fp16":
            part.note("dtype", "fp16: estimated as bf16 (the same bytes)")
    else:
        part.set("settings.precision", "fp32", "dtype")
    optimizer = expect(path, "optimizer", data.get("optimizer"), dict) or {}
    common.optimizer(part, "optimizer._component_", optimizer.get("_component_"))
    loss = str((data.get("loss") or {}).get("_component_", "")) if isinstance(data.get("loss"), dict) else ""
    if loss.endswith("LinearCrossEntropyLoss"):
        part.set("settings.loss", "chunked", "loss._component_")
    elif loss.endswith("CEWithChunkedOutputLoss"):
        part.set("settings.loss", "logits-dtype", "loss._component_")
        part.note("loss._component_", "CEWithChunkedOutputLoss: the logits in their dtype, upcast a chunk at a time "
                                      "(estimated as --loss logits-dtype)")
    elif "rlhf" in loss or "DPO" in loss:
        part.note("loss._component_", f"{loss}: a preference loss; the reference model and the rejected sequences "
                                      "are not counted")
    recipe, processes = _recipe(part.path)
    if recipe:
        part.set("world_size", processes, f"(its header: tune run {recipe})")
    if "distributed" in (recipe or "") or "fsdp_cpu_offload" in data or "custom_sharded_layers" in data:
        # the distributed recipes shard with FSDP2: the recipe its header names, or their own keys
        part.set("sharding", "fsdp", f"(tune run {recipe})" if recipe else "fsdp_cpu_offload")
        part.set("stack.fsdp", "fsdp2", "(torchtune's distributed recipes)")
        if expect(path, "fsdp_cpu_offload", data.get("fsdp_cpu_offload"), bool):
            part.set("settings.offload", "optimizer+params", "fsdp_cpu_offload")
    dataset = data.get("dataset") if isinstance(data.get("dataset"), dict) else {}
    if part.seq_len and not dataset.get("packed"):
        part.note("dataset.packed", f"off: batches are padded to their longest sample; the estimate is at a batch "
                                    f"that reaches {part.seq_len} tokens")
    common.account(part, data, {"model", "batch_size", "gradient_accumulation_steps", "enable_activation_checkpointing",
                                "tokenizer", "dtype", "optimizer", "loss", "fsdp_cpu_offload", "device",
                                "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "batch_size_val",
                                "run_val_every_n_steps", "dataset", "dataset_val"}, NOTED)


LAUNCH = re.compile(r"^#.*\btune run\b(?P<args>[^\n]*?)\s(?P<recipe>[a-z_]+(?:_distributed|_single_device|_low_memory)?)"
                    r"\s+--config", re.M)


def _recipe(path: str) -> tuple[str | None, int | None]:
    """The recipe and process count a config's header names (torchtune's configs begin with the ``tune run``
    command they are written for); the recipe, not the config, decides whether training is distributed."""
    try:
        found = LAUNCH.search(Path(path).read_text())
    except (OSError, UnicodeDecodeError):
        return None, None
    if found is None:
        return None, None
    processes = re.search(r"--nproc_per_node\s+(\d+)", found.group("args"))
    return found.group("recipe"), int(processes.group(1)) if processes else None


def _model(part: Part, model: dict) -> None:
    path = part.path
    builder = str(model["_component_"]).rsplit(".", 1)[-1]
    adapter = "qlora" if builder.startswith("qlora_") else "lora" if builder.startswith("lora_") else "none"
    base = re.sub(r"^(q?lora)_", "", builder)
    part.set("model", BUILDERS.get(base, f"torchtune:{base}"), "model._component_")
    part.set("adapter", adapter, "model._component_")
    if adapter == "none":
        return
    part.set("settings.lora_rank", expect(path, "model.lora_rank", model.get("lora_rank"), int), "model.lora_rank")
    part.set("settings.lora_alpha", expect(path, "model.lora_alpha", model.get("lora_alpha"), float) and
             int(model["lora_alpha"]), "model.lora_alpha")
    part.set("settings.lora_dropout", expect(path, "model.lora_dropout", model.get("lora_dropout"), float),
             "model.lora_dropout")
    layers = [LORA_LAYERS.get(str(n), str(n)) for n in expect(path, "model.lora_attn_modules",
                                                                model.get("lora_attn_modules"), list) or []]
    if expect(path, "model.apply_lora_to_mlp", model.get("apply_lora_to_mlp"), bool):
        layers += ["gate_proj", "up_proj", "down_proj"]
    if expect(path, "model.apply_lora_to_output", model.get("apply_lora_to_output"), bool):
        layers.append("lm_head")
    if layers:
        part.set("settings.lora_targets", ",".join(layers), "model.lora_attn_modules")
    if adapter == "qlora":  # torchtune's NF4Tensor: NF4 with double-quantized scales
        part.set("settings.quant_type", "nf4", "model._component_")
