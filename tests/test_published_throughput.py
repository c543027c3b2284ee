"""The published throughputs' reader: a figure becomes tokens per second per GPU beside the prediction only where
every setting is stated; otherwise it keeps a specific reason (never a guess)."""

from __future__ import annotations

from pathlib import Path

from types import SimpleNamespace

import pandas as pd
import pytest

import profkit.predict.published_throughput as reader
from profkit.predict.published_throughput import compare_throughput

DATA = Path(__file__).parent / "data" / "published"
BASE = dict(split="used", source="s", quote="q", model="TinyLlama/TinyLlama-1.1B", gpu="NVIDIA A100-SXM4-80GB",
            n_gpus="1", method="lora", gc="yes", sharding="none", offload="none", precision="bf16",
            batch_per_device="2", grad_accum="4", seq_len="512", packing="yes", lora_rank="8",
            lora_targets="q_proj,v_proj", attention="sdpa", framework="f", measured="1000", unit="tokens/s",
            what_counted="", notes="")


@pytest.fixture
def stubbed(monkeypatch):
    """The reader alone: the prediction is test_step_time's subject, and a meta-device step of a 1B model costs
    seconds."""
    monkeypatch.setattr(reader, "predict", lambda *a, **k: SimpleNamespace(seconds=1.0, bound="device"))


def _compare(tmp_path, **changes) -> pd.Series:
    table = tmp_path / "throughput.csv"
    pd.DataFrame([{**BASE, **changes}]).to_csv(table, index=False)
    return compare_throughput(table, DATA / "models.json").iloc[0]


@pytest.mark.parametrize("changes, reason", [
    ({"gc": "unstated"}, "gradient checkpointing not stated"),
    ({"sharding": "ddp", "n_gpus": "2"}, "data parallelism (DDP) is not modelled"),
    ({"unit": "min total"}, "a whole run's time needs its token count"),
    ({"gpu": "NVIDIA H100"}, "GPU variant not stated"),
    ({"gpu": "unstated"}, "GPU not stated"),
    ({"framework": "torchtune (torch.compile on)"}, "torch.compile: the prediction is for eager PyTorch"),
    ({"framework": "a loop (torch.compile off)", "packing": "no"}, "how much of each is padding"),  # off: not compiled
    ({"packing": "no"}, "how much of each is padding is not stated"),
    ({"unit": "s/step", "what_counted": "'Sec/step' (most likely per micro-batch)"}, "inferred, not stated"),
    ({"gpu": "NVIDIA H100 80GB"}, "which of H100-SXM, H100-PCIe, H100-NVL is not stated"),
    ({"gpu": "NVIDIA H100 (DGX-H100, 80GB SXM)", "seq_len": "unstated"}, "sequence length not stated"),
    ({"model": "Qwen/Qwen-7B-Chat"}, "custom modelling code"),
    ({"precision": "fp32"}, "the prediction is for 16-bit training"),
    ({"lora_targets": "unstated"}, "LoRA targets not stated"),
    ({"n_gpus": "2", "what_counted": "throughput"}, "2 GPUs without sharding stated"),
    ({"sharding": "fsdp", "n_gpus": "2", "what_counted": "throughput"}, "per GPU or for the job: not stated"),
])
def test_a_setting_not_stated_is_named(stubbed, tmp_path, changes, reason):
    row = _compare(tmp_path, **changes)
    assert reason in row.reason and pd.isna(row.get("error"))


@pytest.mark.parametrize("unit, measured, counted, tokens_per_gpu_s", [
    ("tokens/s", "1000", "", 1000.0),
    ("s/step", "2", "optimizer step", 2 * 512 * 4 / 2),  # batch x sequence x accumulation per step
    ("s/step", "2", "one micro-batch", 2 * 512 / 2),
    ("min per 1000 iterations", "10", "", 2 * 512 / 0.6),  # litgpt's iterations are micro-batches
    ("samples/s", "3", "", 3 * 512),
])
def test_each_unit_becomes_tokens_per_second_per_gpu(stubbed, tmp_path, unit, measured, counted, tokens_per_gpu_s):
    row = _compare(tmp_path, unit=unit, measured=measured, what_counted=counted)
    assert row.reason == "" and row.measured_tokens_per_gpu_s == pytest.approx(tokens_per_gpu_s)
    assert row.predicted_tokens_per_gpu_s == 2 * 512 / 1.0


def test_variants_the_prediction_cannot_tell_apart_are_one(stubbed, tmp_path):
    """An A100 80GB, SXM or PCIe: the same 16-bit peak, 5% apart in bandwidth (and an A100 is not an A10)."""
    assert _compare(tmp_path, gpu="NVIDIA A100 80GB").gpu_key == "A100-SXM4-80GB"


def test_a_chip_whose_variants_differ_in_bandwidth_only_is_predicted_on_each(monkeypatch, tmp_path):
    """"NVIDIA A100": 40 or 80 GB, SXM or PCIe share 108 SMs and their 16-bit peak; each is predicted, the figure
    compared with their geometric mean, and the range said beside it."""
    monkeypatch.setattr(reader, "predict", lambda method, config, batch, seq, gpu, n: SimpleNamespace(
        seconds=1e12 / gpu.bytes_per_s, bound="device"))
    row = _compare(tmp_path, gpu="NVIDIA A100")
    keys = row.gpu_key.split(" or ")
    assert {"A100-SXM4-40GB", "A100-SXM4-80GB", "A100-PCIe-40GB", "A100-PCIe-80GB"} <= set(keys)
    low, high = (float(x) for x in row.predicted_range.split("-"))
    assert low < row.predicted_tokens_per_gpu_s < high and row.reason == ""


def test_a_stated_figure_is_predicted(tmp_path):
    row = _compare(tmp_path)
    assert row.reason == "" and row.gpu_key == "A100-SXM4-80GB" and row.profkit_method.startswith("lora_gc")
    assert row.predicted_tokens_per_gpu_s > 0 and row.error == pytest.approx(row.predicted_tokens_per_gpu_s / 1000 - 1)


def test_the_committed_table_reads_without_a_traceback(stubbed):
    """Every figure of both splits gets a prediction or a reason."""
    table = compare_throughput(DATA / "throughput.csv")
    assert len(table) == 517 and set(table.split) == {"used", "held-out"}
    assert ((table.reason == "") == table.error.notna()).all()
    assert not table.reason.str.contains("Traceback|KeyError").any()
