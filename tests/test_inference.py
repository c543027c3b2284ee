"""Inference as users measure it: prefill and decode labelled in the traces, time to first token and time per
output token from the unprofiled steps, and the KV cache found as the cache's tensors, checked to the byte
against the model's configuration."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from profkit.core.methods import get_method, with_overrides
from profkit.core.presets import get_preset
from profkit.predict.estimate import estimate, kv_cache_bytes


def test_estimate_cli_for_generation():
    from typer.testing import CliRunner

    from profkit.cli import app

    runner = CliRunner()  # in-process: the command parses and calls the estimator, a subprocess adds nothing
    out = runner.invoke(app, ["estimate", "infer_int4", "infer_fp16", "--preset", "micro", "--device", "cpu",
                              "--seq-len", "40", "--max-new-tokens", "9", "--format", "json"])
    assert out.exit_code == 0, out.output
    config = AutoConfig.for_model(**get_preset("micro").config)
    for e in json.loads(out.stdout):
        assert e["settings"]["batch_size"] == 1 and set(e["instants"]) == {"prefill", "decode"}
        assert e["instants"]["decode"]["kv_cache"] == kv_cache_bytes(config, 1, 40 + 9 - 1, 4)
        assert e["instants"]["prefill"]["kv_cache"] == kv_cache_bytes(config, 1, 40, 4)
    table = runner.invoke(app, ["estimate", "infer_int4", "--preset", "micro"], env={"COLUMNS": "80"})
    assert table.exit_code == 0 and "kv_cache" in table.stdout and "prompt 64 + 8 new tokens" in table.stdout
    assert "reserved (est.)" in table.stdout  # the default target is CUDA
    assert all(len(line) <= 80 for line in table.stdout.splitlines())


@pytest.mark.parametrize("family", [
    dict(model_type="llama", hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, vocab_size=4096),
    dict(model_type="gpt_bigcode", n_embd=64, n_inner=192, n_layer=2, n_head=4, multi_query=True, vocab_size=4096,
         n_positions=256, bos_token_id=0, eos_token_id=0),
], ids=lambda f: f["model_type"])
def test_generate_as_older_transformers_ran_it(family):
    """transformers before 4.36 returned new cache tuples from each pass while the previous pass's lived: the last
    pass holds the previous cache beside the new one. Before 4.45 the prompt pass computed every position's logits
    (Llama-family models upcast them to fp32 in the forward): the prompt pass holds them."""
    spec = dict(family)
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    batch, prompt, new = 2, 48, 7

    def run(**overrides):
        return estimate(with_overrides(get_method("infer_fp16"), **overrides), config, batch, prompt, 1, "cuda",
                        new_tokens=new).instants

    today, tuples = run(), run(kv_cache="tuples")
    previous = kv_cache_bytes(config, batch, prompt + new - 2, 2)
    assert tuples["decode"]["activations"] - today["decode"]["activations"] == previous
    assert tuples["prefill"] == today["prefill"]
    logits = batch * prompt * 4096
    for form, itemsize in (("all", 2), ("all-fp32", 2 + 4)):
        prefill = run(prefill_logits=form)["prefill"]["activations"]
        assert logits * itemsize <= prefill <= logits * itemsize + today["prefill"]["activations"], form


def test_a_sliding_window_cache_is_lengthened_to_its_window_with_eager_attention():
    """The decode pass is estimated on a cache lengthened on the meta device: a sliding-window layer keeps its window
    and counts every position, so eager attention's mask (built from that count) fits the keys it is given."""
    config = AutoConfig.for_model("mistral", hidden_size=64, intermediate_size=192, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=4096, sliding_window=32)
    batch, prompt, new = 2, 24, 40
    for attention in ("sdpa", "eager"):
        e = estimate(with_overrides(get_method("infer_fp16"), attention=attention), config, batch, prompt, 1,
                     "cuda", new_tokens=new)
        # two layers of keys and values, batch x kv heads x head dim each: the window's last 31 positions, a view of
        # the 32 the pass's concatenation made (whose storage stays alive)
        assert e.instants["decode"]["kv_cache"] == 2 * 2 * batch * 2 * 16 * 32 * 2, attention
