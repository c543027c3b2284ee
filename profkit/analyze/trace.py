"""Load a Kineto (torch.profiler) Chrome trace into flat columns.

One pass over the events keeps only what the analyzers use, as numpy arrays, so a trace of several
hundred MB is parsed about as fast as ``json`` can read it. No torch import: analysis runs anywhere.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path

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
class Trace:
    path: Path
    metadata: dict
    # Complete ("X") events, one entry per event in file order.
    cat: np.ndarray  # str
    name: np.ndarray  # str (object)
    pid: np.ndarray  # str: pids/tids may be strings in Kineto traces ("Spans")
    tid: np.ndarray
    ts: np.ndarray  # float64, microseconds
    dur: np.ndarray  # float64, microseconds
    seq: np.ndarray  # int64, autograd sequence number or -1
    correlation: np.ndarray  # int64, runtime<->kernel correlation id or -1
    warnings: list[str] = field(default_factory=list)

    @property
    def end(self) -> np.ndarray:
        return self.ts + self.dur

    @property
    def has_gpu(self) -> bool:
        return bool(np.isin(self.cat, GPU_CATS).any())

    def mask(self, *cats: str) -> np.ndarray:
        return np.isin(self.cat, cats)

    def step_indices(self) -> np.ndarray:
        """Indices of the ProfilerStep#N annotations (user_annotation today, cpu_op in Kineto's 2021 schema),
        in time order."""
        is_step = np.isin(self.cat, ("user_annotation", "cpu_op")) & np.char.startswith(self.name.astype(str), "ProfilerStep#")
        idx = np.flatnonzero(is_step)
        return idx[np.argsort(self.ts[idx], kind="stable")]

    def step_windows(self) -> list[tuple[float, float]]:
        """(start, end) in µs of each ProfilerStep#N annotation, in order."""
        return [(float(self.ts[i]), float(self.ts[i] + self.dur[i])) for i in self.step_indices()]

    @property
    def base_time_ns(self) -> int:
        return int(self.metadata.get("baseTimeNanoseconds", 0))


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


_WHITESPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_CHUNK = 1 << 20


class _JsonStream:
    """Decode one JSON value at a time from a file, holding about one chunk of text in memory.

    ``json.load`` of a trace keeps every event as a dict at once (several times the file's size); a
    trace of hundreds of MB only needs one event at a time. The stdlib's C decoder does the parsing.
    """

    def __init__(self, fh):
        self.fh, self.buf, self.pos, self.eof = fh, "", 0, False

    def _fill(self) -> bool:
        chunk = self.fh.read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf = self.buf[self.pos:] + chunk
        self.pos = 0
        return True

    def peek(self) -> str:
        while True:
            self.pos = _WHITESPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self._fill():
                return self.buf[self.pos] if self.pos < len(self.buf) else ""

    def expect(self, char: str) -> None:
        got = self.peek()
        if got != char:
            raise ValueError(f"expected {char!r} but found {got or 'end of file'!r} at offset {self.pos}")
        self.pos += 1

    def value(self):
        self.peek()
        while True:
            try:
                obj, end = _DECODER.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self._fill():
                    continue  # the value ran past the chunk: read on and try again
                raise
            if end == len(self.buf) and self._fill():
                continue  # a number at the chunk's end may continue in the next chunk
            self.pos = end
            return obj


def _stream_trace(fh, on_event) -> dict:
    """Walk the top-level object: metadata keys are returned, each traceEvents item goes to on_event."""
    s = _JsonStream(fh)
    s.expect("{")
    metadata: dict = {}
    saw_events = False
    if s.peek() == "}":
        return metadata
    while True:
        key = s.value()
        s.expect(":")
        if key == "traceEvents":
            saw_events = True
            s.expect("[")
            if s.peek() == "]":
                s.pos += 1
            else:
                while True:
                    on_event(s.value())
                    if s.peek() == ",":
                        s.pos += 1
                    else:
                        s.expect("]")
                        break
        else:
            metadata[key] = s.value()
        if s.peek() == ",":
            s.pos += 1
        else:
            s.expect("}")
            break
    if not saw_events:
        raise KeyError("traceEvents")
    return metadata


def load_trace(path: Path | str) -> Trace:
    path = Path(path)
    cats, names, pids, tids = [], [], [], []
    tss, durs, seqs, corrs = array("d"), array("d"), array("q"), array("q")
    intern: dict = {}  # names and categories repeat: keep one string object of each

    def on_event(e) -> None:
        if not isinstance(e, dict) or e.get("ph") != "X":
            return
        try:
            ts = float(e["ts"])
            dur = float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            return
        args = e.get("args") or {}
        name, cat = e.get("name", ""), e.get("cat", "")
        cat = LEGACY_CATS.get(cat, cat)
        cats.append(intern.setdefault(cat, cat))
        names.append(intern.setdefault(name, name))
        pid, tid = str(e.get("pid", "")), str(e.get("tid", ""))
        pids.append(intern.setdefault(pid, pid))
        tids.append(intern.setdefault(tid, tid))
        tss.append(ts)
        durs.append(dur)
        seqs.append(int(args.get("Sequence number", -1)))
        corrs.append(int(args.get("correlation", -1)))

    try:
        with _open_text(path) as fh:
            if _JsonStream(fh).peek() != "{":
                raise TraceError(path, "not a Chrome/Kineto trace (the file is not a JSON object)")
            fh.seek(0)
            metadata = _stream_trace(fh, on_event)
    except TraceError:
        raise
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"unreadable or truncated gzip ({exc})") from None
    except KeyError:
        raise TraceError(path, "not a Chrome/Kineto trace (no 'traceEvents' list)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"not valid JSON, possibly truncated ({exc})") from None
    if not cats:
        raise TraceError(path, "the trace has no complete ('X') events")
    return Trace(path, metadata, np.array(cats, dtype=object), np.array(names, dtype=object),
                 np.array(pids, dtype=object), np.array(tids, dtype=object), np.frombuffer(tss),
                 np.frombuffer(durs), np.frombuffer(seqs, dtype=np.int64), np.frombuffer(corrs, dtype=np.int64))
