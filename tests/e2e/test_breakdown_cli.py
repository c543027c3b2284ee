"""``profkit breakdown`` on the recorded matrix: every output format, deltas, --explain."""

import io
import json

import pandas as pd

from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.memory import MEMORY_CATEGORIES
from profkit.core.methods import METHODS
from tests.conftest import invoke


def test_json_has_one_object_per_run_reconciled(matrix):
    result = invoke("breakdown", str(matrix), "--format", "json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)["runs"]
    assert [r["run"] for r in records] == sorted(METHODS)
    for r in records:
        assert r["status"] == "ok" and r["method"] == r["run"]
        assert set(r["memory"]) == set(MEMORY_CATEGORIES) | {"measured_peak"}
        assert sum(v for k, v in r["memory"].items() if k != "measured_peak") == r["memory"]["measured_peak"]
        assert set(r["time"]) <= set(TIME_CATEGORIES) | {"step_time"}
        categories = sum(v for k, v in r["time"].items() if k != "step_time")
        assert abs(categories - r["time"]["step_time"]) <= 1e-3 * r["time"]["step_time"]


def test_csv_is_one_row_per_run(matrix):
    result = invoke("breakdown", str(matrix), "--format", "csv")
    df = pd.read_csv(io.StringIO(result.stdout))
    assert sorted(df.run) == sorted(METHODS)
    assert {"memory.activations", "time.gemm", "measured_peak_bytes", "status"} <= set(df.columns)


def test_table_and_markdown_show_deltas_against_the_baseline(matrix):
    table = invoke("breakdown", str(matrix), "--baseline", "lora")
    assert table.returncode == 0, table.stderr
    assert "lora_gc vs lora:" in table.stdout and "activations -" in table.stdout
    md = invoke("breakdown", str(matrix), "--format", "markdown")
    assert "## Memory at the peak (MiB)" in md.stdout and "vs full:" in md.stdout


def test_explain_lists_names_in_a_category(matrix):
    result = invoke("breakdown", str(matrix / "lora"), "--explain", "gemm")
    assert result.returncode == 0
    assert "aten::" in result.stdout
