"""``profkit fit``: the largest batch and the longest sequence that fit a device. The search scales a few full
estimates instead of tracing the model at every point; here each boundary it finds is held to the full estimate
(the model traced at that very setting) at the boundary and one step past it, on every training method."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from profkit.core.methods import METHODS, get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.model.build import model_config
from profkit.predict.estimate import estimate_run
from profkit.predict.fit import (BATCH, SEQUENCE, STEP, Device, NotScalable, Scaling, _interpolate, accumulated,
                                 boundary, sequence_limit, variants)
from tests.conftest import invoke

TRAINING = [name for name, m in METHODS.items() if m.kind == "train"]


def _search(preset: str, name: str, dimension: str):
    method = get_method(name)
    ranks = 2 if method.sharded else 1
    settings = RunSettings(method=name, preset=preset).resolved()

    def full(s):
        return estimate_run(method, s, "cuda", ranks)

    first = full(settings)
    outside = sum(first.device_used()["outside_allocator"].values())
    # A device with room for a few times the preset's own step: the boundary lands well inside the search.
    device = Device(int((outside + 4 * first.reserved()["bytes"]) / 0.95), 0.05)
    limit = sequence_limit(model_config(settings)) if dimension == SEQUENCE else None
    return boundary(method, dimension, settings, device, full, limit), device, full, settings


# Along the sequence, every method in `make test-all`; here one of each kind of step (ZeRO's estimate is not
# replayed, FSDP's accounting takes the larger of two parts and so needs the second try).
SEQUENCE_HERE = {"lora", "qlora_gc", "full", "lora_zero3", "full_fsdp", "qlora_fsdp_gc"}
CASES = [pytest.param(name, dimension, marks=[] if dimension == BATCH or name in SEQUENCE_HERE else [pytest.mark.long])
         for dimension in (BATCH, SEQUENCE) for name in TRAINING]


@pytest.mark.parametrize("name, dimension", CASES)
def test_each_boundary_is_where_the_full_estimate_stops_fitting(name, dimension):
    found, device, full, settings = _search("micro", name, dimension)
    assert found.searched.startswith("interpolated"), found.searched
    assert found.largest is not None and found.largest > 1
    at = device.check(full(replace(settings, **{dimension: found.largest})))
    assert at["fits"]
    # What the search checked at the boundary is what the full estimate gives there, byte for byte.
    assert (found.at["peak_bytes"], found.at["reserved_bytes"]) == (at["peak_bytes"], at["reserved_bytes"])
    if found.past is None:  # fits up to the model's longest sequence
        assert dimension == SEQUENCE and found.largest == found.limit
        return
    past = device.check(full(replace(settings, **{dimension: found.largest + STEP[dimension]})))
    assert not past["fits"]
    assert (found.past["peak_bytes"], found.past["reserved_bytes"]) == (past["peak_bytes"], past["reserved_bytes"])


@pytest.mark.parametrize("name", ["lora_gc", "qlora", "full_fsdp_gc"])
def test_on_a_larger_preset_too(name):
    found, device, full, settings = _search("tiny", name, BATCH)
    assert found.searched.startswith("interpolated") and found.past is not None
    assert device.check(full(replace(settings, batch_size=found.largest)))["fits"]
    assert not device.check(full(replace(settings, batch_size=found.largest + 1)))["fits"]


@pytest.mark.parametrize("name", ["lora", "full_gc"])
def test_an_effective_batch_is_the_largest_micro_batch_that_divides_it_and_fits_with_accumulation(name):
    found, device, full, settings = _search("micro", name, BATCH)
    method = get_method(name)

    def each(m, s):
        return estimate_run(m, s, "cuda")

    effective = 2 * (found.largest + 1)  # more than fits at once: accumulated
    a = accumulated(method, effective, 1, found, settings, device, each)
    assert a.micro * a.accumulation == effective and a.accumulation > 1 and a.check["fits"]
    assert a.method.grad_accum == a.accumulation
    # The accumulated gradients held through the next forward cost room: never a larger micro-batch than at once.
    assert a.micro <= a.boundary.largest <= found.largest
    # The next divisor of the effective batch, accumulating, does not fit: the micro-batch is the largest one.
    larger = next(d for d in range(a.micro + 1, effective + 1) if effective % d == 0)
    accumulating = with_overrides(method, grad_accum=effective // larger) if larger < effective else method
    assert not device.check(each(accumulating, replace(settings, batch_size=larger)))["fits"]
    # An effective batch that fits at once is one micro-batch, without accumulation.
    once = accumulated(method, found.largest, 1, found, settings, device, each)
    assert (once.micro, once.accumulation, once.check["fits"]) == (found.largest, 1, True)


def test_fit_ranks_the_accumulated_settings_and_refuses_an_uneven_share():
    result = invoke("fit", "lora", "--preset", "micro", "--budget", "1GiB", "--effective-batch", "512",
                    "--format", "json")
    assert result.returncode == 0, result.stderr
    [lora] = json.loads(result.stdout)["methods"]
    eff = lora["effective_batch"]
    assert eff["micro_batch"] * eff["accumulation"] == 512 and eff["accumulation"] > 1 and eff["check"]["fits"]
    assert eff["micro_batch"] <= lora["largest_batch"]["largest"]
    bad = invoke("fit", "lora", "--preset", "micro", "--budget", "1GiB", "--effective-batch", "3",
                 "--world-size", "2")
    assert bad.returncode == 2 and "multiple of --world-size" in bad.stderr


def test_variants_are_each_method_in_what_the_user_lets_vary_where_it_applies():
    full, zero = get_method("full"), get_method("lora_zero3")
    labels = [m.label for m in variants([full, zero], ["offload"])]
    assert labels == ["full", "lora_zero3", "lora_zero3-offload-optimizer", "lora_zero3-offload-optimizer-params"]
    assert [m.label for m in variants([get_method("lora_zero2")], ["offload"])] == [  # ZeRO-2 offloads no params
        "lora_zero2", "lora_zero2-offload-optimizer"]
    both = [m.label for m in variants([full], ["optimizer", "loss"])]
    assert len(both) == 6 and both[0] == "full" and len(set(both)) == 6  # 3 optimizers x 2 losses
    with pytest.raises(ValueError, match="valid: optimizer, loss, offload"):
        variants([full], ["precision"])


def test_fit_varies_the_optimizer_and_an_8bit_state_leaves_room_for_more():
    result = invoke("fit", "full", "--preset", "micro", "--budget", "1GiB", "--vary", "optimizer", "-f", "json")
    assert result.returncode == 0, result.stderr
    rows = {r["method"]: r for r in json.loads(result.stdout)["methods"]}
    assert set(rows) == {"full", "full-adamw-8bit", "full-paged-adamw-8bit"}
    largest = {m: r["largest_batch"]["largest"] for m, r in rows.items()}
    assert largest["full-adamw-8bit"] >= largest["full"]
    at = rows["full"]["largest_batch"]["at"]
    assert at["headroom_bytes"] == json.loads(result.stdout)["device"]["usable_bytes"] - at["device_used_bytes"] >= 0
    bad = invoke("fit", "full", "--preset", "micro", "--budget", "1GiB", "--vary", "precision")
    assert bad.returncode == 2 and "valid: optimizer, loss, offload" in bad.stderr


def test_a_single_row_is_no_sample_point_and_a_fraction_is_no_size():
    """At batch 1 some tensors are views that need a copy from two rows up: samples of different structure are
    refused, never interpolated; so is a size that is not a whole number of bytes."""
    method = get_method("lora")
    settings = RunSettings(method="lora", preset="micro").resolved()
    with pytest.raises(NotScalable, match="order or number"):
        Scaling(BATCH, {b: estimate_run(method, replace(settings, batch_size=b), "cuda") for b in (1, 2)})
    assert _interpolate([2, 3], [10, 20], 5) == 40
    with pytest.raises(NotScalable):
        _interpolate([2, 4], [10, 11], 3)


def test_fit_cli_in_json_and_at_80_columns():
    result = invoke("fit", "lora", "qlora_gc", "--preset", "micro", "--budget", "1GiB", "--format", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["device"]["usable_bytes"] == int(2**30 * 0.95)
    lora = out["methods"][0]
    assert lora["method"] == "lora" and lora["largest_batch"]["at"]["fits"]
    assert not lora["largest_batch"]["one_step_past"]["fits"]
    assert lora["largest_batch"]["one_step_past"]["device_used_bytes"] > lora["largest_batch"]["at"]["device_used_bytes"]
    table = invoke("fit", "lora", "--preset", "micro", "--budget", "1GiB", env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert all(len(line) <= 80 for line in table.stdout.splitlines())
    assert f"{lora['largest_batch']['largest']:,}" in table.stdout and "does not fit" in table.stdout


def test_nothing_fits_names_the_smallest_setting_and_bad_input_exits_2():
    small = invoke("fit", "lora", "full", "--preset", "micro", "--budget", "300MiB")
    assert small.returncode == 1, small.stdout + small.stderr
    assert "Nothing fits" in small.stdout and "at batch 1 x" in small.stdout
    for args, said in ((["--budget", "lots"], "--budget"), (["--gpu", "A1000"], "A100-SXM4-80GB"),
                       (["--gpu", "RTX-4090", "--budget", "8GiB"], "one of them"), ([], "--gpu NAME"),
                       (["--budget", "8GiB", "nonsense"], "lora")):
        bad = invoke("fit", *args, "--preset", "micro")
        assert bad.returncode == 2 and said in bad.stderr, (args, bad.stderr)


@pytest.mark.long
def test_the_readmes_worked_example_is_what_fit_says():
    """The README's `fit` example from axolotl's config: the figures it shows are the command's."""
    from pathlib import Path

    root = Path(__file__).parents[2]
    config = root / "tests/data/configs/axolotl/llama-3.2-1b-lora.yml"
    result = invoke("fit", "--config", str(config), "--gpu", "L4", "-f", "json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)["methods"]
    batch, seq = row["largest_batch"]["largest"], row["longest_sequence"]["largest"]
    readme = (root / "README.md").read_text()
    shown = next(line for line in readme.splitlines() if line.startswith(f"│ {row['method']} "))
    assert [c.strip() for c in shown.split("│")[2:4]] == [f"{batch:,}", f"{seq:,}"], shown
    assert f"Batch {batch} fits at 2,048 tokens; batch {batch + 1}" in readme
