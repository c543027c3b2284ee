"""The causal-LM loss in each of its forms (``--loss``): recorded on CPU through profkit's loop and through the
Trainer, and estimated on the meta device; the loss' copies of the logits are what differ, so activations at the
forward's peak and the peak itself must agree to within a few bytes."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig

from profkit.core.methods import LOSSES, get_method, with_overrides
from profkit.predict.estimate import estimate
from tests.conftest import invoke, recorded, run_cli


@pytest.mark.parametrize("loss, engine, precision", [
    *[(loss, "loop", "bf16-pure") for loss in LOSSES],
    ("logits-dtype", "trainer", "auto"),  # the Trainer's compute_loss_func, fp32 on CPU: the shifted copy alone
])
def test_each_loss_form_is_recorded_and_estimated_alike(loss, engine, precision, tmp_path):
    out = tmp_path / "traces"
    result = run_cli("record", "full", "--preset", "micro", "--loss", loss, "--precision", precision, "--engine",
                     engine, "--device", "cpu", "--warmup-steps", "0", "--steps", "1", "-o", str(out))
    assert result.returncode == 0, recorded(result, out)
    [run] = [p for p in out.iterdir() if p.is_dir()]
    assert (loss == "fp32") != (f"loss-{loss}" in run.name)  # the default leaves the name alone
    shown = run_cli("breakdown", str(run), "--format", "json")
    assert shown.returncode == 0, shown.stderr
    compared = {r["category"]: r for r in json.loads(shown.stdout)["runs"][0]["predicted_vs_measured"]}
    for category in ("activations", "peak"):
        assert abs(compared[category]["error"]) <= 0.001, compared[category]
    assert compared["activations"]["phase"] == "forward"
    narrow = invoke("breakdown", str(run), env={"COLUMNS": "80"}).stdout  # a long run name at 80 columns
    assert "…" not in narrow and all(len(line) <= 80 for line in narrow.splitlines())


def test_under_autocast_the_notes_alternative_loss_holds_what_it_says():
    """Under autocast a 16-bit model loss' nll_loss already runs on an fp32 copy, so the note says the fp32 form
    holds about as much; the two estimates' backward peaks must agree (within 1%) for that to be true."""
    config = AutoConfig.for_model("gpt_bigcode", n_embd=64, n_layer=2, n_head=4, multi_query=True, n_positions=128,
                                  vocab_size=4096, bos_token_id=0, eos_token_id=0)
    peaks, notes = {}, {}
    for loss in ("logits-dtype", "fp32"):
        method = with_overrides(get_method("qlora_gc"), loss=loss, kbit_upcast=False, lora_targets=("c_attn",))
        e = estimate(method, config, 2, 128, 1, "cuda")
        peaks[loss] = sum(e.instants["backward"].values())
        notes[loss] = next(n for n in e.notes if "--loss" in n)
    assert "holds about as much at the backward's peak" in notes["logits-dtype"]
    assert abs(peaks["logits-dtype"] / peaks["fp32"] - 1) <= 0.01, peaks
