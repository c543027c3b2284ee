"""What a reader reads first: the at-a-glance table and the answers, each figure found in ``breakdown --format
json``; findings that say what they compare and when (the GC finding at the activation peak); disturbed runs
flagged rather than explained."""

from __future__ import annotations

import json
import shutil

import pytest
from typer.testing import CliRunner

from profkit import store
from profkit.analyze import breakdown
from profkit.analyze.disturbed import disturbance, profiled_contention
from profkit.analyze.glance import at_a_glance
from profkit.analyze.measures import measure_pairs
from profkit.cli import app
from profkit.report import findings
from profkit.report.answers import answers
from tests.e2e.report.test_every_figure_in_json import json_numbers
from tests.report.test_every_figure_in_json import printed_figures

pytestmark = pytest.mark.e2e


def test_every_number_in_the_answers_is_in_the_json(matrix):
    as_json = CliRunner().invoke(app, ["breakdown", str(matrix), "--format", "json", "--budget", "20MiB"])
    assert as_json.exit_code == 0, as_json.output
    doc = json.loads(as_json.output)
    assert {"at_a_glance", "answers", "measures", "findings", "flagged", "runs"} <= set(doc)
    # The answers' own text carries no numbers into the lookup: json_numbers reads numbers, not strings.
    numbers = sorted(json_numbers({k: v for k, v in doc.items() if k != "answers"}))
    text = " ".join(" ".join([a["lead"], *a["points"]]) for a in doc["answers"])
    looked_up, counts = 0, []
    for shown, value, half in printed_figures(text):
        if shown.replace(",", "").isdigit():  # a bare integer counts pairs or runs: no more than there are
            counts.append(int(shown.replace(",", "")))
            continue
        looked_up += 1
        assert any(abs(value - v) <= half * 1.0001 + 1e-12 for v in numbers), shown
    assert looked_up >= 40 and counts and max(counts) <= max(len(doc["measures"]), len(doc["runs"]))
    assert [a["question"] for a in doc["answers"]][0].startswith("What did each memory-saving measure save")


def test_at_a_glance_orders_by_budget_then_speed(matrix):
    bd = breakdown([matrix / r for r in ("full", "lora", "lora_zero2", "qlora", "infer_fp16")])
    by_peak = at_a_glance(bd)
    assert list(by_peak.peak_bytes) == sorted(by_peak.peak_bytes)
    budget = int(bd.runs.measured_peak_bytes.sort_values().iloc[2])  # the three smallest fit
    glance = at_a_glance(bd, budget)
    fits = glance[glance.within_budget == True]  # noqa: E712
    assert len(fits) == 3 and list(glance.run[:3]) == list(fits.run)
    assert list(fits.clean_step_s) == sorted(fits.clean_step_s)
    for _, g in glance.iterrows():  # the top owners are the largest categories, as shares of the peak
        for kind in ("memory", "time"):
            first, second = g[f"{kind}_first_share"], g[f"{kind}_second_share"]
            assert first >= 0.005 and (second != second or first >= second >= 0.005), (g.run, kind)


def test_the_gc_finding_compares_activation_peaks(matrix):
    """Gradient checkpointing changes the activations' own peak; the run's peak may fall elsewhere, and the
    sentence says where."""
    bd = breakdown([matrix / "full", matrix / "full_gc"])
    runs = bd.runs.set_index("run")
    assert runs.loc["full_gc", "activation_peak_bytes"] < runs.loc["full", "activation_peak_bytes"]
    # The activation peak is the activations' largest over the step, never less than at the run's peak.
    at_peak = bd.memory[(bd.memory.phase == "peak") & (bd.memory.category == "activations")].set_index("run").bytes
    for run in ("full", "full_gc"):
        assert runs.loc[run, "activation_peak_bytes"] >= at_peak[run]
    (gc,) = [f for f in findings.ranked(bd) if f.text.startswith("Gradient checkpointing")]
    assert "activation peak" in gc.text and "activations at their own largest" in gc.instant
    pair = measure_pairs(bd).set_index("run").loc["full_gc"]
    assert f"{-100 * pair.activation_peak_change:.0f}%" in gc.text
    words = {"forward": "in the forward pass", "backward": "in the backward pass", "optimizer": "at the optimizer step"}
    assert f"the run's peak, which falls {words[pair.peak_phase]}" in gc.text


def _disturb(run_dir, slower: float) -> None:
    """Make a run's clean steps slower than its profiled step, as if another process had run meanwhile."""
    manifest = run_dir / store.MANIFEST
    record = json.loads(manifest.read_text())
    times = [t * slower for t in record["timings"]["step_times_s"]]
    record["timings"].update(step_times_s=times, step_time_s=sorted(times)[len(times) // 2])
    manifest.write_text(json.dumps(record))


def _settle(run_dir) -> None:
    """Make a run's clean steps steady and below its profiled step (the shared recording may itself have been
    disturbed by whatever else the machine ran meanwhile)."""
    profiled = breakdown([run_dir]).runs.profiled_step_time_s.iloc[0]
    manifest = run_dir / store.MANIFEST
    record = json.loads(manifest.read_text())
    times = [0.9 * profiled] * len(record["timings"]["step_times_s"])
    record["timings"].update(step_times_s=times, step_time_s=times[0], cpu_wait_share=0.0,
                             profiled_cpu_wait_share=0.0)
    manifest.write_text(json.dumps(record))


def test_a_disturbed_run_is_flagged_not_explained(matrix, tmp_path):
    for run in ("lora", "lora_gc"):
        shutil.copytree(matrix / run, tmp_path / run)
        _settle(tmp_path / run)
    profiled = breakdown([tmp_path / "lora_gc"]).runs.profiled_step_time_s.iloc[0]
    clean = breakdown([tmp_path / "lora_gc"]).runs.clean_step_time_s.iloc[0]
    _disturb(tmp_path / "lora_gc", 2 * profiled / clean)
    bd = breakdown([tmp_path])
    runs = bd.runs.set_index("run")
    assert "slower than its profiled steps" in runs.loc["lora_gc", "disturbed"]
    assert any(f.startswith("lora_gc: its clean steps look disturbed") for f in findings.flags(bd))
    texts = findings.findings(bd)
    assert not any(t.startswith("Profiling costs time") and "lora_gc" in t for t in texts)
    (gc,) = [t for t in texts if t.startswith("Gradient checkpointing")]
    assert "clean step time not compared: the clean steps of lora_gc look disturbed" in gc
    assert measure_pairs(bd).set_index("run").loc["lora_gc", "time_verdict"] == "disturbed"
    assert "lora_gc !" in CliRunner().invoke(app, ["breakdown", str(tmp_path)], env={"COLUMNS": "120"}).output
    budget = next(a for a in answers(bd) if a.question.startswith("Which method is best"))
    assert "lora_gc" in budget.text.split("Not ranked")[1]


def test_disturbance_rules():
    quiet = {"clean_step_time_s": 0.10, "profiled_step_time_s": 0.12, "clean_step_min_s": 0.09,
             "clean_step_max_s": 0.11}
    assert disturbance(quiet) is None
    assert "slower than its profiled steps" in disturbance({**quiet, "profiled_step_time_s": 0.08})
    assert "range from" in disturbance({**quiet, "clean_step_max_s": 0.09 * 1.5})
    assert disturbance({"clean_step_time_s": None, "profiled_step_time_s": float("nan")}) is None
    assert "waited for a CPU for 12%" in disturbance({**quiet, "clean_cpu_wait_share": 0.12})
    assert disturbance({**quiet, "clean_cpu_wait_share": 0.002, "profiled_cpu_wait_share": 0.5}) is None
    assert profiled_contention({"profiled_cpu_wait_share": 0.002}) is None
    assert "49% of the time they were ready to run in its profiled steps" in profiled_contention(
        {"profiled_cpu_wait_share": 0.49})


def test_a_bad_budget_is_a_usage_error(matrix):
    result = CliRunner().invoke(app, ["breakdown", str(matrix / "lora"), "--budget", "lots"])
    assert result.exit_code == 2 and "--budget" in result.output and "8GiB" in result.output


def test_the_first_screen_holds_the_table_and_the_answers(matrix, tmp_path):
    """The HTML opens with the at-a-glance table and the answers side by side, before any other section (the
    committed screenshot, reports/tiny-cpu/first_screen.png, shows it at 1280x800)."""
    from profkit.report.document import write_report

    rep = write_report([matrix / r for r in ("full", "full_gc", "lora", "qlora", "infer_fp16")], tmp_path / "r")
    html = rep.html_path.read_text()
    first = html[html.index('<div class="first">'):]
    assert first.index("At a glance") < first.index("<table") < first.index("Answers") < first.index("</div>\n</div>")
    before = html[:html.index('<div class="first">')]
    assert "<h2" not in before and "<table" not in before
    for a in answers(rep.breakdown):
        assert a.question in first
