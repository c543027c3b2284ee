"""The ZeRO buffer sizes the estimate uses come from DeepSpeed's and transformers' own code, not restated: the loop's
are DeepSpeed's defaults, the Trainer's are Hugging Face's "auto" sizes filled from the model's config.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_zero_config.py``."""

from __future__ import annotations

import pytest


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
