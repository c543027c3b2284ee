"""The method registry: every fine-tuning and inference method is data.

A method is a frozen dataclass; variants are derived with ``dataclasses.replace``
and registered in exactly one place (``METHODS``). This module imports no torch,
so listing and validating methods is instant and works anywhere.
"""

from __future__ import annotations

import re

from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Literal

from profkit.core.options import CommandOption

QUANT_TYPES = ("nf4", "fp4")
PRECISIONS = ("auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16-amp", "fp16-amp", "bf16-pure")
OPTIMIZERS = ("adamw", "adamw-8bit", "paged-adamw-8bit", "sgd")
ATTENTIONS = ("sdpa", "flash", "eager")
OFFLOADS = ("none", "optimizer", "optimizer+params")
LOSSES = ("fp32", "fp32-shifted", "logits-dtype", "chunked", "sum")  # profkit.model.loss says what each computes
# generate() as transformers versions run it (profkit.predict.estimate says what each holds)
PREFILL_LOGITS = ("last", "all", "all-fp32")
KV_CACHES = ("dynamic", "tuples")
GRAD_SYNCS = ("each", "last")
ALL_LINEAR = "all-linear"  # peft's name for every linear layer but the output head


@dataclass(frozen=True)
class Method:
    name: str
    kind: Literal["train", "infer"]
    description: str
    adapter: Literal["none", "lora"] = "none"
    # Storage format of the frozen base weights: None keeps the model dtype; "nf4" or "fp4" is bitsandbytes 4-bit.
    quantization: Literal["nf4", "fp4"] | None = None
    gradient_checkpointing: bool = False
    zero_stage: Literal[0, 2, 3] = 0
    # PyTorch FSDP2 (``fully_shard``), one unit per decoder layer and one for the rest, as torchtune and accelerate
    # wrap; with a mixed precision the policy casts the gathered parameters (torchtitan's), not autocast.
    fsdp: bool = False
    reshard_after_forward: bool = True  # FSDP: free each layer's gathered parameters after its forward
    learning_rate: float = 2e-5
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.05
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    double_quant: bool = True  # 4-bit: quantize the block scales too (QLoRA's setting)
    # 4-bit training: peft's k-bit preparation casts the unquantized weights (embeddings, norms, head) to fp32, which
    # makes the residual stream fp32; some stacks (fms-acceleration's) prepare without that cast.
    kbit_upcast: bool = True
    # bitsandbytes before 0.43.2 kept each 4-bit layer's input for backward (MatMul4Bit's ctx.tensors), which its
    # backward never reads (bitsandbytes#1270): activations a 16-bit frozen layer does not hold. Estimated only.
    bnb_keeps_inputs: bool = False
    # The loop keeps the previous step's logits (and the autograd graph behind them) until the next forward returns,
    # as litgpt's does: at the forward's end both steps' logits are alive, and under --bnb-keeps-inputs that graph
    # still holds the previous step's 4-bit layer inputs; the step's own logits are alive through its backward.
    # profkit's loop and the Trainer drop them. Estimated only.
    keeps_previous_logits: bool = False
    # The forward builds transformers' KV cache (use_cache left on while checkpointing is applied outside the model:
    # FSDP's or torch's checkpoint wrapper, which transformers cannot see), so the outputs hold every layer's keys
    # and values, which checkpointing would otherwise have dropped: from each layer's forward until the loop
    # releases the outputs (after the forward; after the next one with --keeps-previous-logits). llama-recipes did
    # (2023). Estimated only.
    keeps_kv_cache: bool = False
    # The LM head stored in 4 bits too, quantized from fp16: Lightning's bitsandbytes plugin (so litgpt) converts every
    # Linear layer that way, where transformers keeps the head in 16 bits. Estimated only.
    quantize_head: bool = False
    # transformers 5 keeps a MoE layer's experts as one 3-D tensor each, which bitsandbytes' Linear replacement skips;
    # bitsandbytes' parametrization quantizes them too (axolotl's quantize_moe_experts), and each use dequantizes a
    # layer's experts whole into their dtype.
    quantize_experts: bool = False
    # auto: bf16 autocast over fp32 trainable weights on GPUs (fp16 where bf16 is missing), fp32 on CPU.
    # -amp: the same autocast over weights all in fp32, a frozen base too (a model loaded without a dtype).
    precision: Literal["auto", "fp32", "bf16-mixed", "fp16-mixed", "bf16-amp", "fp16-amp", "bf16-pure"] = "auto"
    optimizer: Literal["adamw", "adamw-8bit", "paged-adamw-8bit", "sgd"] = "adamw"
    attention: Literal["sdpa", "flash", "eager"] = "sdpa"
    # To host memory: ZeRO-Offload's optimizer (+ params) or FSDP's CPUOffloadPolicy (params, gradients and step).
    offload: Literal["none", "optimizer", "optimizer+params"] = "none"
    # The causal-LM loss as transformers 5 computes it, or as transformers 4 did (profkit.model.loss).
    loss: Literal["fp32", "fp32-shifted", "logits-dtype", "chunked", "sum"] = "fp32"
    # generate(): the prompt pass computes logits at the last position only (transformers >= 4.45), or at every
    # position (before; Llama-family models also upcast them to fp32 in their forward: all-fp32); the KV cache is
    # updated in place layer by layer (>= 4.36), or each pass returns new tuples while the previous pass's live.
    prefill_logits: Literal["last", "all", "all-fp32"] = "last"
    kv_cache: Literal["dynamic", "tuples"] = "dynamic"
    # Micro-batches whose gradients are summed before each optimizer step: from the second on, the gradients
    # (ZeRO's and FSDP's reduced partitions) are alive through forward and backward.
    grad_accum: int = 1
    # FSDP under accumulation: each micro-batch's gradients reduce-scattered into the shards (torchtitan's and
    # torchtune's loops), or held unsharded until the last one's backward (no_sync, set_requires_gradient_sync(False):
    # accelerate's accumulate(), so the Trainer's, and Lightning's).
    grad_sync: Literal["each", "last"] = "each"
    # FSDP1 (FullyShardedDataParallel, use_orig_params=True) flattens each unit's parameters into one tensor: a unit
    # with any trainable parameter holds a gradient for all of them, its frozen weights too (LoRA inside every
    # decoder layer: gradients as large as the layers). Estimated, not recorded: profkit runs FSDP2.
    fsdp_flat: bool = False
    # The transformers version a run used, where its models built buffers the installed one does not (rotary tables
    # in every attention layer, causal-mask tables: profkit.model.legacy_buffers); "" for the installed. Estimated
    # only.
    buffers_of: str = ""
    variant: str = ""  # what the command line changed, as it appears in run names ("r16-all-linear")

    def settings(self) -> dict:
        """The method's settings as a JSON-ready dict (for manifests and tables)."""
        out = asdict(self)
        out["lora_targets"] = list(self.lora_targets)
        if self.adapter != "lora":
            for key in ("lora_r", "lora_alpha", "lora_dropout", "lora_targets"):
                out.pop(key)
        if not self.quantization:
            out.pop("double_quant")
        if not self.quantization or self.kind != "train":
            out.pop("kbit_upcast")
            out.pop("bnb_keeps_inputs")
        if not self.quantization:
            out.pop("quantize_head")
            out.pop("quantize_experts")
        if not self.sharded:
            out.pop("offload")
        if not self.fsdp:
            out.pop("reshard_after_forward")
            out.pop("grad_sync")
            out.pop("fsdp_flat")
        if self.kind == "infer":
            for key in ("learning_rate", "gradient_checkpointing", "zero_stage", "optimizer", "offload", "fsdp",
                        "loss", "grad_accum", "grad_sync", "fsdp_flat", "keeps_previous_logits", "keeps_kv_cache"):
                out.pop(key, None)
        else:
            out.pop("prefill_logits")
            out.pop("kv_cache")
        if not self.buffers_of:
            out.pop("buffers_of")
        if not self.variant:
            out.pop("variant")
        return out

    @property
    def sharded(self) -> bool:
        """Whether the method shares its state across ranks (ZeRO or FSDP), so that ``--nproc`` means something."""
        return bool(self.zero_stage) or self.fsdp

    @property
    def label(self) -> str:
        """The method with its command-line changes: ``lora``, ``lora-r16-all-linear``."""
        return f"{self.name}-{self.variant}" if self.variant else self.name


class UnsupportedError(RuntimeError):
    """A method that a library cannot run on this device; raised before any training."""


class OverrideError(ValueError):
    """A setting that makes no sense for the method (a LoRA rank for ``full``): the message says why."""


@dataclass(frozen=True)
class Setting:
    """A method setting the command line can change (``--lora-rank 16``): which ``Method`` field it sets, which
    methods it makes sense for, and how its value appears in a run's name."""

    field: str
    applies: Literal["lora", "quantized", "train", "infer", "sharded", "fsdp", "any"]
    label: Callable[[Any], str]
    option: CommandOption


PANEL = "Method settings (default: the registry's; `profkit methods`)"


# What a stack does (a library version's or a loop's behaviour): derived from the stack (profkit.predict.mechanisms),
# so not in --help; an expert can still force one.
STACK_MECHANISMS = ("kbit_upcast", "bnb_keeps_inputs", "quantize_head", "quantize_experts", "keeps_previous_logits",
                    "keeps_kv_cache", "loss", "grad_sync", "fsdp_flat", "prefill_logits", "kv_cache", "buffers_of")


def _setting(field_name: str, applies: str, label: Callable[[Any], str], flag: str, help: str, type_: type,
             choices: tuple[str, ...] = (), minimum: float | None = None, maximum: float | None = None) -> Setting:
    hidden = field_name in STACK_MECHANISMS
    return Setting(field_name, applies, label,
                   CommandOption(flag, help, type_, minimum, maximum, choices, PANEL, hidden=hidden))


# Keyed by the command line's name (--lora-rank: lora_rank), in the order a run's name lists them.
SETTINGS: dict[str, Setting] = {
    "lora_rank": _setting("lora_r", "lora", lambda v: f"r{v}", "--lora-rank", "LoRA rank r.", int, minimum=1),
    "lora_alpha": _setting("lora_alpha", "lora", lambda v: f"alpha{v}", "--lora-alpha",
                           "LoRA alpha (scaling = alpha / r).", int, minimum=1),
    "lora_dropout": _setting("lora_dropout", "lora", lambda v: f"dropout{v:g}", "--lora-dropout",
                             "LoRA dropout probability.", float, minimum=0.0, maximum=0.99),
    "lora_targets": _setting("lora_targets", "lora", "+".join, "--lora-targets",
                             f"Comma list of module names (q_proj,v_proj), or {ALL_LINEAR}.", str),
    "quant_type": _setting("quantization", "quantized", str, "--quant-type",
                           f"4-bit format: {', '.join(QUANT_TYPES)}.", str, QUANT_TYPES),
    "double_quant": _setting("double_quant", "quantized", lambda v: "dq" if v else "no-dq", "--double-quant",
                             "4-bit: quantize the block scales too.", bool),
    "kbit_upcast": _setting("kbit_upcast", "quantized", lambda v: "upcast" if v else "no-upcast", "--kbit-upcast",
                            "4-bit training: cast the unquantized weights to fp32 (peft's "
                            "prepare_model_for_kbit_training), or keep them in the load dtype.", bool),
    "bnb_keeps_inputs": _setting("bnb_keeps_inputs", "quantized", lambda v: "bnb-keeps-inputs" if v else
                                 "bnb-frees-inputs", "--bnb-keeps-inputs", "4-bit training as bitsandbytes before "
                                 "0.43.2 ran it: each 4-bit layer keeps its input for a backward that never reads "
                                 "it. Estimated, not recorded (the installed bitsandbytes frees it).", bool),
    "quantize_head": _setting("quantize_head", "quantized", lambda v: "head-4bit" if v else "head-16bit",
                              "--quantize-head", "4-bit: the LM head in 4 bits too, quantized from fp16, as "
                              "Lightning's bitsandbytes plugin (litgpt) converts every Linear layer; each use "
                              "dequantizes it into fp16 and casts that to the compute dtype. Estimated, not "
                              "recorded.", bool),
    "quantize_experts": _setting("quantize_experts", "quantized", lambda v: "experts-4bit" if v else
                                 "experts-16bit", "--quantize-experts", "4-bit: a mixture of experts' fused expert "
                                 "tensors (3-D, which bitsandbytes' Linear replacement skips) in 4 bits too, through "
                                 "bitsandbytes' parametrization (axolotl's quantize_moe_experts); each use "
                                 "dequantizes a layer's experts whole.", bool),
    "keeps_previous_logits": _setting("keeps_previous_logits", "train", lambda v: "keeps-previous-logits" if v
                                      else "drops-previous-logits", "--keeps-previous-logits", "The training loop "
                                      "keeps each step's logits bound: through its backward, and with the graph "
                                      "behind them until the next forward returns (litgpt's). Estimated, not "
                                      "recorded.", bool),
    "keeps_kv_cache": _setting("keeps_kv_cache", "train", lambda v: "keeps-kv-cache" if v else "no-kv-cache",
                               "--keeps-kv-cache", "The forward builds transformers' KV cache (use_cache left on, "
                               "checkpointing applied outside the model: FSDP's or torch's checkpoint wrapper; or a "
                               "model that left it on under its own, GPTBigCode before transformers 4.53), so the "
                               "outputs hold every layer's keys and values, with the storage they are views of, "
                               "until the loop releases them (llama-recipes in 2023). Checkpointing methods "
                               "(..._gc). Estimated, not recorded.", bool),
    "precision": _setting("precision", "train", str, "--precision", f"{', '.join(PRECISIONS)} (mixed: autocast, "
                          "a frozen base loaded in half precision; amp: autocast over fp32 weights, the frozen base "
                          "too; pure: weights, gradients and optimizer state in bf16).", str, PRECISIONS),
    "optimizer": _setting("optimizer", "train", str, "--optimizer", f"{', '.join(OPTIMIZERS)}.", str, OPTIMIZERS),
    "attention": _setting("attention", "any", lambda v: f"attn-{v}", "--attention", f"{', '.join(ATTENTIONS)} "
                          "(what the model is built with; flash on CPU runs sdpa).", str, ATTENTIONS),
    "offload": _setting("offload", "sharded", lambda v: "offload-" + v.replace("+", "-"), "--offload",
                        f"To host memory: {', '.join(OFFLOADS)} (ZeRO-Offload; FSDP's CPU offload moves parameters, "
                        "gradients and the optimizer step together: optimizer+params).", str, OFFLOADS),
    "reshard_after_forward": _setting("reshard_after_forward", "fsdp", lambda v: "reshard" if v else "no-reshard",
                                      "--reshard-after-forward", "FSDP: free each layer's gathered parameters after "
                                      "its forward (gathered again for backward).", bool),
    "loss": _setting("loss", "train", lambda v: f"loss-{v}", "--loss", "The causal-LM loss: fp32 (transformers "
                     ">= 4.49: an fp32 copy of the logits), fp32-shifted (4.46-4.48: and a shifted copy of that), "
                     "logits-dtype (a model's own loss before 4.49, GPT-2 and GPTBigCode among them: a shifted copy "
                     "in the logits' dtype), chunked (a fused linear cross-entropy, Liger's or Cut Cross-Entropy: "
                     "the LM head and the loss a chunk of positions at a time, never the whole logits), sum (the "
                     "logits summed, a benchmark's stand-in for a loss: no copy of them).", str, LOSSES),
    "grad_accum": _setting("grad_accum", "train", lambda v: f"ga{v}", "--grad-accum", "Micro-batches of "
                           "--batch-size accumulated into each optimizer step (each step trains on their sum; "
                           "ZeRO and FSDP reduce every micro-batch's gradients into their shards).", int,
                           minimum=1),
    "grad_sync": _setting("grad_sync", "fsdp", lambda v: f"sync-{v}", "--grad-sync", "FSDP under --grad-accum: "
                          "each (every micro-batch's gradients reduce-scattered into the shards, as torchtitan and "
                          "torchtune accumulate) or last (held unsharded until the last micro-batch: no_sync, as "
                          "accelerate, so the Trainer, and Lightning accumulate).", str, GRAD_SYNCS),
    "fsdp_flat": _setting("fsdp_flat", "fsdp", lambda v: "flat" if v else "per-parameter", "--fsdp-flat",
                          "FSDP1's flat parameters (FullyShardedDataParallel with use_orig_params): a unit with a "
                          "trainable parameter holds gradients for all of its parameters, frozen ones too. Estimated, "
                          "not recorded (profkit runs FSDP2).", bool),
    "prefill_logits": _setting("prefill_logits", "infer", lambda v: f"logits-{v}", "--prefill-logits",
                               "generate()'s prompt pass: logits at the last position (transformers >= 4.45), or "
                               "at every position (all; all-fp32: upcast in the forward, as Llama-family models did "
                               "before 4.45). Estimated, not recorded.", str, PREFILL_LOGITS),
    "kv_cache": _setting("kv_cache", "infer", lambda v: f"cache-{v}", "--kv-cache", "generate()'s KV cache: "
                         "updated in place (dynamic, transformers >= 4.36), or new tuples each pass while the "
                         "previous pass's live (tuples, before). Estimated, not recorded.", str, KV_CACHES),
    "buffers_of": _setting("buffers_of", "any", lambda v: f"buffers-{v}" if v else "buffers-installed",
                           "--buffers-of", "The per-layer buffers of the transformers version the run used (4.40: "
                           "the rotary cos and sin tables over every position that Llama built in each layer before "
                           "4.41, Mistral before 4.42, Mixtral before 4.48, Qwen2, Phi, Falcon and GPT-NeoX before "
                           "4.45; GPT-2's, GPT-J's and GPT-NeoX's causal-mask tables). Estimated, not recorded.", str),
}

# A transformers version as --buffers-of takes it: 4.40, 4.40.2 or 4.35.0.dev0.
VERSION = re.compile(r"^\s*(\d+)\.(\d+)(?:\.\d+)?(?:\.?dev\d*|rc\d*)?\s*$")


def parse_version(text: str) -> tuple[int, int] | None:
    """``4.35.2``, ``4.35`` or ``4.35.0.dev0`` as (4, 35); None for anything else."""
    m = VERSION.match(text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def with_overrides(method: Method, **overrides) -> Method:
    """``method`` with the command line's settings (None: not given). Each must apply to the method and be a
    valid value; the result's ``variant`` names what differs from the registry, in a fixed order."""
    changes: dict = {}
    for option, value in overrides.items():
        if value is None:
            continue
        if option not in SETTINGS:
            raise OverrideError(f"unknown setting {option!r}; valid: {', '.join(SETTINGS)}")
        setting = SETTINGS[option]
        field_name, applies, flag = setting.field, setting.applies, setting.option.flag
        if setting.option.choices and value not in setting.option.choices:
            raise OverrideError(f"{flag} {value!r}: valid values are {', '.join(setting.option.choices)}")
        if applies == "lora" and method.adapter != "lora":
            raise OverrideError(f"{flag} applies to LoRA methods; {method.name} trains no adapter")
        if applies == "quantized" and not method.quantization:
            raise OverrideError(f"{flag} applies to 4-bit methods (qlora..., infer_int4); {method.name} keeps "
                                "its weights in the model dtype")
        if (applies == "train" or option in ("kbit_upcast", "bnb_keeps_inputs")) and method.kind != "train":
            raise OverrideError(f"{flag} applies to training methods; {method.name} is inference")
        if applies == "infer" and method.kind != "infer":
            raise OverrideError(f"{flag} applies to generation methods (infer_fp16, infer_int4); {method.name} "
                                "trains")
        if applies == "sharded" and not method.sharded:
            raise OverrideError(f"{flag} applies to sharded methods (ZeRO, FSDP); {method.name} shards nothing")
        if applies == "fsdp" and not method.fsdp:
            raise OverrideError(f"{flag} applies to FSDP methods; {method.name} does not use FSDP")
        if option == "lora_targets":
            value = tuple(t.strip() for t in (value.split(",") if isinstance(value, str) else value) if t.strip())
            if not value:
                raise OverrideError(f"{flag}: name at least one module (q_proj,v_proj) or {ALL_LINEAR}")
            if ALL_LINEAR in value and len(value) > 1:
                raise OverrideError(f"{flag}: {ALL_LINEAR} stands alone")
        low, high = setting.option.minimum, setting.option.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise OverrideError(f"{flag} {value}: outside " + (f"[{low:g}, {high:g}]" if high is not None
                                                               else f"[{low:g}, ...)"))
        if option == "offload" and value == "optimizer+params" and method.zero_stage == 2:
            raise OverrideError(f"{flag} optimizer+params: DeepSpeed offloads parameters with ZeRO-3 only; "
                                f"{method.name} is ZeRO-2")
        if option == "offload" and value == "optimizer" and method.fsdp:
            raise OverrideError(f"{flag} optimizer: FSDP's CPU offload moves the parameters' shards and gradients with "
                                "the optimizer state (its step runs on the host); use optimizer+params")
        if option == "buffers_of" and value and parse_version(value) is None:
            raise OverrideError(f"{flag} {value!r}: a transformers version (4.40, 4.40.2)")
        if option == "keeps_kv_cache" and value and not method.gradient_checkpointing:
            raise OverrideError(f"{flag} applies to checkpointing methods (..._gc): without checkpointing, attention "
                                f"saves those keys and values for backward anyway; {method.name} does not checkpoint")
        changes[field_name] = value
    changed = replace(method, **changes)
    if changed.grad_sync != "each" and changed.grad_accum == 1:
        raise OverrideError(f"--grad-sync {changed.grad_sync}: there is nothing to hold back without accumulation "
                            "(add --grad-accum 2 or more)")
    parts = [s.label(getattr(changed, s.field)) for s in SETTINGS.values()
             if getattr(changed, s.field) != getattr(method, s.field)]
    return replace(changed, variant="-".join(parts))


def full() -> Method:
    return Method("full", "train", "full fine-tuning, AdamW on every parameter")


def lora() -> Method:
    return Method("lora", "train", "LoRA adapters on attention projections, base frozen", adapter="lora", learning_rate=2e-4)


def qlora() -> Method:
    return replace(lora(), name="qlora", description="LoRA over an NF4-quantized frozen base (bitsandbytes)", quantization="nf4")


def with_gc(method: Method) -> Method:
    return replace(method, name=f"{method.name}_gc", gradient_checkpointing=True,
                   description=f"{method.description}; gradient checkpointing")


def with_zero(method: Method, stage: Literal[2, 3]) -> Method:
    base = method.name.removesuffix("_gc")
    name = f"{base}_zero{stage}" + ("_gc" if method.gradient_checkpointing else "")
    return replace(method, name=name, zero_stage=stage,
                   description=f"{method.description}; DeepSpeed ZeRO-{stage}")


def with_fsdp(method: Method) -> Method:
    base = method.name.removesuffix("_gc")
    return replace(method, name=f"{base}_fsdp" + ("_gc" if method.gradient_checkpointing else ""), fsdp=True,
                   description=f"{method.description}; PyTorch FSDP2 (fully_shard per decoder layer)")


def infer_fp16() -> Method:
    return Method("infer_fp16", "infer", "generate() in half precision (bf16/fp32 on CPU), batch 1 unless --batch-size")


def infer_int4() -> Method:
    return replace(infer_fp16(), name="infer_int4", quantization="nf4",
                   description="generate() with NF4-quantized weights (bitsandbytes), batch 1 unless --batch-size")


def _registry() -> dict[str, Method]:
    train = [full(), with_gc(full()), lora(), with_gc(lora()), qlora(), with_gc(qlora())]
    for base in (lora(), qlora(), full()):
        for stage in (2, 3):
            train += [with_zero(base, stage), with_zero(with_gc(base), stage)]
    for base in (full(), lora(), qlora()):
        train += [with_fsdp(base), with_fsdp(with_gc(base))]
    methods = train + [infer_fp16(), infer_int4()]
    return {m.name: m for m in methods}


METHODS: dict[str, Method] = _registry()


class UnknownMethodError(ValueError):
    def __init__(self, name: str):
        self.name = name
        super().__init__(f"unknown method {name!r}; valid methods: {', '.join(METHODS)}")


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UnknownMethodError(name) from None


def resolve(names: list[str], all_methods: bool = False) -> list[Method]:
    """Methods for a command line: every name validated before anything runs."""
    if all_methods:
        return list(METHODS.values())
    return [get_method(n) for n in dict.fromkeys(names)]
