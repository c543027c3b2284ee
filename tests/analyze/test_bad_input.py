"""Bad input: each problem names its file; everything else is still analysed; exit code 1."""

import gzip
import json
import shutil

import pytest

from profkit.analyze import breakdown
from tests.conftest import invoke, GPU_TRACES

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
    result = invoke("breakdown", str(mixed))
    assert result.returncode == 1
    assert "truncated.json.gz" in result.stderr and "corrupt.json" in result.stderr
    assert "good" in result.stdout
    assert invoke("breakdown", str(GOOD)).returncode == 0
    assert invoke("breakdown", str(GOOD), "--explain", "nonsense").returncode == 2


@pytest.mark.parametrize("trace", ["a100_alexnet_single.json.gz", "h100_qwen1.5-0.5b_hf_memory.json.gz"])
def test_events_with_invalid_times_are_dropped_counted_and_never_analysed(tmp_path, trace):
    """A real trace with damaged events added (times as strings, missing, negative, years away, a day long):
    they are dropped and counted in a warning naming the file, and every figure equals the clean trace's."""
    with gzip.open(GPU_TRACES / trace, "rt") as fh:
        data = json.load(fh)
    kernel = next(e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "kernel")
    damaged = [{**kernel, "ts": str(kernel["ts"])}, {k: v for k, v in kernel.items() if k != "ts"},
               {**kernel, "dur": -5}, {**kernel, "ts": kernel["ts"] + 1e15}, {**kernel, "dur": 2 * 86_400e6},
               {**kernel, "ts": "1672876799.2"}, {**kernel, "ts": None}, {**kernel, "dur": True}]
    memory = [{"ph": "i", "name": "[memory]", "ts": "soon", "pid": 1, "tid": 1, "args": {"Bytes": 1 << 40}},
              {"ph": "i", "name": "[memory]", "ts": kernel["ts"] + 1e15, "pid": 1, "tid": 1,
               "args": {"Bytes": 1 << 40, "Total Allocated": 1 << 40, "Device Type": 1}}]
    bad = {**data, "traceEvents": data["traceEvents"] + damaged + memory}
    (tmp_path / "clean").mkdir()
    (tmp_path / "bad").mkdir()
    with gzip.open(tmp_path / "clean" / trace, "wt") as fh:
        json.dump(data, fh)
    with gzip.open(tmp_path / "bad" / trace, "wt") as fh:
        json.dump(bad, fh)
    clean, broken = breakdown([tmp_path / "clean"]), breakdown([tmp_path / "bad"])
    warnings = [p for p in broken.problems if "events dropped" in p.message]
    assert len(warnings) == 1 and warnings[0].path.name == trace and not warnings[0].fatal
    assert warnings[0].message.startswith(f"{len(damaged) + len(memory)} events dropped")
    assert not broken.failed
    assert broken.runs.drop(columns="path").equals(clean.runs.drop(columns="path"))
    assert broken.time.equals(clean.time) and broken.time_by_name.equals(clean.time_by_name)
    assert broken.trace_memory_peaks.equals(clean.trace_memory_peaks)
