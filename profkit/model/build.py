"""What a method does to a model, decided once (``plan``) and followed by both builds: the real one
(``build_model``, weights loaded on the device) and the one on the meta device for the estimate
(``meta_model``: shapes and dtypes, no memory). Also which device a run uses and why a method cannot run there.

Imports transformers and peft; bitsandbytes, DeepSpeed and flash-attn only where a method needs them, since
they are optional and their import failing is a reason to report, not a crash.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.nn.utils import parametrize
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig, PreTrainedTokenizerFast
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING
from transformers.quantizers.base import get_keys_to_not_convert
from transformers.quantizers.quantizers_utils import should_convert_module

from profkit.core.bundled import bundled, cache_dir
from profkit.core.methods import ALL_LINEAR, Method, UnsupportedError, parse_version
from profkit.core.presets import get_preset
from profkit.core.quiet import library_output
from profkit.core.settings import RunSettings
from profkit.model.distributed import backend_missing
from profkit.model.legacy_buffers import add_legacy_buffers

with library_output():  # peft imports bitsandbytes, whose kernel loaders announce themselves on stderr at import
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT_DEFAULT_TARGETS

# --------------------------------------------------------------------------- device

def resolve_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"unknown device {requested!r}; valid: auto, cpu, cuda")
    return requested


def unsupported_reason(method: Method, device: str) -> str | None:
    """Why ``method`` cannot run on ``device`` with the installed libraries, or None if it can."""
    if device == "cuda" and not torch.cuda.is_available():
        return "CUDA was requested but torch.cuda.is_available() is False (no GPU or a CPU-only torch build)"
    if method.quantization == "nf4":
        try:
            import bitsandbytes  # noqa: F401  optional: its failing import is the reason reported
        except Exception as exc:  # bitsandbytes raises assorted errors when its native library is missing
            return f"NF4 quantization needs bitsandbytes, which failed to import: {exc}"
    if method.zero_stage:
        try:
            import deepspeed  # noqa: F401  optional: its failing import is the reason reported
        except Exception as exc:
            return f"ZeRO-{method.zero_stage} needs DeepSpeed, which failed to import: {exc}"
    if method.sharded:
        missing = backend_missing(device)
        if missing:
            return f"{'FSDP' if method.fsdp else f'ZeRO-{method.zero_stage}'} needs {missing}"
    return None


def half_dtype(device: str) -> torch.dtype:
    """Storage dtype of frozen weights and of inference: bf16 on GPUs that have it, fp16 on older ones,
    fp32 on CPU (CPU half-precision matmuls are emulated and would distort the time breakdown)."""
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


# --------------------------------------------------------------------------- model

def tokenizer_for(settings: RunSettings):
    if settings.model_path:
        tok = AutoTokenizer.from_pretrained(settings.model_path, local_files_only=True)
    else:
        tok = PreTrainedTokenizerFast(tokenizer_file=str(bundled("tokenizer.json")), bos_token="<|bos|>",
                                      eos_token="<|eos|>", pad_token="<|pad|>")
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def materialize_preset(name: str) -> Path:
    """A local checkpoint with the preset's random weights (seed 0), built once and cached.

    Every method then loads through the same ``from_pretrained`` path as a user's own checkpoint, so
    quantized loading (which transformers only offers at load time) works for presets too.
    """
    preset = get_preset(name)
    digest = hashlib.sha256(json.dumps(preset.config, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{name}-{digest}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        config = AutoConfig.for_model(**preset.config)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if preset.name == "llama-3.2-3b" else torch.float32)
        model.save_pretrained(tmp)
        tokenizer_for(RunSettings(method="", preset=name)).save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:  # another process materialized it first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def model_config(settings: RunSettings):
    """The Hugging Face config of the model a run would load (a local path's, or the preset's); no weights."""
    if settings.model_path:
        return AutoConfig.from_pretrained(settings.model_path, local_files_only=True)
    return AutoConfig.for_model(**get_preset(settings.preset).config)


@dataclass(frozen=True)
class ModelPlan:
    """What a method does to a model on a device. ``plan`` is the one place that decides it; the real build
    (``build_model``) and the meta-device build for the estimate (``meta_model``) both follow it."""

    precision: str  # the effective precision (auto resolved)
    load_dtype: torch.dtype  # weights that are not quantized, as loaded
    autocast: torch.dtype | None  # the forward's autocast dtype; None: none
    quantization: Any  # transformers' BitsAndBytesConfig, or None
    kbit_prep: bool  # peft's prepare_model_for_kbit_training (QLoRA's casts of the unquantized weights); without
    # it (--no-kbit-upcast) the base is frozen by peft's LoRA and checkpointing is enabled as for any method
    gradient_checkpointing: bool
    lora: Any  # peft's LoraConfig, or None
    lora_dtype_follows_base: bool  # bf16-pure: the adapters in bf16 too (peft keeps them fp32 otherwise)
    attn_implementation: str  # what transformers builds the attention with
    fsdp_param_dtype: torch.dtype | None = None  # FSDP's mixed precision: the gathered parameters' dtype
    notes: tuple[str, ...] = ()

    @property
    def mixed_dtype(self) -> torch.dtype | None:
        """The half dtype of a mixed or amp precision (what the Trainer's bf16/fp16 flags say), whoever applies it:
        autocast, FSDP's policy or DeepSpeed's engine."""
        if not self.precision.endswith(("-mixed", "-amp")):
            return None
        return torch.bfloat16 if self.precision.startswith("bf16") else torch.float16


LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")  # the names configs give it


def shrunk_default_config(model_type: str, layers: int = 2):
    """A model type's default configuration with ``layers`` layers: every architecture transformers knows, small
    enough to build on the meta device in a sweep. Raises what transformers raises where its own default is invalid."""
    config = AutoConfig.for_model(model_type)
    for key in LAYER_COUNTS:
        if isinstance(getattr(config, key, None), int):
            try:
                setattr(config, key, layers)
            except (AttributeError, ValueError, TypeError):  # a config that derives it from per-layer lists
                pass
    return config


def plan(method: Method, device: str, half: torch.dtype | None = None, engine: str = "loop") -> ModelPlan:
    """``half``: the device's half precision (default: what this machine's ``device`` supports; the estimator
    passes bf16 for a CUDA target it does not have). ``engine``: profkit's loop or the Trainer, which differ in
    one thing here, FSDP's mixed precision."""
    half = half or half_dtype(device)
    notes: list[str] = []
    precision = method.precision
    if precision == "auto":
        precision = "fp32" if device == "cpu" else ("bf16-mixed" if half == torch.bfloat16 else "fp16-mixed")
    half = {"bf16-mixed": torch.bfloat16, "bf16-amp": torch.bfloat16, "bf16-pure": torch.bfloat16,
            "fp16-mixed": torch.float16, "fp16-amp": torch.float16}.get(precision, torch.float32)
    if method.kind == "infer":
        load = half
    elif precision in ("fp32", "bf16-amp", "fp16-amp") or (precision.endswith("-mixed") and method.adapter == "none"):
        load = torch.float32  # trainable full fine-tuning weights stay fp32 under mixed precision; amp: all weights
    else:
        load = half  # frozen bases in half precision; bf16-pure: everything
    autocast = half if precision.endswith(("-mixed", "-amp")) else None
    if method.zero_stage and method.kind == "train" and precision.endswith("-mixed") and engine != "loop":
        # DeepSpeed's own half-precision engine, as the Trainer's "auto" config and DeepSpeed's documented configs
        # enable it (bf16/fp16 "enabled"): the engine casts the module's parameters to half precision and runs no
        # autocast; the fp32 master copy is its ZeRO optimizer's. profkit's loop runs autocast inside the engine.
        load, autocast = half, None
        notes.append(f"ZeRO with {precision} outside profkit's loop: DeepSpeed's {precision[:4]} engine, which casts "
                     "the parameters to half precision and keeps the fp32 master copy in its ZeRO optimizer")
    fsdp_param_dtype = None
    if method.fsdp and autocast is not None:
        # FSDP's policy casts what it gathers. profkit's loop (torchtitan's way) runs no autocast beside it; the
        # Trainer does: accelerate turns autocast on for bf16 under FSDP too (not under DeepSpeed), and autocast's
        # float32 ops (norms, softmax) then run in fp32 on the gathered bf16 weights.
        fsdp_param_dtype = autocast
        autocast = autocast if engine == "trainer" else None
    quant = None
    if method.quantization:
        compute = half if half != torch.float32 else torch.float32
        # FSDP: the 4-bit weights packed into the frozen weights' dtype (QLoRA's FSDP recipe), so the mixed
        # precision policy's cast of what it gathers leaves the packed values alone.
        storage = {"bnb_4bit_quant_storage": load} if method.fsdp else {}
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=method.quantization,
                                   bnb_4bit_use_double_quant=method.double_quant, bnb_4bit_compute_dtype=compute,
                                   **storage)
    lora = None
    if method.adapter == "lora":
        targets = ALL_LINEAR if method.lora_targets == (ALL_LINEAR,) else list(method.lora_targets)
        lora = LoraConfig(r=method.lora_r, lora_alpha=method.lora_alpha, lora_dropout=method.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM")
    attention = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}[method.attention]
    if method.attention == "flash" and device == "cpu":
        attention = "sdpa"
        notes.append("--attention flash on CPU: flash-attention 2 is CUDA-only; sdpa runs, which on CPU picks "
                     "PyTorch's own flash kernel for CPU")
    return ModelPlan(precision, load, autocast, quant,
                     bool(method.quantization) and method.kind == "train" and method.kbit_upcast,
                     method.gradient_checkpointing and method.kind == "train", lora, precision == "bf16-pure",
                     attention, fsdp_param_dtype, tuple(notes))


def make_optimizer(method: Method, params: list):
    """The method's optimizer over ``params``."""
    if method.optimizer == "sgd":
        return torch.optim.SGD(params, lr=method.learning_rate)  # no momentum: no state
    if method.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        import bitsandbytes as bnb  # optional: the 8-bit optimizers only

        cls = bnb.optim.PagedAdamW8bit if method.optimizer == "paged-adamw-8bit" else bnb.optim.AdamW8bit
        return cls(params, lr=method.learning_rate)
    return torch.optim.AdamW(params, lr=method.learning_rate)


def build_model(method: Method, settings: RunSettings, device: str):
    """Load the model as ``plan`` prescribes: dtype, 4-bit, k-bit preparation, LoRA, checkpointing (which
    the Trainer engine leaves to ``TrainingArguments``, as its users do)."""
    p = plan(method, device)
    path = settings.model_path or materialize_preset(settings.preset)
    attention, _ = attention_for(model_config(settings), p.attn_implementation)
    kwargs: dict[str, Any] = {"dtype": p.load_dtype, "device_map": {"": device}, "attn_implementation": attention}
    if p.quantization is not None:
        kwargs["quantization_config"] = p.quantization
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)
    if p.quantization is not None and method.quantize_experts:
        _quantize_experts(model, method)
    if settings.seq_len:
        new = (settings.max_new_tokens or 1) - 1 if method.kind == "infer" else 0  # the last token is never fed
        check_sequence(model, settings.seq_len + new)

    if method.kind == "infer":
        model.eval()
        model.requires_grad_(False)  # serving holds no trainable weights
        _check_cpu_4bit_inference(model, device)
        return model

    model.config.use_cache = False
    if p.kbit_prep:
        # Casts the remaining non-quantized weights (norms, embeddings) to fp32, as QLoRA users get it.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if p.gradient_checkpointing and settings.engine != "trainer":
        # Non-reentrant checkpointing needs no input that requires grad, so it works with frozen embeddings.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if p.lora is not None:
        model = with_lora(model, p)
    model.train()
    return model


MODEL_CODE = ("transformers", "peft")  # where a model's own code lives


def model_code_refusal(exc: BaseException) -> str | None:
    """What to tell the user when the model's own code refused a config (a default it leaves unset, inputs it needs
    besides tokens): the exception and the innermost transformers or peft frame it passed. None when no such frame
    is on the way, so profkit's own bugs keep their traceback."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        parts = Path(frame.filename).parts
        for i, part in enumerate(parts):
            if part in MODEL_CODE and {"site-packages", "dist-packages"} & set(parts[:i]):
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                return (f"the model's code cannot build or run this config ({type(exc).__name__} in "
                        f"{'/'.join(parts[i:])}:{frame.lineno}: {first})")
    return None


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """transformers' decoder layers: the units gradient checkpointing wraps, and FSDP."""
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def attention_for(config, requested: str) -> tuple[str, str | None]:
    """The attention transformers will build for ``config``: the one requested, or eager where the architecture
    offers no sdpa (Gemma 2's soft-capping, for one), with a note saying so."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    if requested == "sdpa" and model_class is not None and not model_class._supports_sdpa:
        return "eager", (f"{model_class.__name__} has no sdpa attention in transformers; it runs eager attention, "
                         "which keeps each layer's full attention matrix for backward")
    return requested, None


def position_limit(model) -> int | None:
    """The most tokens a model with learned absolute positions takes: the rows of its position table (OPT's has
    two more, its offset). None for rotary and ALiBi models, which run past the length they were trained to."""
    limit = getattr(model.config, "max_position_embeddings", None)
    tokens = model.get_input_embeddings()
    if not isinstance(limit, int):
        return None
    for m in model.modules():
        if isinstance(m, torch.nn.Embedding) and m is not tokens and limit <= m.num_embeddings <= limit + 2:
            return limit
    return None


def sequence_limit(config) -> int | None:
    """``position_limit`` of the model ``config`` describes, built on the meta device."""
    with torch.device("meta"), library_output():
        return position_limit(AutoModelForCausalLM.from_config(config))


def check_sequence(model, tokens: int) -> None:
    """A sequence past a learned position table fails on the GPU (an index out of range) and runs on the meta
    device, which checks no index: refused here, before either."""
    limit = position_limit(model)
    if limit is not None and tokens > limit:
        raise UnsupportedError(f"{tokens} tokens: {type(model).__name__} learns one embedding per position and has "
                               f"{limit}, so a sequence can hold at most {limit} tokens (when generating, the "
                               "prompt and every new token but the last)")


def with_lora(model, p: ModelPlan):
    """peft's LoRA on ``model``, after checking that the targets exist in it (peft's own error names neither the
    model's layers nor what would fit)."""
    targets = p.lora.target_modules
    if targets != ALL_LINEAR:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
        if not set(targets) & set(linear):
            model_type = model.config.model_type
            default = PEFT_DEFAULT_TARGETS.get(model_type)
            raise UnsupportedError(
                f"LoRA targets {','.join(sorted(targets))}: none is a Linear layer of {type(model).__name__}, whose "
                f"Linear layers are {','.join(linear)}; choose with --lora-targets"
                + (f" (peft's default for {model_type}: {','.join(default)})" if default else ""))
    return get_peft_model(model, p.lora, autocast_adapter_dtype=not p.lora_dtype_follows_base)


class _MetaNF4Linear(torch.nn.Linear):
    """Stands in for bitsandbytes' ``Linear4bit`` on the meta device, where bitsandbytes cannot quantize:
    the same frozen weight and the same dtype round trip (input cast to the compute dtype, output cast
    back), so autograd saves what it saves for the real layer. Storage is counted by the estimator."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


class _MatMulKeepingInput(torch.autograd.Function):
    """bitsandbytes' MatMul4Bit before 0.43.2: saves its input beside the weight, though its backward reads the
    weight alone (the input's gradient needs no input)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        _, weight = ctx.saved_tensors
        return grad @ weight, None, None


class _MetaNF4LinearKeepingInput(_MetaNF4Linear):
    """``_MetaNF4Linear`` as bitsandbytes before 0.43.2 ran it (--bnb-keeps-inputs). ``kept_input``: what its
    autograd context holds after the latest forward, which outlives backward while the graph does."""

    kept_input: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.kept_input = x.to(self.weight.dtype)
        return _MatMulKeepingInput.apply(self.kept_input, self.weight, self.bias).to(x.dtype)


def fused_experts(model: torch.nn.Module, skip: set[int] = frozenset()) -> list[tuple[torch.nn.Module, str]]:
    """Each mixture-of-experts layer's fused expert tensors (transformers 5 keeps them as one 3-D parameter per
    projection, which bitsandbytes' Linear replacement skips), as (module, parameter name); ``skip``: ids already
    quantized."""
    return [(module, name) for module in model.modules() for name, prm in module.named_parameters(recurse=False)
            if prm.dim() >= 3 and prm.is_floating_point() and id(prm) not in skip]


class _MetaDequantize(torch.nn.Module):
    """Stands in for bitsandbytes' ``Bnb4bitParametrization`` on the meta device: each access of the parameter
    returns a fresh tensor of its shape and dtype, as dequantizing the 4-bit storage does."""

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        return original.clone()


def _quantize_experts(model: torch.nn.Module, method: Method) -> None:
    """``--quantize-experts`` on a loaded 4-bit model: bitsandbytes' parametrization of each fused expert tensor
    (what axolotl's ``quantize_moe_experts`` applies), its block scales quantized too with ``double_quant``."""
    from bitsandbytes.nn.parametrize import replace_parameter_4bit  # optional: 4-bit methods only

    for module, name in fused_experts(model):
        replace_parameter_4bit(module, name, compress_statistics=method.double_quant, quant_type=method.quantization)


def meta_model(method: Method, config, device: str, half: torch.dtype | None = None,
               engine: str = "loop") -> tuple[Any, set[str], ModelPlan]:
    """The model ``build_model`` would build, following the same ``plan``, on the meta device (shapes and dtypes,
    no memory), and the names of the parameters that would be stored in 4 bits. Used by the estimator; no
    weights needed."""
    p = plan(method, device, half, engine)
    if method.bnb_keeps_inputs and method.gradient_checkpointing:
        # The input is kept on the autograd context, past checkpointing's hooks: under non-reentrant checkpointing
        # every layer's 4-bit inputs outlive the forward, under reentrant none is kept until the recompute.
        raise UnsupportedError("--bnb-keeps-inputs with gradient checkpointing is not modelled: what it keeps depends "
                               "on whether checkpointing is reentrant")
    attention = "sdpa" if p.attn_implementation == "flash_attention_2" else p.attn_implementation  # same saves
    attention, note = attention_for(config, attention)
    if note:
        p = replace(p, notes=(*p.notes, note))
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=p.load_dtype, attn_implementation=attention)
    # transformers' own checks of a configuration (a pad token beyond the vocabulary, an unknown architecture)
    except (ValueError, AssertionError, KeyError, TypeError) as exc:
        raise UnsupportedError(f"transformers cannot build {type(config).__name__.removesuffix('Config')} from this "
                               f"configuration ({type(exc).__name__}: {str(exc).strip().splitlines()[0]})") from None
    if method.buffers_of:
        # what that version built in every layer: non-persistent buffers in the dtype the model was built in
        said = add_legacy_buffers(model, decoder_layers(model), config, parse_version(method.buffers_of),
                                  p.load_dtype or torch.float32)
        p = replace(p, notes=(*p.notes, f"--buffers-of {method.buffers_of}: " + (
            "; ".join(said) + " on the device beside the weights, as that transformers built them" if said else
            f"that transformers built no buffer for {type(config).__name__.removesuffix('Config')} that the "
            "installed one does not")))
    quantized_ids: set[int] = set()
    if p.quantization is not None:
        # transformers' own rule for which Linear layers bitsandbytes replaces.
        keep = get_keys_to_not_convert(model)
        stand_in = _MetaNF4LinearKeepingInput if method.bnb_keeps_inputs else _MetaNF4Linear
        head = model.get_output_embeddings()
        if method.quantize_head and head is not None and head.weight is model.get_input_embeddings().weight:
            # a converter of every Linear layer gives the head a 4-bit weight of its own; the embeddings stay
            head.weight = torch.nn.Parameter(torch.empty_like(head.weight), requires_grad=False)
        for name, module in list(model.named_modules()):
            if type(module) is torch.nn.Linear and (should_convert_module(name, keep) or
                                                    (method.quantize_head and module is head)):
                module.__class__ = stand_in
                quantized_ids.add(id(module.weight))
        if not quantized_ids:
            p = replace(p, notes=(*p.notes, f"{type(model).__name__}: transformers quantizes no layer of it (it "
                                  "replaces torch.nn.Linear itself, not subclasses): the weights stay 16-bit"))
    if p.quantization is not None:
        experts = fused_experts(model, quantized_ids)
        count = sum(getattr(module, name).numel() for module, name in experts)
        if experts and method.quantize_experts:
            for module, name in experts:
                parametrize.register_parametrization(module, name, _MetaDequantize(), unsafe=True)
                quantized_ids.add(id(module.parametrizations[name].original))
            p = replace(p, notes=(*p.notes, f"--quantize-experts: {count:,} expert weights (3-D tensors, one per "
                                  "MoE projection) in 4 bits through bitsandbytes' parametrization; each use "
                                  "dequantizes a layer's experts whole into their dtype"))
        elif experts:
            stays = "fp32 after peft's k-bit preparation" if p.kbit_prep else "in the model dtype"
            p = replace(p, notes=(*p.notes, f"{count:,} expert weights (3-D tensors, one per MoE layer) are not "
                                  f"quantized: bitsandbytes replaces Linear layers only; they stay {stays} "
                                  "(--quantize-experts: in 4 bits too, as axolotl's quantize_moe_experts does)"))
        elif method.quantize_experts:
            p = replace(p, notes=(*p.notes, "--quantize-experts: this model has no fused expert tensors; nothing "
                                  "more is quantized"))
    if p.kbit_prep:
        # What peft's prepare_model_for_kbit_training does to the weights that stay unquantized.
        for prm in model.parameters():
            prm.requires_grad_(False)
            if id(prm) not in quantized_ids and prm.dtype in (torch.float16, torch.bfloat16):
                prm.data = prm.data.float()
    model.config.use_cache = False
    if method.kind == "infer":
        model.requires_grad_(False)
        model.eval()
    elif p.lora is not None:
        model = with_lora(model, p)
    if method.kind == "train":
        model.train()
    return model, {n for n, prm in model.named_parameters() if id(prm) in quantized_ids}, p


def _check_cpu_4bit_inference(model, device: str) -> None:
    """bitsandbytes' CPU inference path (taken on CPUs with AVX512-BF16) repacks 4-bit weights in blocks of
    32 output features and asserts deep inside generate(); say so before running instead."""
    if device != "cpu":
        return
    block = 32
    for name, module in model.named_modules():
        if getattr(module, "support_avx512bf16_for_cpu", False) and module.out_features % block:
            raise UnsupportedError(
                f"bitsandbytes' CPU 4-bit inference kernel needs every quantized layer's output size to be a "
                f"multiple of {block}; {name} has {module.out_features}")



# Settings that describe another stack than the one installed: the estimate models them, a recording cannot.
ESTIMATED_ONLY = (
    ("quantize_head", "--quantize-head", "Lightning's bitsandbytes plugin, which converts the LM head too",
     "profkit quantizes as transformers does"),
    ("keeps_previous_logits", "--keeps-previous-logits", "another training loop (litgpt's)",
     "profkit's loop drops the previous step's logits"),
    ("bnb_keeps_inputs", "--bnb-keeps-inputs", "bitsandbytes before 0.43.2",
     "the installed bitsandbytes frees each 4-bit layer's input"),
    ("keeps_kv_cache", "--keeps-kv-cache", "a training forward that builds transformers' KV cache under "
     "checkpointing (llama-recipes' wrapper; GPTBigCode before transformers 4.53)",
     "profkit trains with the cache off"),
    ("fsdp_flat", "--fsdp-flat", "FSDP1's flat parameters (FullyShardedDataParallel, use_orig_params)",
     "profkit runs FSDP2 (fully_shard)"),
    ("buffers_of", "--buffers-of", "the buffers an older transformers built in every layer",
     "the installed transformers builds its own"),
)


def setting_unsupported(method: Method, device: str) -> str | None:
    """Why a command-line setting cannot run here, checked before any training."""
    if method.kind == "infer" and (method.prefill_logits != "last" or method.kv_cache != "dynamic"):
        return ("--prefill-logits and --kv-cache describe how transformers before 4.45 and 4.36 ran generate(); the "
                "installed transformers runs it one way, so these settings are estimated (profkit estimate), not "
                "recorded")
    for field, flag, describes, installed in ESTIMATED_ONLY:
        if getattr(method, field):
            return (f"{flag} describes {describes}; {installed}, so this setting is estimated (profkit estimate), "
                    "not recorded")
    if method.offload != "none" and device == "cpu":
        return "--offload moves state from the GPU to host memory; on CPU everything is in host memory already"
    if method.attention == "flash" and device == "cuda":
        try:
            import flash_attn  # noqa: F401  optional: its failing import is the reason reported
        except Exception as exc:
            return f"--attention flash needs the flash-attn package, which failed to import: {exc}"
    if method.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        try:
            import bitsandbytes as bnb  # optional: the 8-bit optimizers only
            probe = torch.nn.Parameter(torch.zeros(4096, device=device))
            opt = make_optimizer(method, [probe])
            probe.grad = torch.ones_like(probe)
            opt.step()  # bitsandbytes' 8-bit optimizers need a kernel for this device: try one step
        except Exception as exc:
            return (f"--optimizer {method.optimizer}: bitsandbytes {getattr(bnb, '__version__', '?')} cannot step "
                    f"it on {device} ({type(exc).__name__}: {str(exc)[:200]})")
    return None
