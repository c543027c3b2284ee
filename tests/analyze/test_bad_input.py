"""Bad input: each problem names its file; everything else is still analysed; exit code 1."""

import gzip
import json
import shutil

import pytest

from profkit.analyze import breakdown
from tests.conftest import GPU_TRACES, run_cli

GOOD = GPU_TRACES / "a100_distributed_rank0.json.gz"


@pytest.fixture
def mixed(tmp_path):
    shutil.copy(GOOD, tmp_path / "good.json.gz")
    data = (GPU_TRACES / "a100_distributed_rank1.json.gz").read_bytes()
    (tmp_path / "truncated.json.gz").write_bytes(data[: len(data) // 2])
    (tmp_path / "corrupt.json").write_text('{"traceEvents": [{"ph": "X", ')
    (tmp_path / "not_a_trace.json").write_text(json.dumps({"hello": 1}))
    (tmp_path / "notes.txt").write_text("a text file")
    return tmp_path


def test_each_bad_file_is_named_and_the_rest_analysed(mixed):
    bd = breakdown([mixed])
    messages = {p.path.name: p.message for p in bd.problems}
    assert "truncated" in messages["truncated.json.gz"]
    assert "not valid JSON" in messages["corrupt.json"]
    assert "traceEvents" in messages["not_a_trace.json"]
    assert "not a trace" in messages["notes.txt"]
    assert bd.failed
    assert "good" in set(bd.time.run)


def test_missing_path_and_empty_dir(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bd = breakdown([tmp_path / "missing", empty, GOOD])
    msgs = [str(p) for p in bd.problems]
    assert any("missing" in m and "no such file" in m for m in msgs)
    assert any("empty" in m and "no profkit runs" in m for m in msgs)
    assert "a100_distributed_rank0" in set(bd.time.run)


def test_trace_without_profiler_steps_is_analysed_with_a_note(tmp_path):
    data = json.load(gzip.open(GOOD))
    data["traceEvents"] = [e for e in data["traceEvents"] if "ProfilerStep" not in e.get("name", "")]
    path = tmp_path / "nosteps.json"
    path.write_text(json.dumps(data))
    bd = breakdown([path])
    assert not bd.failed
    assert any("no ProfilerStep" in n for n in bd.notes["nosteps"])
    assert bd.time.seconds.sum() > 0


def test_cli_exit_codes(mixed):
    result = run_cli("breakdown", str(mixed))
    assert result.returncode == 1
    assert "truncated.json.gz" in result.stderr and "corrupt.json" in result.stderr
    assert "good" in result.stdout
    assert run_cli("breakdown", str(GOOD)).returncode == 0
    assert run_cli("breakdown", str(GOOD), "--explain", "nonsense").returncode == 2
