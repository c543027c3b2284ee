"""Work against time per category (analyze/efficiency.py): on real GPU traces recorded by others, against the
time breakdown and the device's roofs; on profkit's own CPU runs, against what the methods must do (a frozen
weight has no weight-gradient GEMM; checkpointing's recompute is not model work)."""

from __future__ import annotations

from pathlib import Path

import pytest

from profkit.analyze import breakdown

DATA = Path(__file__).parents[1] / "data" / "gpu-traces"
# Real traces with shapes: inference (HF, SGLang, vLLM) and training (torch.compile, FlashAttention-3) on four GPUs.
WITH_SHAPES = ["h100_qwen1.5-0.5b_hf_memory.json.gz", "mi300x_qwen1.5-0.5b_hf_memory.json.gz",
               "modded_nanogpt_h100x8_normuon_baseline_rank0.json.gz", "tracelens_b200_vllm_gptoss120b_tp8_prefill.json.gz",
               "tracelens_mi300x_sglang_qwen3_8b_prefill_decode.json.gz",
               "switchtransformers_a100pcie_toy_moe_fwd_b8_s1024.json.gz"]


@pytest.fixture(scope="module")
def real():
    return breakdown([DATA / name for name in WITH_SHAPES], jobs=1)


def test_the_device_is_read_from_the_trace(real):
    runs = real.runs.set_index("run")
    assert runs.loc["h100_qwen1.5-0.5b_hf_memory", "gpu"] == "H100-SXM"
    assert runs.loc["mi300x_qwen1.5-0.5b_hf_memory", "gpu"] == "MI300X"
    assert runs.loc["tracelens_b200_vllm_gptoss120b_tp8_prefill", "gpu"] == "B200"
    assert runs.loc["switchtransformers_a100pcie_toy_moe_fwd_b8_s1024", "gpu"] == "A100-PCIe-80GB"


def test_variable_length_attention_is_named_not_guessed(real):
    """FlashAttention-3's variable-length op takes packed [tokens, heads, dim] and sequence offsets the trace does
    not hold: its FLOPs are not counted, its time is uncounted, and a note says why."""
    run = "modded_nanogpt_h100x8_normuon_baseline_rank0"
    assert any("variable-length attention" in n for n in real.notes[run])
    e = real.efficiency[real.efficiency.run == run]
    assert not (e.work == "attention").any() and (e.work == "uncounted").any()


@pytest.mark.parametrize("name", WITH_SHAPES)
def test_no_category_runs_above_its_roof(real, name):
    """Achieved above the device's peak would mean the work is overcounted (or the peak wrong)."""
    e = real.efficiency[real.efficiency.run == name.removesuffix(".json.gz")]
    assert len(e) and e.roof_fraction.notna().any()
    assert (e.roof_fraction.dropna() <= 1.0).all(), e[["category", "work", "roof_fraction"]]


@pytest.mark.parametrize("name", WITH_SHAPES)
def test_each_category_holds_the_kernel_time_the_time_breakdown_gives_it(real, name):
    """Exposed plus overlapped kernel time per category, as the time analysis has it, is the efficiency's
    time: the same kernels, counted or not."""
    run = name.removesuffix(".json.gz")
    e = real.efficiency[real.efficiency.run == run].groupby("category").seconds.sum()
    t = real.time[(real.time.run == run) & (real.time.resource == "gpu") & ~real.time.category.isin(["idle", "memcpy_memset"])]
    kernel = (t.seconds + t.overlapped_seconds).groupby(t.category).sum()
    assert set(e.index) - {"memcpy_memset"} == set(kernel.index)
    for category, seconds in kernel.items():
        assert e[category] == pytest.approx(seconds, rel=0.01), category


def test_gemm_work_is_counted_and_runs_near_the_compute_roof(real):
    e = real.efficiency[(real.efficiency.run == "h100_qwen1.5-0.5b_hf_memory") & (real.efficiency.work == "gemm")]
    assert e.bound.tolist() == ["compute"] and 0.3 < e.roof_fraction.iloc[0] <= 1.0
    runs = real.runs.set_index("run")
    assert 0 < runs.loc["h100_qwen1.5-0.5b_hf_memory", "mfu"] < 1


def test_a_trace_without_shapes_says_so():
    bd = breakdown([DATA / "a100_alexnet_single.json.gz"], jobs=1)
    assert bd.efficiency.empty
    assert any("without shapes" in n for n in bd.notes["a100_alexnet_single"])


# profkit's own runs (CPU, micro preset)
