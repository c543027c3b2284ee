"""The causal-LM loss in each of its forms (``--loss``): recorded on CPU through profkit's loop and through the
Trainer, and estimated on the meta device; the loss' copies of the logits are what differ, so activations at the
forward's peak and the peak itself must agree to within a few bytes."""

from __future__ import annotations

import json

import pytest

from profkit.core.methods import LOSSES
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
