"""--buffers-of: the tables older transformers built in every layer (rotary cos and sin tables over every position,
causal-mask tables), held to what those versions built. ``tests/data/legacy_buffers.json`` keeps the buffers of each
model of the published set built on the meta device in fp16 under 21 transformers versions from 4.31 to 4.56 and
under the installed one (``analyses/legacy_buffers.py``, from each version's own wheel); the rules must give the
difference for every model and version. What they leave out is small buffers that moved between plain attributes
and buffers (GPT-J's sinusoidal position table, 0.5 MB, a buffer today only; per-layer inverse frequencies)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from profkit.core.methods import get_method, parse_version, with_overrides
from profkit.model.legacy_buffers import legacy_bytes
from profkit.predict.estimate import estimate

DATA = Path(__file__).parent / "data"
FIXTURE = json.loads((DATA / "legacy_buffers.json").read_text())
MODELS = json.loads((DATA / "published" / "models.json").read_text())
SMALL = 600_000  # bytes: the small buffers named above


def _config(name: str):
    config = dict(MODELS[name]["config"])
    return AutoConfig.for_model(config.pop("model_type"), **config)


@pytest.mark.parametrize("version", sorted(FIXTURE["versions"], key=parse_version))
def test_the_rules_give_what_each_version_built(version):
    installed = FIXTURE["installed"]["models"]
    built = {n: m for n, m in FIXTURE["versions"][version].items() if "error" not in m and "error" not in
             installed.get(n, {"error": "not built by the installed transformers"})}
    assert len(built) >= 35
    for name, old in built.items():
        legacy = legacy_bytes(_config(name), parse_version(version), torch.float16)
        assert abs(old["bytes"] - installed[name]["bytes"] - legacy) <= SMALL, (name, old["buffers"], legacy)


def test_the_tables_were_large_and_are_gone():
    """The rules are not vacuous: Mistral 7B (32,768 positions) at 4.35 held half a gigabyte of them; 4.56 none."""
    mistral = _config("Mistral 7B")
    assert legacy_bytes(mistral, (4, 35), torch.float16) == 32 * 2 * 32768 * 128 * 2
    assert legacy_bytes(mistral, (4, 56), torch.float16) == 0


@pytest.mark.parametrize("name", ["infer_fp16", "lora"])
def test_the_estimate_holds_them_beside_the_weights(name):
    config = AutoConfig.for_model("mistral", hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                                  max_position_embeddings=4096)
    method = get_method(name)
    today = estimate(method, config, 1, 64)
    old = estimate(with_overrides(method, buffers_of="4.35.2"), config, 1, 64)
    tables = legacy_bytes(config, (4, 35), torch.bfloat16)
    assert tables == 2 * 2 * 4096 * 64 * 2  # two layers' cos and sin tables, bf16
    for instant, categories in today.instants.items():
        more = {c: old.instants[instant][c] - b for c, b in categories.items()}
        assert more == {c: tables if c == "parameters_frozen" else 0 for c in categories}, (instant, more)
    assert any(n.startswith("--buffers-of 4.35.2: 4 rotary cos and sin tables") for n in old.notes)
    newer = estimate(with_overrides(method, buffers_of="4.50"), config, 1, 64)
    assert newer.peak_bytes == today.peak_bytes and any("built no buffer" in n for n in newer.notes)
