"""The ZeRO buffer sizes the estimate uses come from DeepSpeed's and transformers' own code, not restated: the
loop's are DeepSpeed's defaults, the Trainer's are Hugging Face's "auto" sizes filled from the model's config."""

from __future__ import annotations

import pytest

from profkit.core.methods import get_method
from profkit.core.settings import RunSettings
from profkit.model.build import meta_model, model_config
from profkit.model.zero import zero_buffers


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
