"""Every figure ``profkit breakdown`` prints is in ``--format json``: one result object behind both. The numbers
are collected from the terminal generically (every number with its unit), converted to the JSON's units and
looked up among the JSON's values within the terminal's rounding, for a training run, a generation run, a
multi-rank set and a foreign GPU trace."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from tests.conftest import GPU_TRACES

# A number standing alone (not part of a name such as "qwen1.5-0.5b"), then its unit if it has one.
NUMBER = re.compile(r"(?<![\w.\-/:#])([+-]?\d[\d,]*(?:\.\d+)?)(?:\s?(ms|µs|us|ns|s|GiB|MiB|KiB|B|%|tok/s|"
                    r"tokens/s|positions|x))?(?![\w.])")
SCALE = {"ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9, "s": 1.0, "GiB": 2**30, "MiB": 2**20, "KiB": 2**10,
         "B": 1.0, "%": 1e-2}


def printed_figures(text: str) -> list[tuple[str, float, float]]:
    """(as printed, value in the JSON's units, half of the last printed digit in those units)."""
    out = []
    for m in NUMBER.finditer(text):
        digits, unit = m.group(1).replace(",", ""), m.group(2) or ""
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        scale = SCALE.get(unit, 1.0)
        out.append((m.group(0), abs(float(digits)) * scale, 0.5 * 10**-decimals * scale))
    return out


def test_a_figure_missing_from_the_json_is_found_missing():
    assert [shown for shown, *_ in printed_figures("step 12.34 ms, peak 1.5 GiB, 80%, qwen1.5-0.5b rank 3")] \
        == ["12.34 ms", "1.5 GiB", "80%", "3"]


def test_explain_lists_each_traces_names_in_the_terminal_and_the_json():
    """``--explain`` per trace: a table for each run and resource, and in the JSON every name, whose times add up
    to the category's time in that run."""
    paths = [str(GPU_TRACES / "a100_alexnet_single.json.gz"), str(GPU_TRACES / "h100_qwen1.5-0.5b_hf_memory.json.gz")]
    runner = CliRunner()
    terminal = runner.invoke(app, ["breakdown", *paths, "--explain", "gemm"], env={"COLUMNS": "80"}).output
    assert "a100_alexnet_single: 'gemm' on the GPU" in terminal and "h100_qwen1.5-0.5b_hf_memory: 'gemm' on the GPU" \
        in terminal.replace("\n", " ")
    assert max(len(line) for line in terminal.splitlines()) <= 80
    for record in json.loads(runner.invoke(app, ["breakdown", *paths, "--explain", "gemm", "-f", "json"]).output)["runs"]:
        names = record["explain"]["names"]
        gpu = sum(n["seconds"] for n in names if n["resource"] == "gpu")
        assert gpu == pytest.approx(record["time"]["gemm"]) and gpu > 0
        assert sum(n["share_of_category"] for n in names if n["resource"] == "gpu") == pytest.approx(1.0)
    refused = runner.invoke(app, ["breakdown", *paths, "--explain", "gemm", "-f", "csv"])
    assert refused.exit_code == 2 and "CSV cannot hold" in refused.output


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_long_run_names_are_numbered_where_they_would_not_fit(tmp_path, columns):
    """A user's run directory with a long name: where it would not fit, the tables show runs by number and a legend
    names each run whole; no line passes the terminal's edge or is cut with an ellipsis."""
    long_name = "my-teams-llama-sweep-2026-11-24-lr3e-4-bs16-seq2048-h100-node07-rank0"
    (tmp_path / f"{long_name}.json.gz").write_bytes((GPU_TRACES / "a100_alexnet_single.json.gz").read_bytes())
    paths = [str(tmp_path / f"{long_name}.json.gz"), str(GPU_TRACES / "h100_qwen1.5-0.5b_hf_memory.json.gz")]
    terminal = CliRunner().invoke(app, ["breakdown", *paths], env={"COLUMNS": str(columns)})
    assert terminal.exit_code == 0, terminal.output
    lines = terminal.output.splitlines()
    assert max(len(line) for line in lines) <= columns
    assert not [line for line in lines if "…" in line]
    # The tables with a column per run (boxed); the per-run work tables carry their run in the title.
    headers = [line for line in lines if line.startswith("┃") and line.lstrip("┃ ").startswith("category")]
    numbered = f"  #1  {long_name}" in lines
    assert numbered or columns > 80  # at 160 the name fits, at 100 the Runs table decides
    assert not numbered or columns < 160
    assert headers and all((("#1" in h and "#2" in h) if numbered else long_name in h) for h in headers)


def test_short_run_names_are_shown_whole():
    terminal = CliRunner().invoke(app, ["breakdown", str(GPU_TRACES / "a100_alexnet_single.json.gz")],
                                  env={"COLUMNS": "80"}).output
    assert "by number" not in terminal and "a100_alexnet_single" in terminal


def test_what_could_not_be_read_is_in_the_json_with_its_reason(tmp_path):
    """A damaged trace beside a good one: the terminal's "error:" line is in the JSON too, and the damaged run's
    row says why it is unreadable; the good one is still analysed."""
    (tmp_path / "damaged.json").write_text('{"other": 1}')
    (tmp_path / "good.json.gz").write_bytes((GPU_TRACES / "h100_qwen1.5-0.5b_hf_memory.json.gz").read_bytes())
    result = CliRunner().invoke(app, ["breakdown", str(tmp_path), "--format", "json"])
    doc = json.loads(result.stdout)
    assert result.exit_code == 1  # a problem was met; what could be read is still reported
    [problem] = doc["problems"]
    assert problem["path"].endswith("damaged.json") and "no 'traceEvents'" in problem["message"] and problem["fatal"]
    runs = {r["run"]: r for r in doc["runs"]}
    assert runs["damaged"]["status"] == "unreadable" and "no 'traceEvents'" in runs["damaged"]["reason"]
    assert runs["good"]["status"] != "unreadable" and runs["good"]["reason"] is None
