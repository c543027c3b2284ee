"""FSDP2 (``fully_shard``): every FSDP method recorded at two ranks under torchrun (gloo) on micro and held, rank by
rank, to the estimate the run made before it started; a user's own FSDP2 script under ``profkit.Session``; the
settings and the refusals; FSDP beside ZeRO-3."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoConfig

from profkit.core.methods import METHODS, UnsupportedError, get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.launch.workload import build
from profkit.model.build import plan
from profkit.predict.estimate import estimate, estimate_run
from tests.conftest import FSDP_METHODS, invoke


def test_the_registry_has_fsdp_beside_zero():
    assert FSDP_METHODS == ["full_fsdp", "full_fsdp_gc", "lora_fsdp", "lora_fsdp_gc", "qlora_fsdp", "qlora_fsdp_gc"]
    for name in FSDP_METHODS:
        m = METHODS[name]
        assert m.fsdp and m.sharded and not m.zero_stage and m.reshard_after_forward
        assert m.gradient_checkpointing == name.endswith("_gc")


def test_settings_map_onto_fully_shard():
    lora = get_method("lora_fsdp")
    changed = with_overrides(lora, reshard_after_forward=False, offload="optimizer+params")
    assert (changed.reshard_after_forward, changed.offload, changed.label) == (
        False, "optimizer+params", "lora_fsdp-offload-optimizer-params-no-reshard")
    # Mixed precision is FSDP's policy, not autocast; 4-bit weights are packed into the frozen weights' dtype.
    mixed = with_overrides(get_method("qlora_fsdp"), precision="bf16-mixed")
    p = plan(mixed, "cuda", torch.bfloat16)
    assert p.autocast is None and p.fsdp_param_dtype == torch.bfloat16
    # Through the Trainer, accelerate runs autocast beside the policy.
    assert plan(mixed, "cuda", torch.bfloat16, "trainer").autocast == torch.bfloat16
    assert p.quantization.bnb_4bit_quant_storage == p.load_dtype == torch.bfloat16
    assert plan(get_method("qlora"), "cuda", torch.bfloat16).autocast == torch.bfloat16


@pytest.mark.parametrize("method, overrides, message", [
    ("lora_fsdp", {"offload": "optimizer"}, "FSDP's CPU offload moves the parameters' shards"),
    ("lora", {"reshard_after_forward": False}, "applies to FSDP methods"),
])
def test_settings_that_make_no_sense_are_refused(method, overrides, message):
    with pytest.raises(ValueError, match=message):
        with_overrides(get_method(method), **overrides)


def test_the_trainer_on_cpu_is_unsupported_with_accelerates_reason():
    with pytest.raises(UnsupportedError, match="accelerate enables its FSDP plugin on accelerators only"):
        build(get_method("lora_fsdp"), RunSettings(method="lora_fsdp", preset="micro", engine="trainer"), "cpu")


def test_the_estimate_answers_fsdp_or_zero3():
    """What each rank holds under each, for the 3B preset on 4 GPUs: FSDP keeps no fp32 master copy."""
    settings = RunSettings(method="full_fsdp", preset="llama-3.2-3b")
    fsdp = estimate_run(get_method("full_fsdp"), settings, "cuda", 4)
    zero3 = estimate_run(get_method("full_zero3"), settings, "cuda", 4)
    assert fsdp.instants["optimizer"]["optimizer_state"] < zero3.instants["optimizer"]["optimizer_state"]
    one = estimate_run(get_method("full_fsdp"), settings, "cuda", 1)
    assert fsdp.instants["optimizer"]["parameters_trainable"] * 4 == pytest.approx(
        one.instants["optimizer"]["parameters_trainable"], rel=1e-3)
    assert fsdp.instants["backward"]["parameters_unsharded"] > 0 and any("FSDP2 over 4" in n for n in fsdp.notes)


@pytest.mark.parametrize("method", ["lora_zero2", "full_zero3", "full_fsdp", "qlora_fsdp"])
def test_offload_moves_state_to_the_host_and_says_how_much(method):
    """What offload takes off the GPU is what the host holds: the optimizer state (and ZeRO's fp32 master), the
    gradient shards the host optimizer steps on, and with parameters the shards (FSDP) or partitions (ZeRO-3)."""
    settings = RunSettings(method=method, preset="micro")
    kept = estimate_run(get_method(method), settings, "cuda", 2)
    offload = "optimizer" if method == "lora_zero2" else "optimizer+params"
    moved = estimate_run(with_overrides(get_method(method), offload=offload), settings, "cuda", 2)
    assert moved.host["optimizer_state"] == kept.instants["optimizer"]["optimizer_state"] > 0
    assert moved.instants["optimizer"]["optimizer_state"] == 0 and moved.to_json()["host_bytes"] > 0
    assert moved.host["gradients"] > 0
    if offload == "optimizer+params":
        parameters = ("parameters_trainable", "parameters_frozen", "parameters_quantized")
        assert sum(moved.host.get(c, 0) for c in parameters) > 0
        for c in parameters:  # what leaves the device is what the host holds; ZeRO-3 keeps what it persists
            assert moved.instants["optimizer"][c] + moved.host.get(c, 0) == kept.instants["optimizer"][c], c
        if method == "qlora_fsdp":
            assert moved.instants["optimizer"]["parameters_trainable"] == 0
    assert moved.peak_bytes < kept.peak_bytes


def test_zero3_partitions_4bit_weights_and_offload_moves_them_to_the_host():
    """A 7B-shaped Llama (two layers: the same weight shapes, far above DeepSpeed's persistence threshold): ZeRO-3
    on 4 ranks holds a quarter of each packed 4-bit weight and all of its quantization state; offloading parameters
    moves those quarters to the host, and the quantization state stays."""
    config = AutoConfig.for_model("llama", hidden_size=4096, intermediate_size=11008, num_hidden_layers=2,
                                  num_attention_heads=32, vocab_size=32000)
    whole = estimate(get_method("qlora_zero3_gc"), config, 1, 256, 1).instants["optimizer"]["parameters_quantized"]
    packed = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008) // 2  # two values a byte
    state = whole - packed
    shared = estimate(get_method("qlora_zero3_gc"), config, 1, 256, 4)
    assert shared.instants["optimizer"]["parameters_quantized"] == packed // 4 + state
    moved = estimate(with_overrides(get_method("qlora_zero3_gc"), offload="optimizer+params"), config, 1, 256, 4)
    assert moved.instants["optimizer"]["parameters_quantized"] == state
    assert moved.host["parameters_quantized"] == packed // 4


def test_the_trainers_fsdp_is_estimated_with_accelerates_autocast():
    """Through the Trainer (--stack trainer), accelerate runs autocast beside FSDP's mixed precision; profkit's loop
    does not. The estimate says which it took. On a LayerNorm model autocast's fp32 norms make the activations
    larger; Llama's norms upcast by themselves, so there it changes nothing."""
    runs = {}
    for engine in ("loop", "trainer"):
        result = invoke("estimate", "lora_fsdp", "--stack", {"loop": "loop=profkit", "trainer": "trainer"}[engine],
                        "--precision", "bf16-mixed", "--world-size", "2", "--preset", "micro", "--format", "json")
        assert result.returncode == 0, result.stderr
        [runs[engine]] = json.loads(result.stdout)
    assert runs["trainer"]["settings"]["engine"] == "trainer"
    assert any("the Trainer's bfloat16 autocast beside it" in n for n in runs["trainer"]["notes"])
    assert any("no autocast (profkit's loop" in n for n in runs["loop"]["notes"])
    assert runs["trainer"]["instants"] == runs["loop"]["instants"]
    gpt2 = AutoConfig.for_model("gpt2", n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256,
                                bos_token_id=0, eos_token_id=0)
    method = with_overrides(get_method("full_fsdp"), precision="bf16-mixed")
    loop, trainer = (estimate(method, gpt2, 2, 32, 2, "cuda", "gpt2", engine).instants["forward"]
                     for engine in ("loop", "trainer"))
    assert {k: v for k, v in loop.items() if k != "activations"} == {k: v for k, v in trainer.items()
                                                                     if k != "activations"}
    assert trainer["activations"] > loop["activations"]
