"""Inputs that were analysed wrongly or silently: each now gets a reason of its own, and the others are still
analysed."""

import gzip
import json
import pickle
import shutil

from profkit.analyze import breakdown
from profkit.analyze.snapshot import EmptySnapshotError, analyse_snapshot
from profkit.analyze.trace import TraceError, load_trace
from tests.conftest import GPU_TRACES, invoke

GOOD = GPU_TRACES / "a100_alexnet_single.json.gz"


def _events(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def test_a_trace_nested_deeper_than_the_parser_allows_is_named(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    event = '{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1, "args": {"x": %s}}'
    (tmp_path / "deep.json").write_text('{"traceEvents": [' + event % deep + "]}")
    (tmp_path / "deep_metadata.json").write_text('{"x": ' + deep + ', "traceEvents": [' + event % "1" + "]}")
    shutil.copy(GOOD, tmp_path / "good.json.gz")
    for name in ("deep.json", "deep_metadata.json"):
        try:
            load_trace(tmp_path / name)
        except TraceError as exc:
            assert "nested deeper than" in exc.reason and "levels" in exc.reason
        else:
            raise AssertionError(f"{name} was read")
    bd = breakdown([tmp_path], jobs=1)
    by_file = {p.path.name: p.message for p in bd.problems}
    assert "nested deeper than" in by_file["deep.json"] and "nested deeper than" in by_file["deep_metadata.json"]
    assert not any("RecursionError" in p.message for p in bd.problems)
    assert bd.runs.set_index("run").loc["good", "status"] == "foreign" and "good" in set(bd.time.run)


def _empty_snapshot(path):
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]], "allocator_settings": {}}))
    return path


def test_an_allocator_snapshot_without_segments_says_so(tmp_path):
    empty = _empty_snapshot(tmp_path / "empty.pickle")
    try:
        analyse_snapshot(empty)
    except EmptySnapshotError as exc:
        assert "no segments" in exc.reason
    else:
        raise AssertionError("an empty snapshot was analysed as if it held something")
    for fmt in ("table", "json"):
        out = invoke("snapshot", str(empty), "--format", fmt)
        assert out.returncode == 1, (fmt, out.stdout, out.stderr)  # as any other unusable snapshot
        assert "empty.pickle" in out.stderr and "no segments" in out.stderr


def test_a_runs_empty_snapshot_is_a_note_in_its_breakdown(tmp_path):
    run = tmp_path / "lora"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"schema_version": 3, "method": "lora", "status": "oom",
                                                   "reason": "out of memory"}))
    _empty_snapshot(run / "oom_snapshot.pickle")
    bd = breakdown([run], jobs=1)
    assert any("oom_snapshot.pickle" in n and "no segments" in n for n in bd.notes["lora"]), bd.notes
    assert bd.runs.iloc[0].status == "oom"


def test_a_trace_without_its_gpu_side_says_the_times_are_the_hosts(tmp_path):
    data = _events(GOOD)
    gpu = {"kernel", "gpu_memcpy", "gpu_memset"}
    host_only = {**data, "traceEvents": [e for e in data["traceEvents"] if e.get("cat") not in gpu]}
    assert any(e.get("name") == "cudaLaunchKernel" for e in host_only["traceEvents"])
    (tmp_path / "host_only.json").write_text(json.dumps(host_only))
    shutil.copy(GOOD, tmp_path / "whole.json.gz")
    bd = breakdown([tmp_path], jobs=1)
    said = [n for n in bd.notes["host_only"] if "GPU side is missing" in n]
    assert len(said) == 1 and "host-side only" in said[0]
    assert not any("GPU side is missing" in n for n in bd.notes["whole"])
    out = invoke("breakdown", str(tmp_path / "host_only.json"), "--format", "json")
    assert "GPU side is missing" in out.stdout
    out = invoke("breakdown", str(tmp_path / "host_only.json"))
    assert "GPU side is missing" in " ".join(out.stdout.split())  # the terminal wraps it
