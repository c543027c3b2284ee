"""Load a Kineto (torch.profiler) Chrome trace into flat columns.

One pass over the events keeps only what the analyzers use, as numpy arrays, so a trace of several
hundred MB is parsed about as fast as ``json`` can read it. No torch import: analysis runs anywhere.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
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

    def step_windows(self) -> list[tuple[float, float]]:
        """(start, end) in µs of each ProfilerStep#N annotation, in order."""
        is_step = (self.cat == "user_annotation") & np.char.startswith(self.name.astype(str), "ProfilerStep#")
        idx = np.flatnonzero(is_step)
        order = idx[np.argsort(self.ts[idx])]
        return [(float(self.ts[i]), float(self.ts[i] + self.dur[i])) for i in order]

    @property
    def base_time_ns(self) -> int:
        return int(self.metadata.get("baseTimeNanoseconds", 0))


def read_json(path: Path) -> object:
    """Parse a .json or .json.gz file; any failure becomes a TraceError naming the file."""
    try:
        with path.open("rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            return json.load(fh)
    except FileNotFoundError:
        raise TraceError(path, "no such file") from None
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceError(path, f"unreadable or truncated gzip ({exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise TraceError(path, f"not valid JSON, possibly truncated ({exc})") from None


def load_trace(path: Path | str) -> Trace:
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(path, "not a Chrome/Kineto trace (no 'traceEvents' list)")
    events = data["traceEvents"]
    cats, names, pids, tids, tss, durs, seqs, corrs = [], [], [], [], [], [], [], []
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        try:
            ts = float(e["ts"])
            dur = float(e.get("dur", 0.0))
        except (KeyError, TypeError, ValueError):
            continue
        cats.append(e.get("cat", ""))
        names.append(e.get("name", ""))
        pids.append(str(e.get("pid", "")))
        tids.append(str(e.get("tid", "")))
        tss.append(ts)
        durs.append(dur)
        seqs.append(args.get("Sequence number", -1))
        corrs.append(args.get("correlation", -1))
    if not cats:
        raise TraceError(path, "the trace has no complete ('X') events")
    metadata = {k: v for k, v in data.items() if k != "traceEvents"}
    return Trace(path, metadata, np.array(cats, dtype=object), np.array(names, dtype=object),
                 np.array(pids, dtype=object), np.array(tids, dtype=object), np.array(tss), np.array(durs),
                 np.array(seqs, dtype=np.int64), np.array(corrs, dtype=np.int64))
