"""Gradient accumulation (``--grad-accum``): recorded through profkit's loop unsharded, with ZeRO-2, ZeRO-3 and
FSDP2, and through the Trainer; estimated. From the second micro-batch on, the summed gradients are alive through
forward and backward, so the peak rises by them, except under ZeRO-3, which keeps its gradient partition at every
instant anyway."""


import pytest

from profkit.core.gpus import GPUS
from profkit.core.methods import get_method, with_overrides
from profkit.core.presets import get_preset
from profkit.core.settings import RunSettings
from profkit.model.build import ESTIMATED_ONLY, setting_unsupported
from profkit.predict.estimate import estimate_run
from profkit.predict.step_time import predict_run


@pytest.mark.parametrize("name, world", [("full", 1), ("full_zero2", 4), ("full_zero3", 4), ("full_fsdp", 4),
                                         ("lora_fsdp", 4)])
def test_the_estimate_holds_the_summed_gradients_per_rank(name, world):
    """On the 3B preset's meta model: what the second micro-batch runs beside, per rank, and the note that says so."""
    settings = RunSettings(name, preset="llama-3.2-3b").resolved()
    once = estimate_run(get_method(name), settings, "cuda", world)
    twice = estimate_run(with_overrides(get_method(name), grad_accum=4), settings, "cuda", world)
    assert twice.method == f"{name}-ga4"
    stepped = once.instants["optimizer"]["gradients"]
    held = {"full": stepped, "full_zero2": stepped, "full_fsdp": stepped, "lora_fsdp": stepped,
            "full_zero3": once.instants["forward"]["gradients"]}[name]
    for instant in ("forward", "backward"):
        assert twice.instants[instant]["gradients"] == held
    if name == "full_zero3":
        # the partition DeepSpeed allocates at initialisation, alive whether it accumulates or not
        assert once.detail["zero3_gradient_partition"] > 0 and twice.peak_bytes == once.peak_bytes
    else:
        assert twice.peak_bytes > once.peak_bytes
    if name != "full":  # a rank's share, not the whole model's gradients
        whole = estimate_run(get_method("full"), settings, "cuda").instants["optimizer"]["gradients"]
        assert held < whole / 2 or name == "lora_fsdp"
    (note,) = [n for n in twice.notes if n.startswith("gradient accumulation over 4 micro-batches")]
    # FSDP's note names the other form (held unsharded until the last micro-batch, as accelerate accumulates)
    assert ("--grad-sync last as accelerate's no_sync" in note) == name.endswith("fsdp")
    if name.endswith("fsdp"):
        unsynced = estimate_run(with_overrides(get_method(name), grad_accum=4, grad_sync="last"), settings, "cuda",
                                world)
        assert unsynced.instants["forward"]["gradients"] > world * held * 0.9  # every trainable gradient whole


@pytest.mark.parametrize("name, world", [("lora", 1), ("full_fsdp", 8), ("full_zero2", 8)])
def test_the_step_time_repeats_forward_and_backward_not_the_optimizer(name, world):
    gpu = GPUS["A100-SXM4-40GB"]
    settings = RunSettings(name, preset="llama-3.2-3b")
    once = predict_run(get_method(name), settings, gpu, world)
    four = predict_run(with_overrides(get_method(name), grad_accum=4), settings, gpu, world)
    for category, seconds in once.by_category.items():
        factor = {"optimizer": 1.0, "communication": 2.5 if name == "full_zero2" else 4.0}.get(category, 4.0)
        assert four.by_category[category] == pytest.approx(factor * seconds, rel=1e-6), category
    assert four.tokens_per_s * four.seconds == pytest.approx(4 * once.tokens_per_s * once.seconds)


@pytest.mark.parametrize("name, world", [("lora_fsdp", 4), ("qlora_fsdp", 2), ("full_fsdp", 4)])
def test_fsdp1_flat_units_hold_gradients_over_their_frozen_weights(name, world):
    """--fsdp-flat (FSDP1, use_orig_params, a unit per decoder layer): a layer with LoRA in it computes its gradient
    over all of its weights, frozen and 4-bit packed ones too; the root, with nothing trainable, holds none; full
    fine-tuning trains every weight, so nothing changes. The optimizer state stays the adapters'. In pure bf16, as
    FSDP1 needs one dtype per flat parameter (litgpt's runs)."""
    settings = RunSettings(name, preset="llama-3.2-3b").resolved()
    method = with_overrides(get_method(name), grad_accum=4, grad_sync="last", precision="bf16-pure")
    per_parameter = estimate_run(method, settings, "cuda", world)
    flat = estimate_run(with_overrides(method, fsdp_flat=True), settings, "cuda", world)
    assert flat.method.endswith("-flat")
    assert flat.instants["optimizer"]["optimizer_state"] == per_parameter.instants["optimizer"]["optimizer_state"]
    if name == "full_fsdp":
        assert flat.instants == per_parameter.instants and flat.peak_bytes == per_parameter.peak_bytes
        return
    layers = per_parameter.detail["fsdp_layer_gathered"] * get_preset(settings.preset).config["num_hidden_layers"]
    frozen = flat.detail["fsdp_flat_frozen_gradients"]
    # every layer's weights, a rank's shard of them (within padding), and nothing of the root (embeddings, head)
    assert layers / world * 0.95 < frozen < layers / world * 1.05
    sharded = flat.detail["fsdp_sharded_gradients"] - per_parameter.detail["fsdp_sharded_gradients"]
    assert sharded == frozen
    # no_sync holds them whole on each rank between micro-batches
    held = flat.instants["forward"]["gradients"] - per_parameter.instants["forward"]["gradients"]
    assert world * frozen * 0.95 < held < world * frozen * 1.05
    assert flat.peak_bytes > per_parameter.peak_bytes
    assert any(n.startswith("--fsdp-flat: FSDP1's flat parameters") for n in flat.notes)


@pytest.mark.parametrize("method, setting, names", [
    ("lora_fsdp", "fsdp_flat", "FSDP2"), ("qlora", "quantize_head", "transformers"),
    ("lora", "keeps_previous_logits", "litgpt"), ("qlora", "bnb_keeps_inputs", "0.43.2"),
    ("lora_gc", "keeps_kv_cache", "llama-recipes"), ("infer_fp16", "buffers_of", "older transformers")])
def test_a_setting_of_another_stack_is_estimated_not_recorded(method, setting, names):
    value = "4.40" if setting == "buffers_of" else True
    reason = setting_unsupported(with_overrides(get_method(method), **{setting: value}), "cpu")
    assert reason and names in reason and "estimated" in reason
    assert setting in {field for field, *_ in ESTIMATED_ONLY}
