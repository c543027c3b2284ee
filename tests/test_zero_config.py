"""The ZeRO buffer sizes the estimate uses come from DeepSpeed's and transformers' own code, not restated: the
loop's are DeepSpeed's defaults, the Trainer's are Hugging Face's "auto" sizes filled from the model's config."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from profkit.core.methods import get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.core.presets import get_preset
from profkit.model.build import meta_model, model_config, plan
from profkit.model.zero import zero_buffers
from profkit.predict.estimate import estimate


@pytest.mark.parametrize("stage", [2, 3])
def test_trainer_sizes_follow_the_models_hidden_size(stage):
    config = model_config(RunSettings(method="", preset="tiny"))
    model, _, _ = meta_model(get_method(f"lora_zero{stage}"), config, "cpu")
    h = config.hidden_size
    trainer, loop = zero_buffers(stage, model, "trainer"), zero_buffers(stage, model, "loop")
    assert trainer["reduce_bucket_size"] == h * h
    if stage == 3:  # transformers fills these two for ZeRO-3 only
        assert trainer["prefetch_bucket_size"] == int(0.9 * h * h)
        assert trainer["param_persistence_threshold"] == 10 * h
    # DeepSpeed's own defaults, which profkit's loop keeps: far larger than a tiny model's hidden size squared.
    assert loop["reduce_bucket_size"] == 500_000_000 and loop["prefetch_bucket_size"] == 50_000_000


@pytest.mark.parametrize("name", ["full_zero3", "lora_zero2"])
def test_outside_profkits_loop_zero_with_mixed_precision_is_deepspeeds_half_engine(name):
    """The Trainer's DeepSpeed config (bf16 "auto") and DeepSpeed's documented ones cast the module to half
    precision and autocast nothing; profkit's loop keeps fp32 weights under autocast inside the engine. The
    estimate follows each, and the Trainer's bf16 flag is set in both."""
    method = with_overrides(get_method(name), precision="bf16-mixed")
    loop, trainer = (plan(method, "cuda", torch.bfloat16, engine) for engine in ("loop", "trainer"))
    assert (trainer.load_dtype, trainer.autocast) == (torch.bfloat16, None)
    assert loop.autocast == torch.bfloat16 and trainer.mixed_dtype == loop.mixed_dtype == torch.bfloat16
    assert any("DeepSpeed's bf16 engine" in n for n in trainer.notes)
    config = AutoConfig.for_model(**get_preset("micro").config)
    trainable = {engine: estimate(method, config, 2, 64, 1, "cuda", engine=engine).instants["forward"]
                 for engine in ("loop", "trainer")}
    if name.startswith("full"):  # fp32 weights in the loop, bf16 in DeepSpeed's engine
        assert trainable["loop"]["parameters_trainable"] == 2 * trainable["trainer"]["parameters_trainable"]
