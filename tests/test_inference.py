"""Inference as users measure it: prefill and decode labelled in the traces, time to first token and time per
output token from the unprofiled steps, and the KV cache found as the cache's tensors, checked to the byte
against the model's configuration."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from profkit import store
from profkit.analyze import breakdown
from profkit.estimate import kv_cache_bytes
from profkit.presets import get_preset
from tests.conftest import run_cli


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
    out = run_cli("breakdown", str(matrix / "infer_fp16"), env={"COLUMNS": "80"})
    assert out.returncode == 0 and "TTFT" in out.stdout and "KV cache" in out.stdout
    assert all(len(line) <= 80 for line in out.stdout.splitlines())
