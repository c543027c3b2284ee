"""The estimate across model families: mixtures of experts (Mixtral; Qwen2-MoE with a shared expert, as the
``micro-moe`` preset), multi-query attention (GPTBigCode), Gemma 2 (no sdpa: eager attention, sliding window) and
tied embeddings. One table drives every case: the meta-device estimate beside a CPU recording of the same tiny
model (random weights) through ``profkit.Session``; the static categories must agree to the byte."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoModelForCausalLM

from profkit.core.methods import UnsupportedError, get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.model.build import build_model, position_limit
from profkit.predict.estimate import EstimateError, estimate
from tests.conftest import invoke
from tests.families import SMALL


def _config(model_type: str, **extra):
    return AutoConfig.for_model(model_type, **{**SMALL, **extra})


# Meta-device estimates on a CUDA target of what a CPU cannot record (ZeRO over two ranks, 4-bit generation),
# over more families: each is estimated, or refused with a reason, never a traceback.
CONFIGS = {
    "qwen2_moe": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "qwen3_moe": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32),
    "deepseek_v3": dict(num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=1, q_lora_rank=32, kv_lora_rank=16,
                        qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1),
    "mixtral": dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
    "mistral": dict(num_key_value_heads=2, sliding_window=16),
    "gemma": dict(num_key_value_heads=1, head_dim=16),
    "gemma2": dict(num_key_value_heads=2, head_dim=16, sliding_window=16),
    "phi3": dict(num_key_value_heads=4, pad_token_id=0),
    "biogpt": dict(),  # makes its own all-ones attention mask, which transformers tests for padding
}


@pytest.mark.parametrize("model_type", CONFIGS)
@pytest.mark.parametrize("name", ["full_gc", "qlora", "lora_zero3", "infer_int4"])
def test_every_family_is_estimated_on_a_cuda_target(model_type, name):
    config = _config(model_type, **CONFIGS[model_type])
    e = estimate(get_method(name), config, 2, 32, 2 if "zero" in name else 1, "cuda", model_type)
    assert e.peak_bytes > sum(e.at_peak()[c] for c in ("parameters_trainable", "parameters_frozen",
                                                         "parameters_quantized"))
    if model_type == "gemma2":
        assert any("eager attention" in n for n in e.notes)


def test_autocast_lowers_what_cuda_autocast_lowers():
    """BLOOM's ALiBi attention scores come from ``baddbmm``, which CUDA autocast runs in bf16 (as it does addmm,
    convolutions and the rest of its list); fp32 inputs beside bf16 ones had failed the meta forward."""
    e = estimate(get_method("full_gc"), _config("bloom", n_embed=64, n_layer=2, n_head=4), 2, 32, 1, "cuda", "bloom")
    assert e.peak_bytes > e.at_peak()["parameters_trainable"]


def test_the_models_own_code_refusing_a_config_is_named_not_a_traceback():
    """DeepSeek-V2 with no experts per token set: its router's topk fails inside transformers."""
    config = _config("deepseek_v2", num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=None,
                     moe_intermediate_size=32, first_k_dense_replace=0, n_group=1, topk_group=1)
    with pytest.raises(EstimateError, match=r"the model's code cannot build or run this config \(TypeError in "
                                            r"transformers/models/deepseek_v2/modeling_deepseek_v2.py:\d+"):
        estimate(get_method("lora"), config, 1, 16, 1, "cuda", "deepseek_v2")


def test_experts_stay_16_bit_under_qlora_and_frozen_experts_save_no_input():
    """bitsandbytes quantizes Linear layers; transformers keeps each layer's experts as one 3-D parameter, so under
    QLoRA they stay unquantized (peft's k-bit preparation makes them fp32). Their grouped matmul saves the experts
    for the input's gradient, not the input (the experts need none)."""
    config = _config("mixtral", **CONFIGS["mixtral"])
    qlora = estimate(get_method("qlora"), config, 2, 32, 1, "cuda", "mixtral")
    experts = 2 * 4 * (2 * 192 * 64 + 64 * 192)  # layers x experts x (gate_up + down)
    assert qlora.at_peak()["parameters_frozen"] >= experts * 4
    assert any(f"{experts:,} expert weights" in n and "fp32 after peft's k-bit preparation" in n for n in qlora.notes)
    lora = estimate(get_method("lora"), config, 2, 32, 1, "cuda", "mixtral")
    full = estimate(get_method("full"), config, 2, 32, 1, "cuda", "mixtral")
    assert full.detail["saved_layers_total"] > lora.detail["saved_layers_total"]


@pytest.mark.parametrize("config, method, reason", [
    (("gpt_bigcode", dict(n_embd=64, n_layer=2, n_head=4, multi_query=True)), "lora",
     "peft's default for gpt_bigcode: c_attn"),
    (("falcon", dict(multi_query=True)), "qlora", "query_key_value"),
    (("phi3", dict(pad_token_id=32000)), "full", "Padding_idx must be within num_embeddings"),
    (("gpt_bigcode", dict(n_embd=64, n_layer=2, n_head=4, n_positions=16)), "full", "at most 16 tokens"),
    (("gpt2", dict(n_embd=64, n_layer=2, n_head=4, n_positions=16)), "infer_fp16", "at most 16 tokens"),
    (("jamba", dict(num_key_value_heads=2, attn_layer_period=2, attn_layer_offset=1)), "full_gc-keeps-kv-cache",
     "Jamba caches its state-space layers' states"),
])
def test_what_cannot_be_built_is_refused_with_its_reason(config, method, reason):
    name, _, setting = method.partition("-")
    method = with_overrides(get_method(name), keeps_kv_cache=True) if setting else get_method(name)
    with pytest.raises(EstimateError, match=reason):
        estimate(method, _config(config[0], **config[1]), 2, 32, 1, "cuda", config[0])


def test_a_sequence_past_learned_positions_is_refused_before_a_recording_runs(family_checkpoints):
    """GPTBigCode learns 256 positions here; a rotary model (Mixtral) has no such limit."""
    settings = RunSettings(method="full", model_path=str(family_checkpoints["gpt_bigcode"]), seq_len=257)
    with pytest.raises(UnsupportedError, match="at most 256 tokens"):
        build_model(get_method("full"), settings, "cpu")
    assert position_limit(AutoModelForCausalLM.from_config(_config("mixtral"))) is None
    assert estimate(get_method("full"), _config("gpt_bigcode", n_embd=64, n_layer=2, n_head=4, n_positions=32),
                    1, 32, 1, "cuda", "gpt_bigcode").peak_bytes > 0


def test_the_moe_preset_through_the_cli():
    result = invoke("estimate", "full", "qlora", "--preset", "micro-moe", "--format", "json")
    assert result.returncode == 0, result.stderr
    estimates = {e["method"]: e for e in json.loads(result.stdout)}
    assert estimates["qlora"]["params"]["quantized"] > 0
    assert estimates["full"]["params"]["trainable"] == \
        estimates["qlora"]["params"]["quantized"] + estimates["qlora"]["params"]["frozen"]
