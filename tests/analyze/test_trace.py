import gzip
import json

import numpy as np
import pytest

from profkit.analyze import trace as trace_mod
from profkit.analyze.trace import TraceError, load_trace
from tests.conftest import GPU_TRACES


@pytest.mark.parametrize("chunk", [7, 4096, 1 << 20])
def test_streaming_parser_matches_json_load_at_any_chunk_size(monkeypatch, chunk):
    path = GPU_TRACES / "a100_distributed_rank1.json.gz"
    monkeypatch.setattr(trace_mod, "_CHUNK", chunk)
    t = load_trace(path)
    data = json.load(gzip.open(path))
    xs = [e for e in data["traceEvents"] if e.get("ph") == "X"]
    assert len(t.name) == len(xs)
    assert t.name.tolist() == [e["name"] for e in xs]
    assert np.allclose(t.ts, [e["ts"] for e in xs]) and np.allclose(t.dur, [e.get("dur", 0) for e in xs])
    assert t.correlation.tolist() == [e.get("args", {}).get("correlation", -1) for e in xs]
    assert t.metadata == {k: v for k, v in data.items() if k != "traceEvents"}


def test_metadata_after_events_and_empty_arrays(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"traceEvents": [{"ph": "X", "name": "a", "cat": "cpu_op", "ts": 1.5, "dur": 2}],'
                    ' "distributedInfo": {"rank": 3}, "deviceProperties": []}')
    t = load_trace(path)
    assert t.metadata == {"distributedInfo": {"rank": 3}, "deviceProperties": []}
    assert t.ts.tolist() == [1.5] and t.seq.tolist() == [-1]


@pytest.mark.parametrize("text, reason", [
    ('{"traceEvents": [{"ph": "X", "ts": 1', "not valid JSON"),
    ('[1, 2, 3]', "no complete"),  # Chrome's array form, holding no events
    ('"a string"', "not a JSON object"),
    ('{"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 2}, {"ph": "X", "na', "not valid JSON"),
    ('{"other": 1}', "no 'traceEvents'"),
    ('{"traceEvents": []}', "no complete"),
])
def test_bad_traces_name_the_file(tmp_path, text, reason):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(TraceError) as exc:
        load_trace(path)
    assert reason in str(exc.value) and "bad.json" in str(exc.value)


def test_array_form_pieces_and_odd_values(tmp_path, monkeypatch):
    """Chrome's bare-array form; events split into pieces at boundaries, one of them inside a string (the
    decoder refuses it and an earlier one is used); numbers written as strings; string pids."""
    from profkit.analyze import trace as trace_module

    monkeypatch.setattr(trace_module, "_CHUNK", 64)  # tiny pieces: every boundary case is exercised
    events = [{"ph": "X", "name": f"op{i} }}, {{ not a boundary", "cat": "cpu_op", "ts": i, "dur": 1,
               "pid": "Spans", "tid": i % 3, "args": {"Sequence number": str(i)}} for i in range(50)]
    events.append({"ph": "i", "name": "[memory]", "ts": 60, "args": {"Bytes": 512, "Total Allocated": 1024,
                                                                   "Total Reserved": 4096, "Device Type": 1}})
    path = tmp_path / "array.json"
    path.write_text(json.dumps(events))
    t = load_trace(path)
    assert t.name.tolist() == [e["name"] for e in events[:50]]
    assert t.seq.tolist() == list(range(50)) and t.ts.tolist() == [float(i) for i in range(50)]
    assert t.threads[t.thread_id[4]] == "Spans/1"
    assert t.memory.bytes.tolist() == [512] and t.memory.total_reserved.tolist() == [4096]
