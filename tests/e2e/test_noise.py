"""Comparisons that survive the noise: a method against itself (two repetitions, fresh processes) claims no
difference; a change known to matter (gradient checkpointing's recompute) is claimed."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from profkit import store
from profkit.analyze import breakdown, noise, views
from profkit.report import findings
from tests.conftest import invoke, run_cli

REPEATABLE = ["--preset", "micro", "--device", "cpu", "--warmup-steps", "1", "--steps", "4", "--profiled-steps", "2"]


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    out = tmp_path_factory.mktemp("repeats") / "traces"
    result = run_cli("record", "lora", "--repeats", "2", *REPEATABLE, "-o", str(out))
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.long
def test_repetitions_are_one_run_of_fresh_processes(repeated):
    top = json.loads((repeated / "lora" / store.MANIFEST).read_text())
    assert top["status"] == "ok" and top["repeats"] == 2
    assert [r["repetition"] for r in top["repetitions"]] == [0, 1]
    pids = [json.loads((repeated / "lora" / f"rep{k}" / store.MANIFEST).read_text())["pid"] for k in range(2)]
    assert len(set(pids)) == 2  # each in a fresh process
    bd = breakdown([repeated])
    assert list(bd.runs.run) == ["lora/rep0", "lora/rep1"] and set(bd.runs.repetition_of) == {"lora"}
    # Every step's time is kept: min <= median <= max.
    for _, r in bd.runs.iterrows():
        assert r.clean_step_min_s <= r.clean_step_time_s <= r.clean_step_max_s
        assert r.profiled_step_min_s <= r.profiled_step_time_s <= r.profiled_step_max_s


@pytest.mark.long
def test_a_method_against_itself_claims_no_difference(repeated):
    bd = breakdown([repeated])
    (sentence,) = findings.delta_sentences(bd, "lora/rep0")
    assert "no measurable time difference in any category" in sentence
    # On a busy machine a repetition's clean steps may look disturbed: then they are not compared at all.
    disturbed = bd.runs.disturbed.map(lambda d: isinstance(d, str)).any()
    assert ("clean step not compared" if disturbed else "clean step: no measurable difference") in sentence
    out = invoke("breakdown", str(repeated), env={"COLUMNS": "80"})
    assert out.returncode == 0 and "Step times" in out.stdout and "median" in out.stdout


def test_gradient_checkpointings_recompute_is_claimed(matrix):
    bd = breakdown([matrix / "lora", matrix / "lora_gc"])
    tim = views.time_per_step(bd)
    diff = noise.category(bd, "lora", "lora_gc", "recompute", 0.0, float(tim.loc["lora_gc", "recompute"]))
    (every,) = findings.delta_sentences(bd, "lora", top=len(tim.columns))
    (sentence,) = findings.delta_sentences(bd, "lora")
    # The background recording shares two cores with the tests: where lora_gc's threads waited for a CPU while
    # it was profiled, its times are upper bounds only and nothing is claimed from them (ranges from zero).
    if noise.contended(bd, "lora_gc"):
        assert not diff.measurable and "recompute +" not in every
        assert "the category times of lora_gc are upper bounds only: its threads waited for a CPU" in sentence
        return
    assert diff.measurable and diff.value > 0
    assert "recompute +" in every
    # Among the three largest unless a run's steps look disturbed: then the sentence says so.
    if noise.contended(bd, "lora") or bd.runs.disturbed.map(lambda d: isinstance(d, str)).any():
        assert "look disturbed" in sentence or "upper bounds only" in sentence
    else:
        assert "recompute +" in sentence


def test_waiting_for_a_cpu_in_the_profiled_steps_makes_them_upper_bounds(matrix, tmp_path):
    """A run whose threads waited for a CPU while profiled claims no category difference larger than its own
    values can explain; its sentence says why."""
    for run in ("lora", "lora_gc"):
        shutil.copytree(matrix / run, tmp_path / run)
        manifest = tmp_path / run / store.MANIFEST
        record = json.loads(manifest.read_text())
        record["timings"].update(cpu_wait_share=0.0, profiled_cpu_wait_share=0.5 if run == "lora_gc" else 0.0)
        manifest.write_text(json.dumps(record))
    bd = breakdown([tmp_path])
    assert noise.contended(bd, "lora_gc") and not noise.contended(bd, "lora")
    recompute = float(views.time_per_step(bd).loc["lora_gc", "recompute"])
    diff = noise.category(bd, "lora", "lora_gc", "recompute", 0.0, recompute)
    assert diff.b_range[0] == 0.0 and not diff.measurable
    (sentence,) = findings.delta_sentences(bd, "lora")
    assert "the category times of lora_gc are upper bounds only: its threads waited for a CPU for 50%" in sentence
    assert "recompute +" not in sentence
    # The JSON carries the sentence, the threshold and the ranges behind it.
    doc = json.loads(invoke("breakdown", str(tmp_path), "--baseline", "lora", "--format", "json").stdout)
    against = doc["against_baseline"]
    assert against["sentences"] == [sentence] and doc["thresholds"]["contended_wait_share"] == 0.1
    (row,) = [r for r in against["time_differences"] if r["category"] == "recompute"]
    assert row["run"] == "lora_gc" and row["measurable"] is False and row["run_low_s"] == 0.0


@pytest.mark.parametrize("a, b, claimed", [((1.0, 2.0), (2.5, 3.0), True), ((1.0, 2.0), (1.9, 3.0), False),
                                           ((0.0, 0.0), (0.1, 0.2), True), ((1.0, 1.0), (1.0, 1.0), False)])
def test_a_difference_is_claimed_only_when_the_ranges_do_not_overlap(a, b, claimed):
    assert noise.Difference(b[0] - a[0], a, b).measurable is claimed


@pytest.mark.long
def test_the_viewer_opens_each_repetition_of_a_repeated_run(repeated):
    """`profkit view` finds runs as the analysis does: a --repeats run is its repetitions, each one openable."""
    from profkit.report import viewer

    runs = viewer.find_view_runs(repeated)
    assert [r.name for r in runs] == ["lora/rep0", "lora/rep1"]
    state = viewer.ViewerState(repeated, runs, "memory")
    state.open("lora/rep1", "memory")
    events = json.loads(state.current.read_text())["traceEvents"]
    assert any(e.get("ph") == "C" for e in events) and any(e.get("cat") == "profkit_phase" for e in events)


def test_a_damaged_wait_share_is_named_and_left_out(matrix, tmp_path):
    shutil.copytree(matrix / "lora_gc", tmp_path / "lora_gc")
    manifest = tmp_path / "lora_gc" / store.MANIFEST
    record = json.loads(manifest.read_text())
    record["timings"].update(cpu_wait_share="abc", profiled_cpu_wait_share=1.7)
    manifest.write_text(json.dumps(record))
    bd = breakdown([tmp_path])
    row = bd.runs.set_index("run").loc["lora_gc"]
    assert pd.isna(row.clean_cpu_wait_share) and pd.isna(row.profiled_cpu_wait_share)
    assert not isinstance(row.profiled_contended, str) and not noise.contended(bd, "lora_gc")
    said = {p.message for p in bd.problems if p.path == manifest and not p.fatal}
    assert said == {"timings.cpu_wait_share is 'abc', not a share between 0 and 1: left out",
                    "timings.profiled_cpu_wait_share is 1.7, not a share between 0 and 1: left out"}
