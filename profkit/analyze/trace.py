"""Load a Kineto (torch.profiler) Chrome trace into flat columns.

One pass over the events keeps only what the analyzers use, as numpy arrays, so a trace of several
hundred MB is parsed about as fast as ``json`` can read it. No torch import: analysis runs anywhere.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np

HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
# Kineto's 2021 schema named the categories differently; read as today's.
LEGACY_CATS = {"Operator": "cpu_op", "Runtime": "cuda_runtime", "Kernel": "kernel", "Memcpy": "gpu_memcpy",
               "Memset": "gpu_memset", "Python": "python_function", "User Annotation": "user_annotation"}
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


class TraceError(Exception):
    """A trace that cannot be analysed; the message names the file and the reason."""

    def __init__(self, path: Path | str, reason: str):
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"{path}: {reason}")


@dataclass
class MemoryEvents:
    """``[memory]`` instant events (``profile_memory=True``): one allocation (+bytes) or free (-bytes) each,
    with the allocator's totals after it where the trace records them (-1 where not)."""

    ts: np.ndarray  # float64, µs
    bytes: np.ndarray  # int64, signed
    total_allocated: np.ndarray  # int64
    total_reserved: np.ndarray  # int64
    device_type: np.ndarray  # int64 (0 CPU, 1 CUDA; other values for other backends)
    device_id: np.ndarray  # int64
    addr: np.ndarray  # int64
    thread_id: np.ndarray  # int32 into Trace.threads: the thread that allocated or freed


@dataclass
class Trace:
    """Complete ("X") events as columns, one entry per event in file order. Names, categories and threads are
    stored once each (``names``, ``cats``, ``threads``) and referred to by integer codes: kernel names run
    to thousands of characters and repeat thousands of times."""

    path: Path
    metadata: dict
    names: list[str]
    name_id: np.ndarray  # int32 into names
    cats: list[str]
    cat_id: np.ndarray  # int16 into cats
    threads: list[str]  # "pid/tid" (pids and tids may be strings in Kineto traces: "Spans")
    thread_id: np.ndarray  # int32 into threads
    ts: np.ndarray  # float64, microseconds
    dur: np.ndarray  # float64, microseconds
    seq: np.ndarray  # int64, autograd sequence number or -1
    correlation: np.ndarray  # int64, runtime<->kernel correlation id or -1
    memory: MemoryEvents | None = None
    warnings: list[str] = field(default_factory=list)
    # record_shapes: each event's inputs as an index into ``inputs`` (-1: none recorded); ``inputs`` holds each
    # distinct (dims, types, concrete values) once, as JSON text (layers repeat the same shapes)
    input_id: np.ndarray | None = None
    inputs: list[bytes] = field(default_factory=list)

    def inputs_of(self, i: int) -> tuple[list, list, list] | None:
        """The recorded input dims, types and concrete values of event ``i``, or None."""
        k = -1 if self.input_id is None else int(self.input_id[i])
        if k < 0:
            return None
        try:
            dims, types, concrete = json.loads(self.inputs[k])
        except ValueError:
            return None
        return (dims if isinstance(dims, list) else [], types if isinstance(types, list) else [],
                concrete if isinstance(concrete, list) else [])

    @property
    def name(self) -> np.ndarray:
        """Every event's name as an object array (8 bytes an event: the strings are shared)."""
        return np.asarray(self.names, dtype=object)[self.name_id]

    @property
    def cat(self) -> np.ndarray:
        return np.asarray(self.cats, dtype=object)[self.cat_id]

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def has_gpu(self) -> bool:
        return bool(self.mask(*GPU_CATS).any())

    def mask(self, *cats: str) -> np.ndarray:
        return np.isin(self.cat_id, [i for i, c in enumerate(self.cats) if c in cats])

    def named(self, *names: str) -> np.ndarray:
        """Mask of the events with one of these exact names."""
        return np.isin(self.name_id, [i for i, n in enumerate(self.names) if n in names])

    def name_ids(self, predicate) -> np.ndarray:
        """Codes of the names for which ``predicate(name)`` holds (evaluated once per distinct name)."""
        return np.array([i for i, n in enumerate(self.names) if predicate(n)], dtype=np.int64)

    def step_indices(self) -> np.ndarray:
        """Indices of the ProfilerStep#N annotations (user_annotation today, cpu_op in Kineto's 2021 schema),
        in time order."""
        is_step = self.mask("user_annotation", "cpu_op") & np.isin(
            self.name_id, self.name_ids(lambda n: n.startswith("ProfilerStep#")))
        idx = np.flatnonzero(is_step)
        return idx[np.argsort(self.ts[idx], kind="stable")]

    def step_windows(self) -> list[tuple[float, float]]:
        """(start, end) in µs of each ProfilerStep#N annotation, in order."""
        return [(float(self.ts[i]), float(self.ts[i] + self.dur[i])) for i in self.step_indices()]

    @property
    def base_time_ns(self) -> int:
        return int(self.metadata.get("baseTimeNanoseconds", 0))


# The decoders recurse once a level of JSON nesting, up to Python's recursion limit: deeper text is damage or
# not a trace (Kineto's events nest a few levels), reported as such rather than as the parser's exception.
_TOO_DEEP = (f"JSON nested deeper than {sys.getrecursionlimit()} levels: not a Kineto trace (its events nest a few "
             "levels), or a damaged one")


def _open_text(path: Path):
    with path.open("rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else path.open("r", encoding="utf-8")


def read_json(path: Path) -> object:
    """Parse a small .json or .json.gz file whole; any failure becomes a TraceError naming the file."""
    try:
        with _open_text(path) as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"unreadable or truncated gzip ({exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"not valid JSON, possibly truncated ({exc})") from None
    except RecursionError:
        raise TraceError(path, _TOO_DEEP) from None


class _Args(msgspec.Struct):
    seq: int = msgspec.field(default=-1, name="Sequence number")
    correlation: int = -1
    bytes: int = msgspec.field(default=0, name="Bytes")
    total_allocated: int = msgspec.field(default=-1, name="Total Allocated")
    total_reserved: int = msgspec.field(default=-1, name="Total Reserved")
    device_type: int = msgspec.field(default=-1, name="Device Type")
    device_id: int = msgspec.field(default=-1, name="Device Id")
    addr: int = msgspec.field(default=-1, name="Addr")
    # record_shapes: kept as raw JSON text and decoded only for the ops whose work is counted (core/work.py)
    dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    types: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Concrete Inputs")


class _Event(msgspec.Struct):
    """The fields of a trace event that analysis uses; msgspec skips the rest without building them."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: int | str = ""
    tid: int | str = ""
    ts: float = math.nan  # missing: not a time, and the event is dropped (never placed at 0)
    dur: float = math.nan
    args: _Args | None = None


_ARGS_FIELDS = {"Sequence number": "seq", "correlation": "correlation", "Bytes": "bytes",
                "Total Allocated": "total_allocated", "Total Reserved": "total_reserved", "Device Type": "device_type",
                "Device Id": "device_id", "Addr": "addr"}
_TYPED = msgspec.json.Decoder(list[_Event])
# Events are decoded in pieces of about this many bytes, so memory holds one piece of text, not the file.
_CHUNK = 256 << 10
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_ARRAY_END = re.compile(rb"\}\s*\]")
_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


# An event longer than a day, or more than a day from the trace's median time, is not a profiled event but a
# damaged number (a real trace spans seconds to minutes; a whole-day profile would be gigabytes).
MAX_SPAN_US = 86_400e6


# The types an event's fields must have; an event with another is damaged and dropped, never guessed at.
# (Times are checked apart: a missing or non-numeric time is counted as an invalid time.)
_FIELD_TYPES = {"ph": str, "cat": str, "name": str, "pid": (int, str), "tid": (int, str), "args": (dict, type(None))}


class _Columns:
    """Accumulates decoded events as codes and numbers; damaged events are counted in ``dropped``, never kept
    (times are checked on the columns, in ``load_trace``)."""

    def __init__(self) -> None:
        self.dropped: dict[str, int] = {}
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.threads: dict[tuple, int] = {}
        self.name_id, self.cat_id, self.thread_id = array("i"), array("h"), array("i")
        self.ts, self.dur, self.seq, self.corr = array("d"), array("d"), array("q"), array("q")
        self.mem = {k: array("q") for k in ("bytes", "total_allocated", "total_reserved", "device_type", "device_id",
                                            "addr")}
        self.mem_ts = array("d")
        self.mem_thread = array("i")
        self.inputs: dict[bytes, int] = {}
        self.input_id = array("i")

    def _drop(self, reason: str, n: int) -> None:
        if n:
            self.dropped[reason] = self.dropped.get(reason, 0) + n

    def add(self, events: list) -> None:
        x = [e for e in events if e.ph == "X"]  # times are checked on the columns, at once (load_trace)
        names, cats, threads = self.names, self.cats, self.threads
        self.name_id.extend([names.setdefault(e.name, len(names)) for e in x])
        self.cat_id.extend([cats.setdefault(LEGACY_CATS.get(e.cat, e.cat), len(cats)) for e in x])
        self.thread_id.extend([threads.setdefault((e.pid, e.tid), len(threads)) for e in x])
        self.ts.extend([e.ts for e in x])
        self.dur.extend([e.dur for e in x])
        self.seq.extend([e.args.seq if e.args is not None else -1 for e in x])
        self.corr.extend([e.args.correlation if e.args is not None else -1 for e in x])
        inputs = self.inputs
        self.input_id.extend([inputs.setdefault(b"[" + bytes(e.args.dims) + b"," + (bytes(e.args.types) or b"[]") + b","
                                                + (bytes(e.args.concrete) or b"[]") + b"]", len(inputs))
                              if e.args is not None and len(e.args.dims) else -1 for e in x])
        mem = [e for e in events if e.ph == "i" and e.name == "[memory]" and e.args is not None]
        if mem:
            self.mem_ts.extend([e.ts for e in mem])
            self.mem_thread.extend([threads.setdefault((e.pid, e.tid), len(threads)) for e in mem])
            for key, col in self.mem.items():
                col.extend([getattr(e.args, key) for e in mem])

    def add_untyped(self, events: list) -> None:
        """Events that the typed decoder refused (a number written as a string, an odd pid): converted one
        by one, each bad field defaulted."""
        typed = []
        for e in events:
            if not isinstance(e, dict):
                self._drop("no event at all (a value that is not a JSON object)", 1)
                continue
            wrong = [k for k, kinds in _FIELD_TYPES.items() if k in e and not isinstance(e[k], kinds)]
            if wrong:
                self._drop("a field of the wrong type (" + ", ".join(wrong) + ")", 1)
                continue
            args = e.get("args") or {}
            kwargs, bad = {}, []
            for src, dst in _ARGS_FIELDS.items():
                if src in args:
                    try:
                        kwargs[dst] = int(args[src])  # a number written as a string is still that number
                    except (TypeError, ValueError):
                        bad.append(src)
            if bad:
                self._drop("an argument of the wrong type (" + ", ".join(bad) + ")", 1)
                continue
            # A time written as a string, or any other non-number, is damage, not a format: left invalid (dropped).
            ts, dur = (float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan
                       for v in (e.get("ts"), e.get("dur")))
            for src, dst in (("Input Dims", "dims"), ("Input type", "types"), ("Concrete Inputs", "concrete")):
                if isinstance(args.get(src), list):
                    kwargs[dst] = msgspec.Raw(json.dumps(args[src]).encode())
            typed.append(_Event(ph=e.get("ph", ""), cat=e.get("cat", ""), name=e.get("name", ""),
                                pid=e.get("pid", ""), tid=e.get("tid", ""), ts=ts, dur=dur, args=_Args(**kwargs)))
        self.add(typed)

    def decode(self, text: bytes) -> None:
        """``text`` is a JSON array of events."""
        try:
            self.add(_TYPED.decode(text))
        except msgspec.ValidationError:
            self.add_untyped(msgspec.json.decode(text))


def _read_trace(fh, columns: _Columns) -> dict:
    """Stream the events of a trace (a JSON object with "traceEvents", or a bare array of events) into
    ``columns`` piece by piece and return the other top-level keys. Pieces end at event boundaries; a
    candidate boundary that falls inside a string is found out by the decoder and the previous one used."""
    buf = b""
    while True:
        chunk = fh.read(_CHUNK)
        buf += chunk
        start = buf.lstrip()[:1]
        if start == b"[":
            prefix, rest = None, buf[buf.index(b"[") + 1:]
            break
        match = _KEY.search(buf)
        if match:
            prefix, rest = buf[:match.end() - 1], buf[match.end():]
            break
        if not chunk:
            if start != b"{":
                raise ValueError("not a Chrome/Kineto trace (the file is not a JSON object)")
            raise KeyError("traceEvents")
        if start and start != b"{":
            raise ValueError("not a Chrome/Kineto trace (the file is not a JSON object)")
    buf = rest
    eof = False
    while True:
        if len(buf) < _CHUNK and not eof:
            chunk = fh.read(_CHUNK)
            eof = not chunk
            buf += chunk
            continue
        if not eof:
            ends = [m for m in _BOUNDARY.finditer(buf, max(0, len(buf) - _CHUNK // 2))]
            for m in reversed(ends[-8:]):
                try:
                    columns.decode(b"[" + buf[:m.start() + 1] + b"]")
                except msgspec.DecodeError:
                    continue  # the boundary was inside a string: try an earlier one
                buf = buf[m.end() - 1:]
                break
            else:
                chunk = fh.read(_CHUNK)  # no usable boundary in this piece: read on
                eof = not chunk
                buf += chunk
            continue
        # The last piece: the array ends at the first "}]" after which the decoder accepts the text.
        stripped = buf.lstrip()
        if stripped.startswith(b"]"):
            suffix = stripped[1:]
        elif prefix is None and _decodes_as_array(columns, buf):
            suffix = b""  # Chrome's bare-array form: the array ends the file
        else:
            for m in _ARRAY_END.finditer(buf):
                try:
                    columns.decode(b"[" + buf[:m.start() + 1] + b"]")
                except msgspec.DecodeError:
                    continue
                suffix = buf[m.end():]
                break
            else:
                try:  # the text is whole, yet no event object ends the list: it holds other values
                    msgspec.json.decode((prefix or b"") + b"[" + buf)
                except msgspec.DecodeError:
                    raise ValueError("the event list never ends: the file is truncated") from None
                raise ValueError("not a Chrome/Kineto trace: its event list holds values that are not event "
                                 "objects")
        break
    if prefix is None:
        return {}
    try:
        metadata = msgspec.json.decode(prefix + b"[]" + suffix)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the keys around the event list are not valid JSON ({exc}); truncated?") from None
    metadata.pop("traceEvents", None)
    return metadata


def _decodes_as_array(columns: _Columns, rest: bytes) -> bool:
    try:
        columns.decode(b"[" + rest)
    except msgspec.DecodeError:
        return False
    return True


def load_trace(path: Path | str) -> Trace:
    """Read a Kineto trace (.json or .json.gz): decoded by msgspec in pieces of a few MB, only the fields
    the analysis uses, so memory holds the columns and one piece of text. (Measured on the real GPU
    fixtures against the previous stdlib streaming parser and against HTA: reports/benchmarks/.)"""
    path = Path(path)
    columns = _Columns()
    try:
        with path.open("rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gz else path.open("rb")) as fh:
            metadata = _read_trace(fh, columns)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"unreadable or truncated gzip ({exc})") from None
    except KeyError:
        raise TraceError(path, "not a Chrome/Kineto trace (no 'traceEvents' list)") from None
    except RecursionError:
        raise TraceError(path, _TOO_DEEP) from None
    except (ValueError, msgspec.DecodeError) as exc:
        reason = str(exc) if "Chrome/Kineto" in str(exc) else f"not valid JSON, possibly truncated ({exc})"
        raise TraceError(path, reason) from None
    dropped = dict(columns.dropped)
    ts, dur = np.frombuffer(columns.ts), np.frombuffer(columns.dur)
    with np.errstate(invalid="ignore"):
        timed = np.isfinite(ts) & np.isfinite(dur) & (dur >= 0) & (dur <= MAX_SPAN_US)
        if not timed.all():
            dropped["a start or duration that is missing, not a number, negative or longer than a day"] = \
                int((~timed).sum())
        # Inside the trace's span: within a day of the median start (a damaged timestamp lies years away).
        inside = timed & (np.abs(ts - np.median(ts[timed])) <= MAX_SPAN_US) if timed.any() else timed
    if (timed & ~inside).any():
        dropped["a start more than a day from the trace's median"] = int((timed & ~inside).sum())
    if not inside.any():
        detail = f" ({_dropped_text(dropped)})" if dropped else ""
        raise TraceError(path, f"the trace has no complete ('X') events with valid times{detail}")
    memory = None
    if len(columns.mem_ts):
        mem_ts = np.frombuffer(columns.mem_ts)
        with np.errstate(invalid="ignore"):
            near = np.isfinite(mem_ts) & (np.abs(mem_ts - np.median(ts[inside])) <= MAX_SPAN_US)
        if not near.all():
            dropped["a [memory] event whose time is missing or more than a day from the trace's median"] = \
                int((~near).sum())
        memory = MemoryEvents(mem_ts[near], *(np.frombuffer(columns.mem[k], dtype=np.int64)[near] for k in
                                              ("bytes", "total_allocated", "total_reserved", "device_type",
                                               "device_id", "addr")),
                              np.frombuffer(columns.mem_thread, dtype=np.int32)[near])
    threads = [f"{pid}/{tid}" for pid, tid in columns.threads]
    keep = slice(None) if inside.all() else inside
    trace = Trace(path, metadata if isinstance(metadata, dict) else {}, list(columns.names),
                  np.frombuffer(columns.name_id, dtype=np.int32)[keep], list(columns.cats),
                  np.frombuffer(columns.cat_id, dtype=np.int16)[keep], threads,
                  np.frombuffer(columns.thread_id, dtype=np.int32)[keep], ts[keep], dur[keep], np.frombuffer(columns.seq, dtype=np.int64)[keep],
                  np.frombuffer(columns.corr, dtype=np.int64)[keep], memory,
                  input_id=np.frombuffer(columns.input_id, dtype=np.int32)[keep], inputs=list(columns.inputs))
    if dropped:
        trace.warnings.append(f"{sum(dropped.values())} events dropped, never analysed: {_dropped_text(dropped)}")
    return trace


def _dropped_text(dropped: dict[str, int]) -> str:
    return "; ".join(f"{n} with {reason}" for reason, n in dropped.items())
