"""Published measured peaks (``tests/data/published/peaks.csv``: source, full settings, the counter and the unit
each reports; ``models.json``: each model's configuration) set beside ``profkit estimate`` for the same settings.
``split`` says whether a figure was used while the estimator was built (``used``) or only checked after
(``holdout``). Each figure is set beside the estimate of the counter it reports: allocated bytes
(``max_memory_allocated``), reserved bytes (``max_memory_reserved``) or what nvidia-smi shows (reserved plus the
CUDA context and NCCL's buffers, ``Estimate.device_used``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
from transformers import AutoConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from profkit.core.methods import (
    ALL_LINEAR,
    Method,
    OverrideError,
    get_method,
    with_overrides,
)
from profkit.core.stack import Stack
from profkit.model.build import sequence_limit
from profkit.predict.estimate import EstimateError, estimate
from profkit.predict.mechanisms import NotModelled, derive

UNITS = {"GB": 1e9, "GiB": 2**30, "MB": 1e6, "MiB": 2**20}


def config_of(entry: dict):
    """The transformers configuration of a models.json entry."""
    spec = dict(entry["config"])
    return AutoConfig.for_model(spec.pop("model_type"), **spec)


def compare(table: Path, models: Path | None = None) -> pd.DataFrame:
    """One row per published figure: the estimate's peak and the relative error. ``models`` (default:
    ``models.json`` beside the table) holds each model's Hugging Face configuration with its source."""
    configs = json.loads((models or table.with_name("models.json")).read_text())
    rows = []
    for _, r in pd.read_csv(table, dtype={"quant_type": str}, keep_default_na=False).iterrows():
        config = config_of(configs[r.model])
        settings: dict = {}
        if r.kind == "train":
            settings = {"lora_rank": int(r.lora_r), "lora_alpha": int(r.lora_alpha),
                        "lora_targets": r.lora_targets.replace("+", ","), "precision": r.precision,
                        "optimizer": r.optimizer}
        if r.quant_type:
            settings.update(quant_type=r.quant_type, double_quant=r.double_quant == "true")
        name = r.method + ("_gc" if r.gradient_checkpointing == "true" else "")
        method = with_overrides(get_method(name), **settings)
        e = estimate(method, config, int(r.batch_size), int(r.seq_len), 1, "cuda", r.model,
                     new_tokens=int(r.max_new_tokens) if r.max_new_tokens else 1)
        measured = float(r.measured) * UNITS[r.unit]
        weights = sum(e.at_peak()[c] for c in ("parameters_trainable", "parameters_frozen", "parameters_quantized"))
        rows.append({"source": r.source, "split": r.split, "model": r.model, "kind": r.kind, "method": method.label,
                     "batch_size": int(r.batch_size), "seq_len": int(r.seq_len), "counter": r.counter,
                     "measured_bytes": measured, "estimated_bytes": e.peak_bytes, "error": e.peak_bytes / measured - 1,
                     "possible": measured >= weights, "notes": r.notes})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- the wide set (wide.csv)
# Its rows quote each source's own words for a setting; a figure is estimated only where every setting the estimate
# needs is stated, and otherwise kept with the reason it is not (the settings a figure lacks are never guessed).

# A fixed length: as stated, packed, every sample padded to it ("64 (max_length, padded)"), or a prompt's length.
NUMBER = re.compile(r"^\s*(\d+)\s*(\((packed|packing true|max length|max_length, padded|prompt|prompt tokens)\))?\s*$",
                    re.IGNORECASE)
# Batches padded to their longest sample, truncated at a cap: "<=768 (truncation, ...)", "<=512 (..., truncated)",
# "1024 (max_length truncation; dataset mean ...)", "4096 max (alpaca, not packed; padded per batch)".
CAPPED = re.compile(r"^\s*(?:<=\s*(\d+)\b.*truncat|(\d+)\s*\(max_length truncation|(\d+)\s+max\b.*padded per batch)",
                    re.IGNORECASE)
SHORT_PROMPT = 8
# Losses computed from the hidden states chunk by chunk, the LM head inside: profkit's ``chunked`` form.
FUSED_LOSSES = ("cut-cross-entropy", "liger-fused-linear-cross-entropy")
# litgpt's and torchtune's names for the layers LoRA targets, as Hugging Face names them.
LORA_NAMES = {"query": ["q_proj"], "key": ["k_proj"], "value": ["v_proj"], "projection": ["o_proj"],
              "output_proj": ["o_proj"], "mlp": ["gate_proj", "up_proj", "down_proj"], "head": ["lm_head"],
              "output(lm head)": ["lm_head"]}
MODEL_PARALLEL = re.compile(r"sequential|tensor|\btp\s*x?\d|\bpp\s*x?\d|context parallel|\bcp\b|sequence")
COUNTERS = {"max_memory_allocated": "allocated", "active_bytes_peak": "allocated", "max_memory_reserved": "reserved",
            "nvidia-smi": "device", "unknown": "allocated",
            # optimum's benchmark: the allocated peak plus what nvidia-smi shows beyond the reserved peak
            "max_memory_allocated + non-PyTorch memory": "allocated+outside"}


@dataclass(frozen=True)
class Figure:
    """One published figure as the estimate takes it, or the reason it cannot."""

    method: Method | None
    model: str
    batch_size: int = 0
    seq_len: int = 0
    world_size: int = 1
    new_tokens: int = 1
    engine: str = "session"  # the source's own loop; "trainer": run through accelerate (the HF Trainer), as stated
    varying: bool = False  # batches padded to their longest sample: lengths vary from step to step
    reason: str = ""
    assumed: tuple[str, ...] = ()


def _stated(value: str) -> bool:
    return bool(value.strip())


class _NoEstimate(Exception):
    """Why a figure's settings do not determine an estimate; the message is the reason its Figure keeps."""


def read_figure(r, models: dict) -> Figure:
    """The settings of one row of wide.csv, or why they do not determine an estimate."""
    model = next((name for name, entry in models.items() if r.model in (name, *entry.get("names", []))), None)
    if model is None:
        return Figure(None, r.model, reason="no configuration in models.json")
    if models[model].get("unsupported"):
        return Figure(None, model, reason=models[model]["unsupported"])
    model_type = models[model].get("config", {}).get("model_type")
    if model_type is not None and model_type not in CONFIG_MAPPING:
        return Figure(None, model, reason=f"model_type {model_type}: an architecture transformers does not have "
                                         "(the model's own remote code)")
    try:
        parallel = _parallelism(r)
        if not NUMBER.match(r.batch_size):
            raise _NoEstimate(f"batch size not stated ({r.batch_size or 'empty'})")
        assumed: list[str] = []
        seq_len, varying = _sequence(r, assumed)
        gpus = _ranks(r, parallel, assumed)
        if r.kind == "infer":
            return _generation_figure(r, model, models[model], seq_len, assumed)
        return _training_figure(r, model, models[model], parallel, seq_len, varying, gpus, assumed)
    except _NoEstimate as exc:
        return Figure(None, model, reason=str(exc))


@dataclass(frozen=True)
class _Parallelism:
    """How a figure's ranks hold the model, as its sharding and offload columns state it."""

    sharding: str  # the column, lower case
    fsdp: bool
    fsdp1: bool
    # FSDP1 with use_orig_params and one unit per decoder layer: a layer holding LoRA computes its gradient over all
    # of its weights (--fsdp-flat). Without use_orig_params FSDP1 refuses such mixed units, so the stack wraps the
    # trainable modules apart (peft's policy) and the gradients are the adapters' alone, as FSDP2's.
    flat: bool
    fsdp_offload: bool
    zero_stage: str | None
    zero_offload: str | None  # ZeRO-Offload: the optimizer (ZeRO-2 and 3), and with ZeRO-3 the parameters too

    @property
    def ddp(self) -> bool:
        """DDP (PyTorch's, or Lightning's DDPStrategy): a replica per rank, and the reducer's gradient buckets.
        FSDP's "ddp mode" (NO_SHARD) keeps FSDP's flat parameters instead and is not DDP."""
        return bool(re.search(r"\bddp", self.sharding)) and "fsdp" not in self.sharding


def _parallelism(r) -> _Parallelism:
    sharding, offload = r.sharding.lower(), r.offload.lower()
    if MODEL_PARALLEL.search(sharding):
        raise _NoEstimate(f"{r.sharding}: model parallelism is not modelled")
    fsdp = "fsdp" in sharding and "ddp" not in sharding
    if fsdp and "hybrid" in sharding:
        raise _NoEstimate(f"{r.sharding}: hybrid sharding is not modelled")
    fsdp_offload = fsdp and "fsdp cpu offload" in offload
    zero = re.search(r"zero-?(\d)", sharding)
    zero_offload = None
    if zero and "optimizer" in offload:
        zero_offload = "optimizer+params" if zero.group(1) == "3" and "param" in offload else "optimizer"
    if offload not in ("", "none") and not fsdp_offload and not zero_offload:
        raise _NoEstimate(f"offload ({r.offload}) of this kind is not modelled")
    fsdp1 = fsdp and "fsdp2" not in sharding.replace(" ", "")
    flat = fsdp1 and "use_orig_params true" in sharding and ("transformer_based_wrap" in sharding
                                                             or "{block}" in sharding)
    return _Parallelism(sharding, fsdp, fsdp1, flat, fsdp_offload, zero.group(1) if zero else None, zero_offload)


def _sequence(r, assumed: list[str]) -> tuple[int, bool]:
    """The sequence length the peak is at, and whether lengths vary from batch to batch."""
    seq = NUMBER.match(r.seq_len)
    capped = CAPPED.match(r.seq_len)
    if capped:  # batches padded to their longest sample, truncated at the cap: the peak is at a batch that reaches it
        seq_len = int(next(g for g in capped.groups() if g))
        assumed.append(f"sequence {seq_len}: the longest batch reaches the truncation length (padding to the "
                       "longest sample); a dataset whose samples are all shorter peaks lower; reserved memory as "
                       "when the lengths grow to it over the run")
    elif r.seq_len.startswith("short prompt"):
        seq_len = SHORT_PROMPT
        assumed.append(f"a short prompt taken as {SHORT_PROMPT} tokens (the weights dominate: a few tokens more or "
                       "less change the peak by well under 0.1%)")
    elif seq:
        seq_len = int(seq.group(1))
    elif re.match(r"\s*\d+\s*\(max", r.seq_len):  # a cap, but not whether batches were padded to it or packed
        raise _NoEstimate(f"sequence length stated as a maximum, not whether batches were padded to it, to their "
                          f"longest sample or packed ({r.seq_len})")
    else:
        raise _NoEstimate(f"sequence length not stated as a number ({r.seq_len or 'empty'})")
    return seq_len, bool(capped)


def _ranks(r, parallel: _Parallelism, assumed: list[str]) -> int:
    """The GPUs the figure ran on, where its sharding says how they split the work."""
    gpus = int(float(r.gpu_count or 1))
    if parallel.fsdp1:
        # FSDP1 flattens each unit's parameters into one buffer and shards that: the same bytes per rank as
        # FSDP2's per-parameter shards up to padding, and the same units gathered.
        assumed.append("FSDP1 estimated as FSDP2 (the same shards per rank up to padding, the same units gathered)"
                       + (", with its flat gradients: a decoder layer with a trainable parameter holds a gradient "
                          "over all of its weights (use_orig_params, one unit per layer: --fsdp-flat)"
                          if parallel.flat else ""))
    if parallel.fsdp_offload:
        assumed.append("FSDP's CPU offload moves the parameters' shards, gradients and optimizer state together")
    if gpus > 1 and not parallel.zero_stage and not parallel.fsdp and "ddp" not in parallel.sharding:
        raise _NoEstimate(f"{gpus} GPUs with sharding {r.sharding or 'not stated'}")
    return gpus


def _generation_figure(r, model: str, entry: dict, seq_len: int, assumed: list[str]) -> Figure:
    name = {"infer_bf16": "infer_fp16", "infer_fp16": "infer_fp16", "infer_int4": "infer_int4"}.get(r.method)
    if name is None:
        raise _NoEstimate(f"{r.method}: not a method profkit estimates")
    overrides: dict = {}
    if name == "infer_int4":
        quant = r.quant_type.split(" ")[0].lower()
        if quant not in ("nf4", "fp4"):
            raise _NoEstimate(f"4-bit type not stated ({r.quant_type})")
        overrides = {"quant_type": quant, "double_quant": "dq" in r.quant_type or r.double_quant.startswith("True")}
    new = re.match(r"\s*(\d+)", r.max_new_tokens)
    if not new:
        raise _NoEstimate("new tokens not stated")
    _stack_settings(stack_of(r), name, entry.get("config", {}), overrides, assumed)
    return Figure(with_overrides(get_method(name), **overrides), model, int(r.batch_size), seq_len,
                  1, int(new.group(1)), assumed=tuple(assumed))


def _training_figure(r, model: str, entry: dict, parallel: _Parallelism, seq_len: int, varying: bool, gpus: int,
                     assumed: list[str]) -> Figure:
    if r.method not in ("full", "lora", "qlora"):
        raise _NoEstimate(f"method not stated as full, lora or qlora ({r.method or 'empty'})")
    checkpointing = r.gradient_checkpointing.split(" ")[0].lower()
    if not checkpointing:
        raise _NoEstimate("gradient checkpointing not stated")
    if checkpointing not in ("true", "false", "full", "none"):  # selective (per-op) checkpointing, for one
        raise _NoEstimate(f"gradient checkpointing {r.gradient_checkpointing}: not modelled")
    settings = _optimizer_and_precision(r, assumed)
    name = _method_name(r, checkpointing in ("true", "full"), parallel, settings)
    _adapter_settings(r, settings, assumed)
    engine = _training_stack(r, entry, parallel, name, settings, assumed)
    try:
        method = with_overrides(get_method(name), **settings)
    except OverrideError as exc:  # a setting the source states in words profkit has no value for
        raise _NoEstimate(f"setting not understood: {exc}") from None
    return Figure(method, model, int(r.batch_size), seq_len,
                  gpus if parallel.zero_stage or parallel.fsdp or parallel.ddp else 1, 1, engine, varying=varying,
                  assumed=tuple(assumed))


def _optimizer_and_precision(r, assumed: list[str]) -> dict:
    optimizer = r.optimizer.lower()
    if "in_bwd" in optimizer:
        raise _NoEstimate("the optimizer steps inside backward (not modelled)")
    if not optimizer:
        raise _NoEstimate("optimizer not stated")
    if optimizer.startswith("none"):  # forward and backward only, as a benchmark of the two runs them
        settings: dict = {"optimizer": "sgd"}
        assumed.append("no optimizer step (forward and backward only) estimated as plain SGD, which holds no state "
                       "and steps in place; the gradients taken as freed between steps (zero_grad(set_to_none=True))")
    elif not re.search(r"adam", optimizer):
        raise _NoEstimate(f"optimizer {r.optimizer.split(' (')[0]}: not one profkit estimates")
    else:
        settings = {"optimizer": "paged-adamw-8bit" if "paged" in optimizer else
                    "adamw-8bit" if "8bit" in optimizer else "adamw"}
    if "paged" in optimizer and "8bit" not in optimizer:
        assumed.append("32-bit paged AdamW taken as the 8-bit paged one: both keep their state outside PyTorch's "
                       "allocator")
    if not r.precision:
        raise _NoEstimate("precision not stated")
    settings["precision"] = r.precision.split(" ")[0]  # the value, without the source's explanation after it
    if settings["precision"] == "fp16-pure":  # profkit trains pure in bf16 only; fp16 holds the same bytes
        settings["precision"] = "bf16-pure"
        assumed.append("pure fp16 estimated as pure bf16: every tensor the same size (2-byte weights, gradients "
                       "and optimizer state), only the values differ")
    return settings


def _method_name(r, checkpointed: bool, parallel: _Parallelism, settings: dict) -> str:
    """The registry's method for the stated method, checkpointing and sharding; the sharding's settings."""
    name = r.method + ("_gc" if checkpointed else "")
    if parallel.zero_stage:
        name = f"{r.method}_zero{parallel.zero_stage}" + ("_gc" if name.endswith("_gc") else "")
        if parallel.zero_offload:
            settings["offload"] = parallel.zero_offload
    if parallel.fsdp:
        name = f"{r.method}_fsdp" + ("_gc" if name.endswith("_gc") else "")
        if "shard_grad_op" in parallel.sharding:
            settings["reshard_after_forward"] = False
        if parallel.fsdp_offload:
            settings["offload"] = "optimizer+params"
    return name


def _adapter_settings(r, settings: dict, assumed: list[str]) -> None:
    """LoRA's rank, targets and alpha; QLoRA's 4-bit settings and what its bitsandbytes kept."""
    if r.method == "lora" and r.quant_type.strip():  # LoRA over 8-bit (LLM.int8) weights, for one
        raise _NoEstimate(f"LoRA over {r.quant_type.split(' (')[0]} base weights: not modelled")
    if r.method != "full":
        if not NUMBER.match(r.lora_r) or not _stated(r.lora_targets):
            raise _NoEstimate("LoRA rank or targets not stated")
        settings.update(lora_rank=int(r.lora_r), lora_targets=_lora_targets(r.lora_targets))
        if NUMBER.match(r.lora_alpha):
            settings["lora_alpha"] = int(r.lora_alpha)
    if r.method != "qlora":
        return
    quant = r.quant_type.split(" ")[0].lower()
    if quant not in ("nf4", "fp4") or not _stated(r.double_quant):
        raise _NoEstimate(f"4-bit type or double quantization not stated ({r.quant_type})")
    settings.update(quant_type=quant, double_quant=r.double_quant.startswith("True"))
    if "experts too" in r.quant_type.lower():  # the fused MoE experts through bitsandbytes' parametrization
        settings["quantize_experts"] = True
        assumed.append("the fused MoE experts in 4 bits too (--quantize-experts), as the source's "
                       "quantize_moe_experts does")
    if "the lm head too" in r.quant_type.lower():  # a converter of every Linear layer (Lightning's plugin)
        settings["quantize_head"] = True
        assumed.append("the LM head in 4 bits too, quantized from fp16 (--quantize-head), as the source's "
                       "quantizer converts every Linear layer")
    if getattr(r, "kbit_upcast", "").startswith("False"):  # a stack that prepares without peft's fp32 cast
        settings["kbit_upcast"] = False


# What the source's software stack (its versions and its loop) decides, apart from the stated settings: one Stack
# per row, its mechanisms derived where every estimate derives them (predict.mechanisms).

def stack_of(r, parallel: _Parallelism | None = None) -> Stack:
    """The stack a row states: its transformers and bitsandbytes versions as written (unstated: today's behaviour,
    said), its loop as its ``loop`` column describes it, FSDP1 where its sharding says so."""
    loop_text = getattr(r, "loop", "").lower()
    sharding = parallel.sharding if parallel else ""
    if "litgpt" in loop_text:
        loop = "litgpt"
    elif "utils/train_utils.py" in loop_text:  # llama-recipes; before e5970e2 its outputs stayed bound
        loop = "llama-recipes-2023" if "before e5970e2" in loop_text else "llama-recipes"
    elif "transformers trainer" in loop_text:
        loop = "trainer"
    elif "accelerate" in sharding:
        loop = "accelerate"
    else:
        loop = "other"
    parts = {k: getattr(r, k, "").strip() or None for k in ("transformers", "bitsandbytes")}
    return Stack(**parts, loop=loop, fsdp="fsdp1" if parallel and parallel.fsdp1 else "fsdp2",
                 origin={k: "source" for k, v in parts.items() if v} | {"loop": "source"})


def _stack_settings(stack: Stack, name: str, config: dict, settings: dict, assumed: list[str]) -> None:
    """The settings the row's stack calls for, beside those it states."""
    try:
        method = with_overrides(get_method(name), **settings)
        derived = derive(stack, method, config, given=set(settings))
    except OverrideError as exc:
        raise _NoEstimate(f"setting not understood: {exc}") from None
    except NotModelled as exc:
        raise _NoEstimate(str(exc)) from None
    settings.update(derived.settings)
    assumed.extend(derived.notes)


def _training_stack(r, entry: dict, parallel: _Parallelism, name: str, settings: dict, assumed: list[str]) -> str:
    """What the source's stack did in training (the loss it states, else its transformers'; accumulation; flat
    FSDP1 gradients; what its loop keeps); returns the engine its loop is estimated with."""
    config = entry.get("config", {})
    _own_loss(r, settings, assumed)
    _accumulation(r, settings, assumed)
    if parallel.flat:
        settings["fsdp_flat"] = True
    stack = stack_of(r, parallel)
    if "previous step's logits" in getattr(r, "loop", "") and stack.loop == "other":  # a loop no stack names
        settings["keeps_previous_logits"] = True
        assumed.append("the source's loop keeps the previous step's logits, and the graph behind them, until the next "
                       "forward returns (--keeps-previous-logits)")
    _stack_settings(stack, name, config, settings, assumed)
    return stack.engine


def _own_loss(r, settings: dict, assumed: list[str]) -> None:
    """The loss the source's own code computes (a trainer that takes the logits), by its form or its words."""
    own_loss = getattr(r, "loss", "").split(" (")[0].strip()
    if re.sub(r"[\s_]+", "-", own_loss.lower()) in FUSED_LOSSES:  # however the source spells the name
        own_loss = "chunked"
        assumed.append(f"the loss a fused linear cross-entropy ({r.loss.split(' (')[0]}), estimated with Liger's "
                       "chunks (--loss chunked); Cut Cross-Entropy's blocks hold less still")
    if own_loss:
        settings["loss"] = own_loss
        assumed.append(f"the loss as the source's own code computes it (--loss {own_loss})")


def _accumulation(r, settings: dict, assumed: list[str]) -> None:
    accumulation = getattr(r, "grad_accum", "").strip()
    if not accumulation:
        assumed.append("gradient accumulation not stated: one micro-batch a step (more would keep the gradients "
                       "alive through forward)")
    elif not accumulation.isdigit():
        raise _NoEstimate(f"gradient accumulation not a number ({accumulation})")
    elif int(accumulation) > 1:
        settings["grad_accum"] = int(accumulation)


def _lora_targets(text: str) -> str:
    """The targets as peft takes them. Sources list them with commas, pluses or spaces (a command line's
    ``--target_modules q_proj k_proj``), some as peft's default for the model, named (``DEFAULT=c_attn``)."""
    text = re.sub(r"^\s*default\s*=\s*", "", text.strip(), flags=re.IGNORECASE)
    text = re.sub(r"^(peft )?default for \S+ \((.+)\)$", r"\2", text, flags=re.IGNORECASE)
    if re.match(r"all\b", text.lower()):  # "all", "all-linear", "ALL (all linear)"
        return ALL_LINEAR
    names: list[str] = []
    for part in re.split(r"[,+]", text):
        known = LORA_NAMES.get(part.strip().lower())  # a name with a space of its own: "output(lm head)"
        words = [part.strip()] if known else re.sub(r"\(.*?\)", " ", part).split()  # an aside in brackets
        for word in words:
            for name in LORA_NAMES.get(word.lower(), [word]):
                if name not in names:
                    names.append(name)
    return ",".join(names)


def within_positions(seq_len: int, fed: int, limit: int | None) -> tuple[int, str]:
    """The sequence a figure ran and the assumption taken: a stated sequence whose ``fed`` tokens are past the
    model's learned positions (``limit``; None for rotary and ALiBi models) cannot have run, and trainers cap it at
    the tokenizer's length, the model's (fms-hf-tuning and transformers' run_clm take min(max_seq_length,
    model_max_length))."""
    if limit is None or fed <= limit:
        return seq_len, ""
    return limit - (fed - seq_len), (f"sequence {limit}: the stated {seq_len} is past the model's {limit} learned "
                                     "positions, which no run can use; trainers cap it there (the tokenizer's "
                                     "model_max_length)")


def compare_wide(table: Path, models: Path | None = None, split: str | None = None,
                 counter: str | None = None) -> pd.DataFrame:
    """One row per figure of wide.csv (``split``, ``counter``: only those; counter "allocated", "reserved" or
    "device" (nvidia-smi), as
    ``COUNTERS`` classes them): the estimate for the counter the source reports, the
    relative error, or the reason there is none (a setting not stated, a setup not modelled, the estimate's own
    refusal); ``static_bytes``, the least any run with the stated settings holds."""
    configs = json.loads((models or table.with_name("models.json")).read_text())
    rows, limits = [], {}  # limits: each model's learned positions, built once
    for _, r in pd.read_csv(table, dtype=str, keep_default_na=False).iterrows():
        if (split and r.split != split) or (counter and COUNTERS.get(r.counter) != counter):
            continue
        figure = read_figure(r, configs)
        measured = float(r.measured) * UNITS[r.unit]
        row = {"split": r.split, "project": r.project, "model": figure.model, "kind": r.kind,
               "method": figure.method.label if figure.method else r.method, "batch_size": figure.batch_size,
               "seq_len": figure.seq_len, "world_size": figure.world_size, "counter": r.counter,
               "measured_bytes": measured, "estimated_bytes": None, "error": None, "reason": figure.reason,
               "assumed": "; ".join(figure.assumed), "static_bytes": None, "notes": ""}
        if figure.method is not None:
            config = config_of(configs[figure.model])
            if figure.model not in limits:
                limits[figure.model] = sequence_limit(config)
            fed = figure.seq_len + (figure.new_tokens - 1 if figure.method.kind == "infer" else 0)
            seq_len, capped = within_positions(figure.seq_len, fed, limits[figure.model])
            if capped:
                figure = replace(figure, seq_len=seq_len, assumed=(*figure.assumed, capped))
                row.update(seq_len=seq_len, assumed="; ".join(figure.assumed))
            try:
                e = estimate(figure.method, config, figure.batch_size, figure.seq_len, figure.world_size, "cuda",
                             figure.model, figure.engine, new_tokens=figure.new_tokens)
            except EstimateError as exc:
                row["reason"] = f"refused: {exc}"
            else:
                kind = COUNTERS.get(r.counter)
                reserved = e.reserved()["bytes"]
                if figure.varying and kind in ("reserved", "device") and e.reserved_if_lengths_grow():
                    reserved = e.reserved_if_lengths_grow()["bytes"]
                outside = sum(e.device_used()["outside_allocator"].values())
                predicted = {"reserved": reserved, "device": reserved + outside,
                             "allocated+outside": e.peak_bytes + outside}.get(kind, e.peak_bytes)
                # What no run with these settings can go below: weights, and for training the gradients and the
                # optimizer state at the step (counted exactly; a figure under it contradicts its stated settings).
                last = e.instants[list(e.instants)[-1]]
                static = sum(v for c, v in last.items() if c not in ("activations", "temporaries", "kv_cache"))
                row.update(estimated_bytes=predicted, error=predicted / measured - 1, static_bytes=static,
                           notes="; ".join(e.notes))
        rows.append(row)
    return pd.DataFrame(rows)
