"""DeepSpeed ZeRO as profkit runs it: the process group, the config a Trainer user writes, and the buffer sizes
that follow from it (which the estimate needs). DeepSpeed is imported where used: it is optional."""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

from profkit.model.distributed import init_process_group


def init_zero_process_group(device: str) -> None:
    """The process group DeepSpeed needs, made by DeepSpeed (``model.distributed``)."""
    import deepspeed  # optional: only ZeRO methods need it, and unsupported_reason reports its absence

    init_process_group(device, lambda backend: deepspeed.init_distributed(dist_backend=backend))


def zero_buffers(stage: int, model=None, engine: str = "loop") -> dict[str, int]:
    """The ZeRO settings that size DeepSpeed's buffers, as profkit runs them, read from DeepSpeed's config class
    rather than restated: DeepSpeed's own defaults for profkit's loop; for the Trainer engine, Hugging Face's
    template with its "auto" sizes filled in by transformers' own ``trainer_config_finalize`` from ``model`` (the
    meta-device build will do: only its config is read) and default ``TrainingArguments``."""
    # DeepSpeed's logger writes to the stdout it finds at import; keep it off a command's JSON or CSV output.
    with contextlib.redirect_stdout(sys.stderr):
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig  # optional: ZeRO methods only

    zero: dict = {"stage": stage}
    if engine == "trainer":
        hf = HfTrainerDeepSpeedConfig(trainer_deepspeed_config(stage))
        hf.trainer_config_finalize(TrainingArguments(report_to="none"), model, num_training_steps=1)
        zero = {k: v for k, v in hf.config["zero_optimization"].items()}
        del hf  # its weak reference tells from_pretrained that ZeRO-3 is on: drop it now
    config = DeepSpeedZeroConfig(**zero)
    return {"reduce_bucket_size": int(config.reduce_bucket_size),
            "prefetch_bucket_size": int(config.prefetch_bucket_size),
            "max_live_parameters": int(config.max_live_parameters),
            "param_persistence_threshold": int(config.param_persistence_threshold),
            "memory_efficient_linear": int(config.memory_efficient_linear)}


# The layers whose parameters DeepSpeed's torch_autocast communicates in the autocast dtype (its
# LOWER_PRECISION_SAFE_MODULES, matched by exact class as it does).
_AUTOCAST_COMM_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def torch_autocast_config(autocast: torch.dtype | None) -> dict:
    """The DeepSpeed config section that keeps torch's autocast inside the engine, for profkit's loop. Without it
    DeepSpeed turns a caller's CUDA autocast off in its forward (seen on an H100: LoRA under ZeRO-2 ran its
    forward without autocast, 13% more activations than plain LoRA); with it the forward is plain LoRA's."""
    return {} if autocast is None else {"torch_autocast": {"enabled": True,
                                                           "dtype": str(autocast).removeprefix("torch.")}}


def reduce_dtypes(model: torch.nn.Module, trainable: list[torch.Tensor],
                  autocast: torch.dtype | None) -> list[torch.dtype]:
    """The dtypes DeepSpeed reduces the trainable parameters' gradients in, one reduce buffer each: under
    ``torch_autocast_config`` a parameter of a plain Linear or Conv layer in the autocast dtype and any other in
    its own; otherwise the one dtype of the trainable parameters. ZeRO-2 sizes each buffer in the gradients'
    dtype, ZeRO-3 in the buffer's own (measured on CPU at bf16: ZeRO-3's LoRA bucket 1.0 GB, not 2.0)."""
    if autocast is None:
        return [trainable[0].dtype]
    low = {id(p) for m in model.modules() if type(m) in _AUTOCAST_COMM_MODULES for p in m.parameters(recurse=False)}
    return sorted({autocast if id(p) in low else p.dtype for p in trainable}, key=str)


@contextlib.contextmanager
def zero3_linear(enabled: bool = True, unless: frozenset[int] = frozenset()):
    """``torch.nn.functional.linear`` as ZeRO-3 replaces it for good when it partitions a model (its
    ``memory_efficient_linear``, on by default): DeepSpeed's ``LinearFunctionForZeroStage3`` saves every linear's
    input and weight for backward, a frozen one's too, where torch's saves the input only for a weight that needs
    a gradient. The estimate's meta forward runs under it to count what that saves. ``unless``: ids of weights
    whose layers never call it (bitsandbytes' 4-bit layers multiply through their own function)."""
    if not enabled:
        yield
        return
    with contextlib.redirect_stdout(sys.stderr):
        from deepspeed.runtime.zero.linear import zero3_linear_wrap  # optional: ZeRO methods only
    original = torch.nn.functional.linear

    def linear(input, weight, bias=None):
        return original(input, weight, bias) if id(weight) in unless else zero3_linear_wrap(input, weight, bias)

    torch.nn.functional.linear = linear
    try:
        yield
    finally:
        torch.nn.functional.linear = original


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

