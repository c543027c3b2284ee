"""Inference as users measure it: prefill and decode labelled in the traces, time to first token and time per output
token from the unprofiled steps, and the KV cache found as the cache's tensors, checked to the byte against the
model's configuration.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_inference.py``."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from profkit import store
from profkit.analyze import breakdown
from profkit.core.presets import get_preset
from profkit.predict.estimate import kv_cache_bytes
from tests.conftest import invoke, recorded, run_cli


@pytest.mark.parametrize("method", ["infer_fp16", "infer_int4"])
def test_prefill_decode_latency_and_kv_cache(matrix, method):
    record = json.loads((matrix / method / store.MANIFEST).read_text())
    if record["status"] == "unsupported":
        pytest.skip(record["reason"])
    settings, timings, inventory = record["run_settings"], record["timings"], record["inventory"]
    new_tokens, steps = settings["max_new_tokens"], settings["timed_steps"]
    # One prefill and new_tokens - 1 decode passes per request.
    assert len(timings["ttft_s"]) == steps and len(timings["tpot_s"]) == steps * (new_tokens - 1)
    assert 0 < timings["ttft_median_s"] < timings["request_latency_median_s"]
    assert timings["tpot_median_s"] <= timings["tpot_p90_s"]
    # The cache holds the prompt and every new token but the last (it is returned, not fed back).
    config = AutoConfig.for_model(**get_preset("micro").config)
    size = {"float32": 4, "bfloat16": 2, "float16": 2}[inventory["kv_cache_dtype"]]
    assert inventory["kv_cache_bytes"] == kv_cache_bytes(config, 1, inventory["kv_cache_tokens"], size)
    assert inventory["kv_cache_tensors"] == 2 * config.num_hidden_layers
    bd = breakdown([matrix / method])
    phases = set(bd.time[bd.time.run == method].phase)
    assert {"prefill", "decode"} <= phases
    row = bd.runs.iloc[0]
    assert row.kv_cache_bytes == inventory["kv_cache_bytes"] and row.ttft_median_s == timings["ttft_median_s"]


def test_breakdown_shows_generation_latency(matrix):
    out = invoke("breakdown", str(matrix / "infer_fp16"), env={"COLUMNS": "80"})
    assert out.returncode == 0 and "TTFT" in out.stdout and "KV cache" in out.stdout
    assert all(len(line) <= 80 for line in out.stdout.splitlines())


@pytest.mark.parametrize("method", ["infer_fp16", "infer_int4"])
def test_estimate_holds_kv_cache_to_the_byte_and_the_peak(matrix, method):
    """The estimate recorded before the run, set beside the measurement: weights and the KV cache exact, the
    peak within 15% (the issue's target; on micro it is within 1%)."""
    record = json.loads((matrix / method / store.MANIFEST).read_text())
    if record["status"] == "unsupported":
        pytest.skip(record["reason"])
    assert "instants" in record["estimate"], record["estimate"]
    predicted = breakdown([matrix / method]).predicted.set_index("category")
    kv = predicted.loc["kv_cache"]
    assert kv.measured_bytes == record["inventory"]["kv_cache_bytes"] > 0
    assert kv.predicted_bytes == kv.measured_bytes
    assert predicted.loc["parameters_frozen"].predicted_bytes == predicted.loc["parameters_frozen"].measured_bytes
    if method == "infer_int4":
        q = predicted.loc["parameters_quantized"]
        assert q.predicted_bytes == q.measured_bytes > 0
    assert abs(predicted.loc["peak"].error) < 0.15
    assert abs(predicted.loc["activations"].error) < 0.15


@pytest.mark.long
def test_generation_batch_and_prompt_length(tmp_path):
    """--batch-size and --seq-len reach generate(): the cache holds batch x (prompt + new - 1) positions, and
    the estimate follows them."""
    out = tmp_path / "traces"
    result = run_cli("record", "infer_fp16", "--preset", "micro", "--batch-size", "3", "--seq-len", "24",
                     "--max-new-tokens", "5", "--warmup-steps", "0", "--steps", "2", "--profiled-steps", "1",
                     "-o", str(out))
    assert result.returncode == 0, recorded(result, out)
    record = json.loads((out / "infer_fp16" / store.MANIFEST).read_text())
    config = AutoConfig.for_model(**get_preset("micro").config)
    inventory = record["inventory"]
    assert inventory["kv_cache_tokens"] == 24 + 5 - 1
    assert inventory["kv_cache_bytes"] == kv_cache_bytes(config, 3, 28, 4)
    assert record["timings"]["tokens_per_step"] == 3 * 5
    predicted = breakdown([out]).predicted.set_index("category")
    assert predicted.loc["kv_cache"].predicted_bytes == inventory["kv_cache_bytes"]
    assert abs(predicted.loc["peak"].error) < 0.15


def test_quantized_inference_finding(matrix):
    from profkit.report.findings import findings

    runs = [matrix / m for m in ("infer_fp16", "infer_int4")]
    if any(json.loads((r / store.MANIFEST).read_text())["status"] != "ok" for r in runs):
        pytest.skip("a generation run did not complete here")
    sentence = next(s for s in findings(breakdown(runs)) if s.startswith("NF4 inference"))
    assert "of each profiled decode pass" in sentence and "outgrows the 4-bit weights beyond" in sentence
    # The length is the quantized model's weights over the cache's measured bytes per position.
    bd = breakdown(runs)
    row = bd.runs.set_index("run").loc["infer_int4"]
    weights = bd.memory[(bd.memory.run == "infer_int4") & (bd.memory.phase == "peak") &
                        bd.memory.category.str.startswith("parameters")].bytes.sum()
    expected = int(weights // (row.kv_cache_bytes / row.kv_cache_tokens)) + 1
    assert f"beyond {expected:,} positions" in sentence


@pytest.mark.long
def test_the_older_generate_forms_are_estimated_not_recorded(tmp_path):
    result = run_cli("record", "infer_fp16", "--kv-cache", "tuples", "--preset", "micro", "--device", "cpu",
                     "-o", str(tmp_path))
    assert result.returncode == 3 and "estimated (profkit estimate), not recorded" in result.stdout + result.stderr
