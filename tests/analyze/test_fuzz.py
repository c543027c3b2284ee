"""Damaged copies of real traces and allocator snapshots: truncated, byte-flipped, structurally wrong. Each must
get a reason of its own or a correct analysis; the catch-all ("could not be analysed: <Exception> ... please
report it") must never be what a user sees. Seeded, so a failure is reproducible."""

from __future__ import annotations

import base64
import gzip
import json
import pickle
import random

import pytest

from profkit.analyze import breakdown
from profkit.analyze.snapshot import SnapshotError, analyse_snapshot, load_snapshot
from tests.conftest import DATA, GPU_TRACES

TRACES = ["a100_alexnet_single.json.gz", "v100_resnet50_kineto2021_memory.json.gz"]  # today's schema and 2021's
SNAPSHOT = DATA / "cuda-snapshots" / "cs336_small_segment_alloc.pickle"
CATCH_ALL = "could not be analysed"
MUTATIONS = 6
EVENTS = 4000


def truncations(data: bytes, rng: random.Random) -> list[bytes]:
    return [data[:rng.randrange(1, len(data))] for _ in range(MUTATIONS)]


def flips(data: bytes, rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(MUTATIONS):
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        out.append(bytes(b))
    return out


def structural(doc: dict) -> list[dict]:
    """The trace with one part of its structure of the wrong kind."""
    events = doc["traceEvents"]
    x = next(i for i, e in enumerate(events) if e.get("ph") == "X")
    step = next((i for i, e in enumerate(events) if str(e.get("name", "")).startswith("ProfilerStep#")), x)

    def with_event(i: int, **change) -> dict:
        return {**doc, "traceEvents": events[:i] + [{**events[i], **change}] + events[i + 1:]}

    refused, dropped, analysed = "not a Chrome/Kineto trace", "1 events dropped", None
    return [({**doc, "traceEvents": {"not": "a list"}}, refused), ({**doc, "traceEvents": "events"}, refused),
            ({**doc, "traceEvents": [1, 2, 3]}, refused), ({**doc, "traceEvents": [[e] for e in events[:50]]}, refused),
            (with_event(x, args=[1, 2]), dropped), (with_event(x, ph=5), dropped),
            (with_event(x, name={"nested": [1]}), dropped), (with_event(x, pid=[1]), dropped),
            (with_event(x, dur="long"), dropped), (with_event(step, ts=None, dur=None), dropped),
            (with_event(x, args={"correlation": "x", "Sequence number": [2]}), dropped),
            ({**doc, "distributedInfo": "rank zero"}, analysed), ({**doc, "deviceProperties": 7}, analysed),
            ({**doc, "traceEvents": [e for e in events if not str(e.get("name", "")).startswith("ProfilerStep#")]},
             analysed)]


def check_trace(path, expected: str | None = "any") -> None:
    """``expected``: what the problems must say ("any": whatever they say, if specific; None: nothing fatal)."""
    bd = breakdown([path])
    for p in bd.problems:
        assert CATCH_ALL not in p.message, p
        assert p.path.name == path.name or p.path == path, p
    if not bd.failed:  # analysed: every run is the trace's, with its figures
        assert list(bd.runs.status) == ["foreign"]
    if expected is None:
        assert not bd.failed, bd.problems
    elif expected != "any":
        assert any(p.message.startswith(expected) for p in bd.problems), (expected, bd.problems)


@pytest.mark.parametrize("trace", TRACES)
def test_damaged_traces_get_a_reason_of_their_own(tmp_path, trace):
    rng = random.Random(trace)
    doc = json.loads(gzip.decompress((GPU_TRACES / trace).read_bytes()))
    # The first events are enough to carry the schema, the steps and the kernels; a whole trace per case is not.
    doc["traceEvents"] = doc["traceEvents"][:EVENTS]
    plain = json.dumps(doc).encode()
    packed = gzip.compress(plain)
    cases = ([("json.gz", d, "any") for d in truncations(packed, rng) + flips(packed, rng)]
             + [("json", d, "any") for d in truncations(plain, rng) + flips(plain, rng)]
             + [("json", json.dumps(d).encode(), expected) for d, expected in structural(doc)])
    for k, (suffix, data, expected) in enumerate(cases):
        path = tmp_path / f"case{k}.{suffix}"
        path.write_bytes(data)
        check_trace(path, expected)
        path.unlink()


def snapshot_structures(data: dict) -> list:
    seg = data["segments"][0]
    trace = next(t for t in data["device_traces"] if t)
    return [{**data, "segments": [5, "x"]}, {**data, "segments": [{**seg, "blocks": "many"}]},
            {**data, "segments": [{**seg, "total_size": "big"}]},
            {**data, "segments": [{**seg, "blocks": [{**seg["blocks"][0], "size": None}]}]},
            {**data, "segments": [{**seg, "blocks": [{**seg["blocks"][0], "frames": "abc"}]}]},
            {**data, "device_traces": {"0": trace}}, {**data, "device_traces": [[{**trace[0], "addr": "0x1"}]]},
            {**data, "device_traces": [[{"addr": 1}]]}, {**data, "external_annotations": [7]},
            {**data, "segments": [{k: v for k, v in seg.items() if k != "address"}]}, [1, 2, 3], "snapshot"]


def check_snapshot(path) -> None:
    try:
        analyse_snapshot(path)
    except SnapshotError as exc:
        assert str(exc).startswith(str(path)) and CATCH_ALL not in str(exc)


def test_damaged_snapshots_get_a_reason_of_their_own(tmp_path):
    rng = random.Random("snapshot")
    raw = SNAPSHOT.read_bytes()
    data = load_snapshot(SNAPSHOT)
    html = lambda payload: (b"<html><script>\nconst local_files = " +  # noqa: E731  memory_viz's export
                            json.dumps([{"name": "s.pickle", "base64": base64.b64encode(payload).decode()}]).encode()
                            + b"\n</script></html>")
    cases = (truncations(raw, rng) + flips(raw, rng) + [pickle.dumps(d) for d in snapshot_structures(data)]
             + [html(d) for d in truncations(raw, rng)[:3]] + truncations(html(raw), rng)[:3])
    for k, payload in enumerate(cases):
        path = tmp_path / f"case{k}.pickle"
        path.write_bytes(payload)
        check_snapshot(path)
