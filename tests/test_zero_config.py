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


@pytest.mark.e2e
def test_the_loop_keeps_autocast_inside_deepspeeds_engine_and_the_estimate_sizes_its_buffers(tmp_path):
    """profkit's loop asks DeepSpeed for torch's autocast (its torch_autocast section): on an H100 the engine had
    turned the loop's autocast off and LoRA+ZeRO-2's forward held 13% more than plain LoRA's. With it the forward is
    plain LoRA's, and DeepSpeed reduces Linear layers' gradients in bf16: ZeRO-3 sizes its bucket in that dtype,
    ZeRO-2 keeps one buffer per dtype (full fine-tuning: two). CPU autocast stands in for CUDA's; DeepSpeed's code
    is the same (but for the autocast it turns off: it asks CUDA's alone, so the buffers show the section here)."""
    from profkit.analyze import breakdown
    from tests.conftest import run_cli

    out = run_cli("record", "lora_zero3", "full_zero2", "--preset", "micro", "--precision", "bf16-mixed",
                  "--output", str(tmp_path))
    assert out.returncode == 0, out.stderr
    bd = breakdown(sorted(tmp_path.iterdir()), jobs=1)
    m = bd.memory.set_index(["run", "phase", "category"]).bytes
    suffix = "-bf16-mixed"
    assert m["lora_zero3" + suffix, "peak", "gradients"] == pytest.approx(500_000_000 * 2, rel=0.001)  # bf16 bucket
    assert m["full_zero2" + suffix, "peak", "temporaries"] > 3_000_000_000  # two fp32 buffers of 5e8, not one
    p = bd.predicted[bd.predicted.category.isin(["peak", "activations"])]
    assert len(p) >= 4 and p.error.abs().max() < 0.01, p


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
