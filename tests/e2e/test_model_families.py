"""The estimate across model families: mixtures of experts (Mixtral; Qwen2-MoE with a shared expert, as the
``micro-moe`` preset), multi-query attention (GPTBigCode), Gemma 2 (no sdpa: eager attention, sliding window) and
tied embeddings. One table drives every case: the meta-device estimate beside a CPU recording of the same tiny model
(random weights) through ``profkit.Session``; the static categories must agree to the byte.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_model_families.py``."""

from __future__ import annotations

import pytest
import torch

import profkit
from profkit.analyze import breakdown
from profkit.core.methods import get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.model.build import build_model, make_optimizer
from tests.conftest import invoke, run_cli
from tests.families import FAMILIES
from tests.test_model_families import _config

QUICK = dict(warmup_steps=0, timed_steps=1, profiled_steps=1, memory_steps=1)


STATIC = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "optimizer_state", "gradients")


def _method(family: str, name: str):
    targets = FAMILIES[family][1]
    return with_overrides(get_method(name), lora_targets=",".join(targets)) if targets and name != "full" else \
        get_method(name)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["full", "lora", "qlora"])
@pytest.mark.long
def test_the_estimate_matches_a_cpu_recording_of_each_family(family, name, family_checkpoints, tmp_path):
    compared = _recorded_beside_the_estimate(_method(family, name), family, family_checkpoints, tmp_path)
    if name == "qlora":
        assert compared.loc["parameters_quantized"].measured_bytes > 0


@pytest.mark.parametrize("family", ["micro-moe", "mixtral"])
@pytest.mark.long
def test_quantized_experts_match_a_cpu_recording(family, family_checkpoints, tmp_path):
    """--quantize-experts: bitsandbytes' parametrization stores the fused 3-D expert tensors in 4 bits (axolotl's
    quantize_moe_experts) and dequantizes a layer's experts at each use; recorded on CPU, the experts move from the
    frozen weights to the quantized ones, byte for byte as the estimate has them."""
    plain = _recorded_beside_the_estimate(_method(family, "qlora"), family, family_checkpoints, tmp_path / "plain")
    method = with_overrides(_method(family, "qlora"), quantize_experts=True)
    experts = _recorded_beside_the_estimate(method, family, family_checkpoints, tmp_path / "experts")
    moved = plain.loc["parameters_frozen"].measured_bytes - experts.loc["parameters_frozen"].measured_bytes
    gained = experts.loc["parameters_quantized"].measured_bytes - plain.loc["parameters_quantized"].measured_bytes
    assert 0 < gained < moved / 3  # 4 bits a value and the block scales, where the experts had 16 or 32 bits


def _recorded_beside_the_estimate(method, family, family_checkpoints, tmp_path):
    """A CPU recording of ``method`` on ``family``'s tiny model through ``profkit.Session``, and the breakdown's
    predicted-beside-measured table: the static categories must agree to the byte, activations within 1%."""
    name = method.name
    settings = (RunSettings(method=name, preset=family) if family not in family_checkpoints
                else RunSettings(method=name, model_path=str(family_checkpoints[family])))
    model = build_model(method, settings, "cpu")
    optimizer = make_optimizer(method, [p for p in model.parameters() if p.requires_grad])
    with profkit.Session(tmp_path / "run", model, optimizer, **QUICK) as session:
        for _ in range(session.total_steps):
            ids = torch.randint(0, 4096, (2, 32))
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            session.step()
    bd = breakdown([tmp_path / "run"], jobs=1)
    assert bd.runs.status.iloc[0] == "ok", bd.problems
    compared = bd.predicted.set_index("category")
    assert len(compared), bd.records["run"].estimate  # the live estimate ran, or says why not
    for category in STATIC:
        assert compared.loc[category].predicted_bytes == compared.loc[category].measured_bytes, category
    assert abs(compared.loc["activations"].error) <= 0.01, compared.loc["activations"].to_dict()
    return compared


def test_a_configs_own_quirks_stay_off_the_terminal_and_a_long_sequence_exits_2(tmp_path):
    """santacoder's config names token ids outside its vocabulary, which transformers warns about on load; the CLI
    keeps that off the terminal. Its 4096 tokens past 2048 learned positions exit 2 with the reason."""
    _config("gpt_bigcode", n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=50256,
            eos_token_id=50256).save_pretrained(tmp_path)
    ok = run_cli("estimate", "full_gc", "--model", str(tmp_path), "--seq-len", "64", "--batch-size", "1")
    assert ok.returncode == 0 and "[transformers]" not in ok.stderr + ok.stdout, ok.stderr
    long = invoke("estimate", "full_gc", "--model", str(tmp_path), "--seq-len", "65", "--batch-size", "1")
    assert long.returncode == 2 and "at most 64 tokens" in " ".join(long.stderr.split())
