"""Work against time per category (analyze/efficiency.py): on real GPU traces recorded by others, against the time
breakdown and the device's roofs; on profkit's own CPU runs, against what the methods must do (a frozen weight has no
weight-gradient GEMM; checkpointing's recompute is not model work).

The tests that record, train or start a process; those on stored fixtures are in
``tests/analyze/test_efficiency.py``."""

from __future__ import annotations

import pandas as pd
import pytest

from profkit.analyze import breakdown


@pytest.fixture(scope="module")
def own(matrix):
    return breakdown([matrix / name for name in ("full", "lora", "lora_gc", "qlora")], jobs=1)


def test_own_runs_count_their_work_on_the_host(own):
    runs = own.runs.set_index("run")
    for run in ("full", "lora", "lora_gc", "qlora"):
        e = own.efficiency[own.efficiency.run == run]
        assert set(e.resource) == {"cpu"} and (e.work == "gemm").any() and (e.work == "attention").any(), run
        # A CPU has no peak in profkit's table: work and rates, no MFU.
        assert runs.loc[run, "model_flop_per_step"] > 0 and pd.isna(runs.loc[run, "mfu"])


def test_checkpointing_adds_hardware_work_not_model_work(own):
    """lora_gc recomputes its decoder layers' forward: that work is in the recompute category and the hardware
    FLOPs, not in the model FLOPs. Those grow a little all the same (measured on micro: 1.3%): with checkpointing,
    transformers makes the embeddings' output require a gradient (``enable_input_require_grads``), so backward
    also computes the input gradient through the first layer's frozen weights, which LoRA alone skips."""
    runs = own.runs.set_index("run")
    e = own.efficiency[own.efficiency.run == "lora_gc"]
    recomputed = e[e.category == "recompute"].flop.sum()
    extra_model = runs.loc["lora_gc", "model_flop_per_step"] - runs.loc["lora", "model_flop_per_step"]
    assert recomputed > 0 and 0 <= extra_model <= 0.02 * runs.loc["lora", "model_flop_per_step"]
    assert runs.loc["lora_gc", "hardware_flop_per_step"] - runs.loc["lora", "hardware_flop_per_step"] == \
        pytest.approx(recomputed + extra_model, rel=0.01)


def test_frozen_weights_skip_the_weight_gradient(own):
    """Full fine-tuning computes a weight gradient for every weight (forward 2, backward 4 FLOPs per weight and
    token); LoRA only for the adapters (forward 2, input gradient 2): about two thirds of full's work."""
    runs = own.runs.set_index("run")
    ratio = runs.loc["lora", "model_flop_per_step"] / runs.loc["full", "model_flop_per_step"]
    assert 0.62 < ratio < 0.75


def test_qlora_counts_the_dequantization_it_does(own):
    e = own.efficiency[own.efficiency.run == "qlora"]
    assert (e.work == "dequantize").any() and e[e.work == "dequantize"].bytes.sum() > 0


def test_how_weights_are_stored_does_not_change_the_models_work(matrix):
    """NF4 generation decodes one token at a time through bitsandbytes' gemv_4bit: counted as the GEMM it is,
    the 4-bit model does the fp16 model's FLOPs (before, its bytes alone passed it off as memory work and the
    4-bit model seemed to do a quarter of the work)."""
    bd = breakdown([matrix / "infer_fp16", matrix / "infer_int4", matrix / "lora", matrix / "qlora"], jobs=1)
    runs = bd.runs.set_index("run")
    for plain, quantized in (("infer_fp16", "infer_int4"), ("lora", "qlora")):
        assert runs.loc[quantized, "model_flop_per_step"] == pytest.approx(runs.loc[plain, "model_flop_per_step"])
