"""``profkit estimate`` and ``recommend``: predictions checked against runs recorded on the ``tiny`` preset, exact
counts on the 3B preset's meta model, and bad input.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_estimate.py``."""

import json

import pandas as pd
import pytest

from profkit import store
from profkit.analyze import analyze_lifetimes, breakdown, predicted_vs_measured
from profkit.analyze.lifetimes import load_lifetimes
from profkit.core.methods import METHODS
from profkit.core.presets import get_preset
from profkit.core.units import parse_bytes
from tests.conftest import TINY_TRAINING, invoke, run_cli

TRAINING = TINY_TRAINING  # what the tiny fixture records


EXACT = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "optimizer_state", "gradients")


def _holds(p: pd.DataFrame) -> None:
    assert set(EXACT) | {"activations", "peak"} <= set(p.index)
    for category in EXACT:
        row = p.loc[category]
        assert abs(row.predicted_bytes - row.measured_bytes) <= 0.01 * row.measured_bytes, (category, row.to_dict())
    act = p.loc["activations"]
    assert act.measured_bytes > 0
    assert abs(act.error) <= 0.15, act.to_dict()


@pytest.mark.parametrize("name", TRAINING)
def test_prediction_matches_measurement_on_tiny(tiny_training, name):
    bd = breakdown([tiny_training / name])
    assert not bd.failed, bd.problems
    _holds(bd.predicted.set_index("category"))


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.zero_stage])
def test_prediction_matches_measurement_for_zero_at_one_rank(matrix, name):
    """Every ZeRO method as the micro matrix records it on one process: DeepSpeed's buffers, flat fp32 partition
    and its optimizer state, to the same targets."""
    bd = breakdown([matrix / name])
    assert not bd.failed, bd.problems
    _holds(bd.predicted.set_index("category"))


@pytest.mark.parametrize("name", TRAINING)
def test_prediction_matches_the_storage_lifetimes_too(tiny_training, name):
    """Where torch's export fails (it does now and then, on one rank of two), the storage lifetimes are the
    measurement: they must hold the estimate to the same targets."""
    record = breakdown([tiny_training / name]).records[name]
    own = analyze_lifetimes(record, load_lifetimes(tiny_training / name / store.STORAGE_LIFETIMES))
    _holds(predicted_vs_measured(record.estimate, own.rows, own.measured).set_index("category"))


def test_breakdown_shows_predicted_beside_measured(tiny_training):
    table = invoke("breakdown", str(tiny_training / "lora_gc"))
    assert table.returncode == 0, table.stderr
    assert "error against measured" in table.stdout and "│ activations" in table.stdout
    markdown = invoke("breakdown", str(tiny_training / "lora_gc"), "--format", "markdown").stdout
    assert "## Memory predicted / measured (error)" in markdown and "activations (forward)" in markdown
    records = json.loads(invoke("breakdown", str(tiny_training / "lora_gc"), "--format", "json").stdout)["runs"]
    compared = {r["category"]: r for r in records[0]["predicted_vs_measured"]}
    assert compared["gradients"]["phase"] == "optimizer" and compared["activations"]["phase"] == "forward"


def test_recommend_ranks_measured_runs_by_step_time(tiny_training):
    result = invoke("recommend", str(tiny_training), "--budget", "200MiB")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if "measured" in line and "MiB" in line]
    assert rows and "zero" not in " ".join(rows)  # ZeRO's 2 GB reduce bucket does not fit
    bd = breakdown([tiny_training])
    fitting = bd.runs[bd.runs.measured_peak_bytes <= parse_bytes("200MiB")].sort_values("clean_step_time_s")
    assert fitting.run.iloc[0] in rows[0]


def test_recommend_when_nothing_fits_shows_the_closest(tiny_training):
    result = invoke("recommend", str(tiny_training), "--budget", "1MiB")
    assert result.returncode == 1
    assert "Nothing fits" in result.stdout and "closest" in result.stdout


def test_recommend_without_runs_orders_by_known_time_costs_not_by_peak():
    """The larger-peak-first order put qlora_zero3 first on one GPU; fewer and lighter measures come first now (on
    micro every method fits, so the order is the measures' alone); the CLI end to end, in its own process."""
    result = run_cli("recommend", "--budget", "24GB", "--preset", "micro", env={"COLUMNS": "200"})
    assert result.returncode == 0, result.stderr
    order = [line.split("│")[2].strip() for line in result.stdout.splitlines() if "│ estimated" in line]
    assert order[0] in ("full", "lora") and order.index("lora") < order.index("qlora_zero3_gc")
    assert order.index("lora_gc") < order.index("lora_zero3_gc") < order.index("qlora_zero3_gc")
    assert not result.stderr.strip()  # no library chatter
    assert "not a measurement" in result.stdout.replace("\n", " ")


@pytest.mark.parametrize("upcast", ["--kbit-upcast", "--no-kbit-upcast"])
@pytest.mark.long
def test_qlora_with_and_without_the_kbit_upcast_is_recorded_and_estimated_alike(upcast, tmp_path):
    """peft's k-bit preparation casts the unquantized weights to fp32 (the residual stream follows); without it
    (fms-acceleration's preparation) they stay in the load dtype: half the frozen bytes, smaller activations."""
    out = tmp_path / "traces"
    result = run_cli("record", "qlora_gc", "--preset", "micro", upcast, "--precision", "bf16-mixed", "--device",
                     "cpu", "--warmup-steps", "0", "--steps", "1", "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    [run] = [p for p in out.iterdir() if p.is_dir()]
    assert ("no-upcast" in run.name) == (upcast == "--no-kbit-upcast")
    bd = breakdown([run])
    assert not bd.failed, bd.problems
    compared = bd.predicted.set_index("category")
    _holds(compared)
    assert abs(compared.loc["peak"].error) <= 0.01
    frozen = get_preset("micro").config["vocab_size"] * get_preset("micro").config["hidden_size"]
    assert compared.loc["parameters_frozen"].measured_bytes >= frozen * (4 if upcast == "--kbit-upcast" else 2)
