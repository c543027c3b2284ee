"""The workload: model, data, optimizer and one step of each method.

The only module that imports transformers, peft, bitsandbytes and deepspeed. Everything
here is built from a ``RunSettings`` and a ``Method``; ``run(session)`` drives the session.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch.profiler import record_function

from profkit import labels
from profkit.methods import Method
from profkit.presets import get_preset
from profkit.settings import RunSettings


BUNDLED_TRAIN_TEXT = "wikitext-2/valid.txt"
BUNDLED_PROMPTS = "gsm8k/test.jsonl"


class UnsupportedError(RuntimeError):
    """A method that a library cannot run on this device; raised before any training."""


def bundled(name: str) -> Path:
    return Path(str(resources.files("profkit") / "data" / name))


def cache_dir() -> Path:
    return Path(os.environ.get("PROFKIT_CACHE", Path.home() / ".cache" / "profkit"))


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
            import bitsandbytes  # noqa: F401
        except Exception as exc:  # bitsandbytes raises assorted errors when its native library is missing
            return f"NF4 quantization needs bitsandbytes, which failed to import: {exc}"
    if method.zero_stage:
        try:
            import deepspeed  # noqa: F401
        except Exception as exc:
            return f"ZeRO-{method.zero_stage} needs DeepSpeed, which failed to import: {exc}"
        import torch.distributed as dist
        backend = "nccl" if device == "cuda" else "gloo"
        available = dist.is_available() and (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available())
        if not available:
            return f"ZeRO-{method.zero_stage} needs the torch.distributed {backend} backend, which this torch build lacks"
    return None


def half_dtype(device: str) -> torch.dtype:
    """Storage dtype of frozen weights and of inference: bf16 on GPUs that have it, fp16 on older ones,
    fp32 on CPU (CPU half-precision matmuls are emulated and would distort the time breakdown)."""
    if device == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


# --------------------------------------------------------------------------- model

def tokenizer_for(settings: RunSettings):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

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
    from transformers import AutoConfig, AutoModelForCausalLM

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
    from transformers import AutoConfig

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
    kbit_prep: bool  # peft's prepare_model_for_kbit_training (QLoRA's casts of the unquantized weights)
    gradient_checkpointing: bool
    lora: Any  # peft's LoraConfig, or None
    lora_dtype_follows_base: bool  # bf16-pure: the adapters in bf16 too (peft keeps them fp32 otherwise)
    attn_implementation: str  # what transformers builds the attention with
    notes: tuple[str, ...] = ()


def plan(method: Method, device: str, half: torch.dtype | None = None) -> ModelPlan:
    """``half``: the device's half precision (default: what this machine's ``device`` supports; the estimator
    passes bf16 for a CUDA target it does not have)."""
    half = half or half_dtype(device)
    notes: list[str] = []
    precision = method.precision
    if precision == "auto":
        precision = "fp32" if device == "cpu" else ("bf16-mixed" if half == torch.bfloat16 else "fp16-mixed")
    half = {"bf16-mixed": torch.bfloat16, "bf16-pure": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision,
                                                                                                      torch.float32)
    if method.kind == "infer":
        load = half
    elif precision == "fp32" or (precision.endswith("-mixed") and method.adapter == "none"):
        load = torch.float32  # trainable full fine-tuning weights stay fp32 under mixed precision
    else:
        load = half  # frozen bases in half precision; bf16-pure: everything
    quant = None
    if method.quantization:
        from transformers import BitsAndBytesConfig

        compute = half if half != torch.float32 else torch.float32
        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=method.quantization,
                                   bnb_4bit_use_double_quant=method.double_quant, bnb_4bit_compute_dtype=compute)
    lora = None
    if method.adapter == "lora":
        from peft import LoraConfig

        from profkit.methods import ALL_LINEAR

        targets = ALL_LINEAR if method.lora_targets == (ALL_LINEAR,) else list(method.lora_targets)
        lora = LoraConfig(r=method.lora_r, lora_alpha=method.lora_alpha, lora_dropout=method.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM")
    attention = {"sdpa": "sdpa", "eager": "eager", "flash": "flash_attention_2"}[method.attention]
    if method.attention == "flash" and device == "cpu":
        attention = "sdpa"
        notes.append("--attention flash on CPU: flash-attention 2 is CUDA-only; sdpa runs, which on CPU picks "
                     "PyTorch's own flash kernel for CPU")
    return ModelPlan(precision, load, half if precision.endswith("-mixed") else None, quant,
                     bool(method.quantization) and method.kind == "train", method.gradient_checkpointing and
                     method.kind == "train", lora, precision == "bf16-pure", attention, tuple(notes))


def make_optimizer(method: Method, params: list):
    """The method's optimizer over ``params``."""
    if method.optimizer == "sgd":
        return torch.optim.SGD(params, lr=method.learning_rate)  # no momentum: no state
    if method.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        import bitsandbytes as bnb

        cls = bnb.optim.PagedAdamW8bit if method.optimizer == "paged-adamw-8bit" else bnb.optim.AdamW8bit
        return cls(params, lr=method.learning_rate)
    return torch.optim.AdamW(params, lr=method.learning_rate)


def build_model(method: Method, settings: RunSettings, device: str):
    """Load the model as ``plan`` prescribes: dtype, 4-bit, k-bit preparation, LoRA, checkpointing (which
    the Trainer engine leaves to ``TrainingArguments``, as its users do)."""
    from transformers import AutoModelForCausalLM

    p = plan(method, device)
    path = settings.model_path or materialize_preset(settings.preset)
    kwargs: dict[str, Any] = {"dtype": p.load_dtype, "device_map": {"": device}, "attn_implementation": p.attn_implementation}
    if p.quantization is not None:
        kwargs["quantization_config"] = p.quantization
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **kwargs)

    if method.kind == "infer":
        model.eval()
        model.requires_grad_(False)  # serving holds no trainable weights
        _check_cpu_4bit_inference(model, device)
        return model

    model.config.use_cache = False
    if p.kbit_prep:
        from peft import prepare_model_for_kbit_training
        # Casts the remaining non-quantized weights (norms, embeddings) to fp32, as QLoRA users get it.
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    if p.gradient_checkpointing and settings.engine != "trainer":
        # Non-reentrant checkpointing needs no input that requires grad, so it works with frozen embeddings.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if p.lora is not None:
        from peft import get_peft_model
        model = get_peft_model(model, p.lora, autocast_adapter_dtype=not p.lora_dtype_follows_base)
    model.train()
    return model


class _MetaNF4Linear(torch.nn.Linear):
    """Stands in for bitsandbytes' ``Linear4bit`` on the meta device, where bitsandbytes cannot quantize:
    the same frozen weight and the same dtype round trip (input cast to the compute dtype, output cast
    back), so autograd saves what it saves for the real layer. Storage is counted by the estimator."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


def meta_model(method: Method, config, device: str, half: torch.dtype | None = None) -> tuple[Any, set[str], ModelPlan]:
    """The model ``build_model`` would build, following the same ``plan``, on the meta device (shapes and dtypes,
    no memory), and the names of the parameters that would be stored in 4 bits. Used by the estimator; no
    weights needed."""
    from transformers import AutoModelForCausalLM
    from transformers.quantizers.base import get_keys_to_not_convert
    from transformers.quantizers.quantizers_utils import should_convert_module

    p = plan(method, device, half)
    attention = "sdpa" if p.attn_implementation == "flash_attention_2" else p.attn_implementation  # same saves
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=p.load_dtype, attn_implementation=attention)
    quantized_ids: set[int] = set()
    if p.quantization is not None:
        # transformers' own rule for which Linear layers bitsandbytes replaces.
        keep = get_keys_to_not_convert(model)
        for name, module in list(model.named_modules()):
            if type(module) is torch.nn.Linear and should_convert_module(name, keep):
                module.__class__ = _MetaNF4Linear
                quantized_ids.add(id(module.weight))
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
        from peft import get_peft_model
        model = get_peft_model(model, p.lora, autocast_adapter_dtype=not p.lora_dtype_follows_base)
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


# --------------------------------------------------------------------------- data

def token_blocks(tokenizer, settings: RunSettings) -> torch.Tensor:
    """``seq_len`` token blocks, shape (blocks, seq_len), from the bundled WikiText-2 or a user's file."""
    from datasets import load_dataset

    path = settings.dataset_path or str(bundled(BUNDLED_TRAIN_TEXT))
    if path.endswith((".jsonl", ".json")):
        ds = load_dataset("json", data_files=path, split="train")
        if "text" not in ds.column_names:
            raise ValueError(f"{path}: a JSON/JSONL training file needs a 'text' field (found {ds.column_names})")
    else:
        ds = load_dataset("text", data_files=path, split="train")
    ds = ds.filter(lambda row: bool(row["text"].strip()))
    ids = [t for row in ds.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=ds.column_names)["input_ids"]
           for t in row]
    block = settings.seq_len
    n_blocks = len(ids) // block
    if n_blocks < settings.batch_size:
        raise ValueError(f"{path}: {len(ids)} tokens is too little text for batch {settings.batch_size} x {block}")
    return torch.tensor(ids[: n_blocks * block]).view(n_blocks, block)


def training_batches(tokenizer, settings: RunSettings, device: str, rank: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches of token blocks, on ``device`` (profkit's own loop); with several ranks, each rank takes
    every ``nproc``-th batch, as a distributed sampler would."""
    blocks = token_blocks(tokenizer, settings)
    n_blocks = len(blocks)
    # Independent tensors: a view would keep the whole corpus' storage alive in the memory timeline.
    starts = list(range(0, n_blocks - settings.batch_size + 1, settings.batch_size))[rank::settings.nproc]
    if not starts:
        raise ValueError(f"too little text for {settings.nproc} ranks of batch {settings.batch_size} x {settings.seq_len}")
    batches = [blocks[i:i + settings.batch_size].clone().to(device) for i in starts]
    while True:
        for batch in batches:
            yield {"input_ids": batch, "labels": batch}


def inference_prompts(tokenizer, settings: RunSettings, device: str) -> Iterator[torch.Tensor]:
    """Endless prompts of exactly ``batch_size`` x ``seq_len`` tokens, cut from GSM8K's questions (bundled) or a
    user's JSONL ('question' or 'text') read as one token stream, as serving benchmarks fix input and output
    lengths: every request then has the same prefill and KV cache, so latencies compare and the estimate applies."""
    from datasets import load_dataset

    path = settings.dataset_path or str(bundled(BUNDLED_PROMPTS))
    ds = load_dataset("json", data_files=path, split="train")
    field = "question" if "question" in ds.column_names else "text"
    if field not in ds.column_names:
        raise ValueError(f"{path}: an inference file needs a 'question' or 'text' field (found {ds.column_names})")
    stream = [t for q in ds[field] for t in tokenizer(q)["input_ids"]]
    size = settings.batch_size * settings.seq_len
    if len(stream) < size:
        raise ValueError(f"{path}: {len(stream)} tokens is too little text for prompts of batch "
                         f"{settings.batch_size} x {settings.seq_len}")
    prompts = [torch.tensor(stream[i:i + size]).view(settings.batch_size, settings.seq_len)
               for i in range(0, len(stream) - size + 1, size)]
    while True:
        for p in prompts:
            yield p.to(device)


# --------------------------------------------------------------------------- steps

@dataclass
class Workload:
    """A built method: the objects that hold memory, and ``run(session)``, which trains or generates until the
    session has every step it needs. The session labels the phases; the loop only calls ``session.step()``."""

    method: Method
    device: str
    model: Any  # the nn.Module, or the DeepSpeed engine around it
    optimizer: Any  # torch optimizer, or DeepSpeed's ZeRO optimizer
    step: Callable[[], None] | None  # one step of profkit's own loop (None: another engine drives the loop)
    tokens_per_step: int
    run_loop: Callable[[Any], None] | None = None

    def run(self, make_session: Callable[[Any, Any], Any]) -> None:
        """Train (or generate) until the session has every step it needs. ``make_session(model, optimizer)``
        is called once the objects exist: for the Trainer engine, when the Trainer has built its optimizer."""
        if self.run_loop is not None:
            self.run_loop(make_session)
            return
        with make_session(self.model, self.optimizer) as session:
            while not session.done:
                self.step()
                session.step()


def _autocast(device: str, dtype: torch.dtype | None):
    return torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext()


def _init_process_group(device: str) -> None:
    """The process group DeepSpeed needs: torchrun's ranks when it launched us (its environment wins), else a
    group of one on a free local port."""
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    deepspeed.init_distributed(dist_backend="nccl" if device == "cuda" else "gloo")


def zero_buffers(stage: int, config=None, engine: str = "loop") -> dict[str, int]:
    """The ZeRO settings that size DeepSpeed's buffers, as profkit runs them, read from DeepSpeed's config class
    rather than restated: DeepSpeed's own defaults for profkit's loop; for the Trainer engine, Hugging Face's
    template with its "auto" sizes filled in by transformers' own ``trainer_config_finalize`` from ``config``."""
    import contextlib
    import sys
    from types import SimpleNamespace

    # DeepSpeed's logger writes to the stdout it finds at import; keep it off a command's JSON or CSV output.
    with contextlib.redirect_stdout(sys.stderr):
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    zero: dict = {"stage": stage}
    if engine == "trainer":
        from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

        hf = HfTrainerDeepSpeedConfig(trainer_deepspeed_config(stage))
        hf.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda steps: 0), SimpleNamespace(config=config), 1)
        zero = {k: v for k, v in hf.config["zero_optimization"].items()}
        del hf  # its weak reference tells from_pretrained that ZeRO-3 is on: drop it now
    config = DeepSpeedZeroConfig(**zero)
    return {"reduce_bucket_size": int(config.reduce_bucket_size),
            "prefetch_bucket_size": int(config.prefetch_bucket_size),
            "max_live_parameters": int(config.max_live_parameters),
            "param_persistence_threshold": int(config.param_persistence_threshold)}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _setting_unsupported(method: Method, device: str) -> str | None:
    """Why a command-line setting cannot run here, checked before any training."""
    if method.zero_offload != "none" and device == "cpu":
        return "--zero-offload moves state from the GPU to host memory; on CPU everything is in host memory already"
    if method.attention == "flash" and device == "cuda":
        try:
            import flash_attn  # noqa: F401
        except Exception as exc:
            return f"--attention flash needs the flash-attn package, which failed to import: {exc}"
    if method.optimizer in ("adamw-8bit", "paged-adamw-8bit"):
        try:
            import bitsandbytes as bnb
            probe = torch.nn.Parameter(torch.zeros(4096, device=device))
            opt = make_optimizer(method, [probe])
            probe.grad = torch.ones_like(probe)
            opt.step()  # bitsandbytes' 8-bit optimizers need a kernel for this device: try one step
        except Exception as exc:
            return (f"--optimizer {method.optimizer}: bitsandbytes {getattr(bnb, '__version__', '?')} cannot step "
                    f"it on {device} ({type(exc).__name__}: {str(exc)[:200]})")
    return None


def build(method: Method, settings: RunSettings, device: str) -> Workload:
    reason = unsupported_reason(method, device)
    if not reason and settings.engine == "trainer" and settings.nproc > 1 and device == "cpu":
        # accelerate (under the Trainer) starts its distributed state only for accelerators, or with use_cpu,
        # which turns DeepSpeed off: on CPU every rank would count itself as the only process.
        reason = ("the Trainer on several CPU ranks: accelerate, under the Trainer, sees one process per rank "
                  "unless use_cpu is set, and use_cpu turns DeepSpeed off; use --engine loop, or GPUs")
    if not reason:
        reason = _setting_unsupported(method, device)
    if reason:
        raise UnsupportedError(reason)
    torch.manual_seed(settings.seed)
    tokenizer = tokenizer_for(settings)
    model = build_model(method, settings, device)
    if method.kind == "infer":
        return _inference_workload(method, settings, device, tokenizer, model)

    if settings.engine == "trainer":
        return _trainer_workload(method, settings, device, tokenizer, model)
    batches = training_batches(tokenizer, settings, device, int(os.environ.get("RANK", 0)) if settings.nproc > 1 else 0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(method, trainable)
    autocast = plan(method, device).autocast
    engine = None
    if method.zero_stage:
        import deepspeed
        _init_process_group(device)
        zero: dict[str, Any] = {"stage": method.zero_stage}
        if method.zero_offload != "none":
            zero["offload_optimizer"] = {"device": "cpu"}
            if method.zero_offload == "optimizer+params":
                zero["offload_param"] = {"device": "cpu"}
        ds_config = {"train_micro_batch_size_per_gpu": settings.batch_size, "gradient_accumulation_steps": 1,
                     "zero_optimization": zero, "zero_allow_untested_optimizer": True,
                     "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**9}
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    def step() -> None:
        batch = next(batches)
        with _autocast(device, autocast):
            loss = (engine or model)(**batch).loss
        if engine:
            engine.backward(loss)
            engine.step()
        else:
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return Workload(method, device, engine or model, optimizer, step, settings.batch_size * settings.seq_len)


def trainer_deepspeed_config(stage: int, offload: str = "none") -> dict:
    """The DeepSpeed config of a Trainer user: Hugging Face's documented ZeRO-2/3 templates, whose sizes are
    "auto" (the Trainer fills them from the model: reduce bucket = hidden_size^2, ZeRO-3 prefetch bucket =
    0.9 hidden_size^2, persistence threshold = 10 hidden_size) and precision follows TrainingArguments."""
    zero: dict[str, Any] = {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": "auto"}
    if stage == 2:
        zero.update(allgather_partitions=True, allgather_bucket_size=2e8, reduce_scatter=True)
    else:
        zero.update(sub_group_size=1e9, stage3_prefetch_bucket_size="auto", stage3_param_persistence_threshold="auto",
                    stage3_max_live_parameters=1e9, stage3_max_reuse_distance=1e9,
                    stage3_gather_16bit_weights_on_model_save=True)
    if offload != "none":
        zero["offload_optimizer"] = {"device": "cpu"}
        if offload == "optimizer+params":
            zero["offload_param"] = {"device": "cpu"}
    return {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto"}, "zero_optimization": zero,
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto", "zero_allow_untested_optimizer": True,
            "steps_per_print": 10**9}


TRAINER_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit",
                 "sgd": "sgd"}


def _trainer_workload(method: Method, settings: RunSettings, device: str, tokenizer, model) -> Workload:
    """The method through ``transformers.Trainer``, as the reference study and most users run it: precision and
    gradient checkpointing from ``TrainingArguments``, ZeRO from a DeepSpeed config with "auto" sizes."""
    from transformers import Trainer, TrainingArguments

    from profkit.session import MEMORY_CYCLE_ATTEMPTS

    blocks = token_blocks(tokenizer, settings)
    dataset = [{"input_ids": row, "labels": row} for row in blocks.clone()]
    p = plan(method, device)
    if method.zero_stage:
        _init_process_group(device)
    out_dir = tempfile.mkdtemp(prefix="profkit-trainer-")
    args = TrainingArguments(
        # Room for the memory cycles the session may run again; it stops the Trainer once it has what it needs.
        output_dir=out_dir, per_device_train_batch_size=settings.batch_size,
        max_steps=settings.total_steps + (MEMORY_CYCLE_ATTEMPTS - 1) * (1 + settings.memory_steps),
        learning_rate=method.learning_rate, lr_scheduler_type="constant", optim=TRAINER_OPTIM[method.optimizer],
        gradient_checkpointing=method.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if method.gradient_checkpointing else None,
        bf16=p.autocast == torch.bfloat16, fp16=p.autocast == torch.float16,
        use_cpu=device == "cpu" and not method.zero_stage, deepspeed=trainer_deepspeed_config(method.zero_stage, method.zero_offload)
        if method.zero_stage else None, seed=settings.seed, data_seed=settings.seed, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, remove_unused_columns=False,
        dataloader_pin_memory=device == "cuda")

    def run_loop(make_session) -> None:
        from profkit.hf import TrainerCallback

        trainer = Trainer(model=model, args=args, train_dataset=dataset,
                          callbacks=[TrainerCallback(session_factory=make_session, stop_when_done=True)])
        try:
            trainer.train()
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    return Workload(method, device, model, None, None, settings.batch_size * settings.seq_len, run_loop)


def _inference_workload(method: Method, settings: RunSettings, device: str, tokenizer, model) -> Workload:
    prompts = inference_prompts(tokenizer, settings, device)
    new_tokens = settings.max_new_tokens
    autocast = plan(method, device).autocast

    @torch.inference_mode()
    def step() -> None:
        # Inference has no optimizer step for the session to time data loading against: labelled here.
        with record_function(labels.DATA):
            input_ids = next(prompts)
        with record_function(labels.GENERATE), _autocast(device, autocast):
            # min_new_tokens = max_new_tokens: every step generates the same count, so tokens/s compare.
            model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)

    return Workload(method, device, model, None, step, settings.batch_size * new_tokens)
