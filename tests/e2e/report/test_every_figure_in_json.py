"""Every figure ``profkit breakdown`` prints is in ``--format json``: one result object behind both. The numbers are
collected from the terminal generically (every number with its unit), converted to the JSON's units and looked up
among the JSON's values within the terminal's rounding, for a training run, a generation run, a multi-rank set and a
foreign GPU trace.

The tests that record, train or start a process; those on stored fixtures are in
``tests/report/test_every_figure_in_json.py``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from tests.conftest import GPU_TRACES
from tests.report.test_every_figure_in_json import printed_figures

# The JSON's keys carry their units; seconds and bytes are the default.
KEY_SCALE = {"_ms": 1e-3, "_us": 1e-6, "_ns": 1e-9}


def json_numbers(value, key: str = "") -> list[float]:
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in json_numbers(v, str(k))]
    if isinstance(value, list):
        return [x for v in value for x in json_numbers(v, key)]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return []
    scale = next((f for suffix, f in KEY_SCALE.items() if key.endswith(suffix)), 1.0)
    return [abs(float(value)) * scale]


def missing_from_json(paths: list[str]) -> tuple[list[str], int]:
    """The figures printed but absent from the JSON, and how many figures were looked up."""
    runner = CliRunner()
    terminal = runner.invoke(app, ["breakdown", *paths], env={"COLUMNS": "200"})
    as_json = runner.invoke(app, ["breakdown", *paths, "--format", "json"])
    assert terminal.exit_code == 0 and as_json.exit_code == 0, terminal.output + as_json.output
    numbers = sorted(json_numbers(json.loads(as_json.output)))
    printed = printed_figures(terminal.output)
    missing = [shown for shown, value, half in printed
               if not any(abs(value - v) <= half * 1.0001 + 1e-12 for v in numbers)]
    return missing, len(printed)


# Runs of the recorded matrix, and stored traces of someone else's, by what each kind is.
RECORDED = {"training": "lora", "generation": "infer_fp16"}
STORED = {"multi-rank set": GPU_TRACES / "dlrm_8rank",
          "foreign GPU trace": GPU_TRACES / "h100_qwen1.5-0.5b_hf_memory.json.gz"}


def _every_number_is_in_the_json(path: Path) -> None:
    missing, looked_up = missing_from_json([str(path)])
    assert missing == [] and looked_up >= 30, (missing, looked_up)


@pytest.mark.parametrize("kind", RECORDED)
def test_every_number_the_terminal_prints_is_in_the_json(matrix, kind):
    _every_number_is_in_the_json(matrix / RECORDED[kind])


@pytest.mark.parametrize("kind", STORED)
def test_every_number_the_terminal_prints_for_a_stored_trace_is_in_the_json(kind):
    _every_number_is_in_the_json(STORED[kind])
