"""Memory in a trace profkit did not record, from its ``[memory]`` events (``profile_memory=True``).

Each event is one allocation (+bytes) or free (-bytes) at an address on a device, with the allocator's
totals after it (``Total Allocated``, ``Total Reserved``) in traces since 2022; Kineto's 2021 schema has
only the bytes, so the allocated total is their running sum from the start of the trace (what was
allocated before profiling started is not in it, and the result says so).

What this gives: allocated and reserved memory over time per device, their peaks and when, and the bytes
live at the allocated peak grouped by the phase and operator category of the op that allocated them (the
innermost op running on the allocating thread). What it cannot give: parameters, gradients and optimizer
state as such -- those need profkit's inventory of the live objects (``profkit record`` or
``profkit.Session``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.analyze.time import HostOps
from profkit.analyze.trace import Trace

# c10::DeviceType values that appear in traces.
DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 8: "mps", 12: "xpu"}
TIMELINE_POINTS = 2000
BEFORE = "allocated before the trace"
LIVE_COLUMNS = ["device", "phase", "category", "bytes", "allocations"]
PEAK_COLUMNS = ["device", "peak_allocated_bytes", "allocated_peak_s", "peak_reserved_bytes", "reserved_peak_s",
                "allocated_source"]


@dataclass
class TraceMemory:
    peaks: pd.DataFrame  # PEAK_COLUMNS, one row per device (seconds from the trace's first event)
    live: pd.DataFrame  # LIVE_COLUMNS: bytes live at the device's allocated peak, by who allocated them
    timeline: pd.DataFrame  # device, t_s, allocated_bytes, reserved_bytes (at most TIMELINE_POINTS per device)
    notes: list[str] = field(default_factory=list)


def device_name(device_type: int, device_id: int) -> str:
    kind = DEVICE_TYPES.get(int(device_type), f"device{int(device_type)}")
    return kind if kind == "cpu" else f"{kind}:{max(int(device_id), 0)}"


def analyze_trace_memory(trace: Trace, ops: HostOps | None) -> TraceMemory | None:
    mem = trace.memory
    if mem is None or not len(mem.ts):
        return None
    t0 = float(trace.ts.min())
    notes: list[str] = []
    peaks, live_rows, timelines = [], [], []
    order = np.argsort(mem.ts, kind="stable")
    keys = [device_name(t, i) for t, i in zip(mem.device_type[order].tolist(), mem.device_id[order].tolist())]
    devices = list(dict.fromkeys(keys))
    keys = np.asarray(keys, dtype=object)
    finder = _OpFinder(trace, ops) if ops is not None else None
    for device in devices:
        idx = order[keys == device]
        nbytes = mem.bytes[idx]
        if (mem.total_allocated[idx] >= 0).all():
            allocated, source = mem.total_allocated[idx], "Total Allocated (the allocator's own count)"
        else:
            allocated = np.cumsum(nbytes)
            source = "running sum of the events' bytes (what was allocated before profiling is not counted)"
            notes.append(f"{device}: the trace records no allocator totals (an older schema); allocated memory is "
                         "the running sum of its events, from zero at the first one")
        reserved = mem.total_reserved[idx]
        has_reserved = bool((reserved >= 0).all())
        at = int(np.argmax(allocated))
        row = {"device": device, "peak_allocated_bytes": int(allocated[at]),
               "allocated_peak_s": (float(mem.ts[idx[at]]) - t0) / 1e6, "peak_reserved_bytes": None,
               "reserved_peak_s": None, "allocated_source": source}
        if has_reserved:
            r = int(np.argmax(reserved))
            row.update(peak_reserved_bytes=int(reserved[r]), reserved_peak_s=(float(mem.ts[idx[r]]) - t0) / 1e6)
        peaks.append(row)
        if (mem.addr[idx] < 0).any():
            notes.append(f"{device}: the events carry no addresses (an older schema), so frees cannot be paired with "
                         "allocations and what was live at the peak is not known")
        else:
            rows = _live_at(idx[: at + 1], mem, device, finder)
            if source.startswith("Total"):
                # The allocator's total also counts what was allocated before the trace began (weights, state)
                # and is still live: the difference to what the trace's own events explain.
                before = int(allocated[at]) - sum(r["bytes"] for r in rows)
                if before:
                    rows.append({"device": device, "phase": "-", "category": BEFORE, "bytes": before,
                                 "allocations": 0})
            live_rows += rows
        timelines.append(_downsample(device, (mem.ts[idx] - t0) / 1e6, allocated, reserved if has_reserved else None))
    notes.append("memory from the trace's [memory] events: parameters, gradients and optimizer state need profkit's "
                 "inventory of the live objects (`profkit record` or `profkit.Session`), so the bytes live at the "
                 "peak are grouped by the phase and operator category that allocated them instead")
    live = pd.DataFrame(live_rows, columns=LIVE_COLUMNS)
    if not live.empty:
        live = live.groupby(["device", "phase", "category"], as_index=False)[["bytes", "allocations"]].sum()
        live = live.sort_values(["device", "bytes"], ascending=[True, False], ignore_index=True)
    return TraceMemory(pd.DataFrame(peaks, columns=PEAK_COLUMNS), live, pd.concat(timelines, ignore_index=True),
                       notes)


def _live_at(events: np.ndarray, mem, device: str, finder: "_OpFinder | None") -> list[dict]:
    """Allocations made up to and including the peak event and not freed by then, attributed to their op."""
    live: dict[int, int] = {}  # address -> the event that allocated it
    for e, addr, nbytes in zip(events.tolist(), mem.addr[events].tolist(), mem.bytes[events].tolist()):
        if nbytes > 0:
            live[addr] = e
        elif nbytes < 0:
            live.pop(addr, None)
    rows = []
    for e in live.values():
        phase, category = finder.at(float(mem.ts[e]), int(mem.thread_id[e])) if finder else ("unattributed", "other")
        rows.append({"device": device, "phase": phase, "category": category, "bytes": int(mem.bytes[e]),
                     "allocations": 1})
    return rows


class _OpFinder:
    """The innermost op running on a thread at an instant: the last one started there, or the nearest of its
    enclosing ops still running."""

    def __init__(self, trace: Trace, ops: HostOps):
        self.ops = ops
        self.end = (trace.ts + trace.dur)[ops.host]
        start = trace.ts[ops.host]
        thread = trace.thread_id[ops.host]
        self.by_thread = {}
        for th in np.unique(thread):
            pos = np.flatnonzero(thread == th)  # host order is start order
            self.by_thread[int(th)] = (start[pos], pos)

    def at(self, t: float, thread: int) -> tuple[str, str]:
        found = self.by_thread.get(thread)
        if found is None:
            return "unattributed", "other"
        starts, pos = found
        j = int(np.searchsorted(starts, t, side="right")) - 1
        p = int(pos[j]) if j >= 0 else -1
        while p >= 0 and self.end[p] < t:
            p = int(self.ops.parent[p])
        if p < 0:
            return "unattributed", "other"
        return str(self.ops.phase[p]), str(self.ops.category[p])


def _downsample(device: str, t_s: np.ndarray, allocated: np.ndarray, reserved: np.ndarray | None) -> pd.DataFrame:
    """At most TIMELINE_POINTS points, keeping each bucket's maximum so that no peak is smoothed away."""
    n = len(t_s)
    if n > TIMELINE_POINTS:
        edges = np.linspace(0, n, TIMELINE_POINTS + 1).astype(int)
        pick = np.array([a + int(np.argmax(allocated[a:b])) for a, b in zip(edges[:-1], edges[1:]) if b > a])
    else:
        pick = np.arange(n)
    return pd.DataFrame({"device": device, "t_s": t_s[pick], "allocated_bytes": allocated[pick],
                         "reserved_bytes": reserved[pick] if reserved is not None else np.nan})
