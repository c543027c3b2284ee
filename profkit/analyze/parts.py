"""What one analysis of one input produces, and the merging of those parts.

Each analysis of a source (its record, its time trace, its memory, its allocator snapshot, its efficiency) returns
a ``Part``; the parts of a source are merged in order into one, and the sources' parts into the Breakdown
(``analyze.facade``). Nothing is filled in through an argument.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from profkit.analyze.discovery import Problem

# The long tables a part may hold, one frame of each kind per source at most.
FRAME_KINDS = ("memory", "time", "time_by_name", "measured", "predicted", "trace_memory", "trace_memory_peaks",
               "memory_over_time", "time_per_step", "memory_sources", "efficiency", "predicted_time")


@dataclass
class Part:
    """One analysis of one source: its run-row fields, its long tables by kind (already tagged with run and
    method), its notes and problems, and what renderers reuse (phase windows, record, snapshot, timeline)."""

    row: dict = field(default_factory=dict)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    windows: dict | None = None  # phase -> (start, end) ns, from the memory trace
    record: object | None = None  # profkit.store.manifest.RunRecord
    snapshot: object | None = None  # profkit.analyze.snapshot.SnapshotAnalysis
    timeline: object | None = None  # profkit.analyze.memory.Timeline


def tagged(frame: pd.DataFrame, run: str, method: str) -> pd.DataFrame:
    return frame.assign(run=run, method=method)


def merged(parts: list[Part]) -> Part:
    """The parts of one source as one, in order: later row fields win, notes and problems follow each other."""
    out = Part()
    for part in parts:
        out.row.update(part.row)
        for kind, frame in part.frames.items():
            if kind in out.frames:
                raise ValueError(f"two analyses of one source produced {kind!r}")
            out.frames[kind] = frame
        out.notes += part.notes
        out.problems += part.problems
        for name in ("windows", "record", "snapshot", "timeline"):
            if getattr(part, name) is not None:
                setattr(out, name, getattr(part, name))
    return out


def unexpected(exc: Exception) -> str:
    return (f"could not be analysed: {type(exc).__name__}: {exc} (an input profkit does not understand; please "
            "report it with the file)")
