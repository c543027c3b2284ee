"""Where the step time went: operator categories by phase, per profiled step.

Host side (every trace): the self time of each op -- its duration minus that of the ops nested in it
on the same thread -- so nested ops are never counted twice, and the self times of the profiled thread
add up to the step's wall time. Context comes from the enclosing annotations: profkit's phase labels
(forward, backward, optimizer, data, generate), its recompute and norm labels, and autograd sequence
numbers, which carry a forward op's label to the backward nodes it created.

GPU side (traces with kernels): exposed kernel, memcpy and memset time. Where several run at once on
different streams, the time goes to the highest-priority class running -- compute before communication
before memcpy/memset -- split evenly within that class, so the categories add up to the GPU's busy time;
``idle`` (no kernel running) makes busy + idle the GPU's window. ``overlapped_seconds`` is the rest of each
category's kernel time: what ran hidden under other work ("communication: 37 ms, of which 30 ms exposed").
A kernel takes its launching op's category (found through the correlation id of its runtime launch) or,
failing that, its own name's.

Python stack frames (``python_function``, recorded with ``with_stack``) never decide a category by their
names; they pass on the context they run in.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit import labels
from profkit.analyze.categories import by_name, categorize
from profkit.analyze.trace import GPU_CATS, HOST_CATS, Trace

BACKWARD_NODE = "autograd::engine::evaluate_function:"
# Older PyTorch named backward nodes directly: "NllLossBackward", "ConvolutionBackward0", AccumulateGrad.
LEGACY_BACKWARD_NODE = re.compile(r"^(torch::autograd::AccumulateGrad|[A-Z][A-Za-z0-9]*Backward\d*)$")
_OPERATOR = re.compile(r"^(?!autograd::|torch::autograd)[A-Za-z_0-9]+::[A-Za-z_0-9]+")
NESTING_SLACK_US = 1e-3  # timestamps are rounded; a child may end a nanosecond after its parent


@dataclass
class TimeResult:
    rows: pd.DataFrame  # resource, category, phase, seconds (per step)
    by_name: pd.DataFrame  # resource, category, name, seconds (per step)
    step_time_s: float  # mean wall time of a profiled step (CPU side)
    gpu_window_s: float | None  # per step, GPU traces only
    n_steps: int
    notes: list[str] = field(default_factory=list)

    def coverage(self, resource: str = "cpu") -> float:
        r = self.rows[self.rows.resource == resource]
        total = r.seconds.sum()
        return float(1 - r.loc[r.category == "other", "seconds"].sum() / total) if total else 0.0


def _phase_of(name: str, parent_phase: str) -> str:
    if name in labels.PHASE_OF_LABEL:
        return labels.PHASE_OF_LABEL[name]
    if name.startswith("Optimizer.step") or name.startswith("Optimizer.zero_grad"):
        return "optimizer"
    if name.startswith(BACKWARD_NODE) or (parent_phase == "unattributed" and LEGACY_BACKWARD_NODE.match(name)):
        return "backward"
    if name.startswith("enumerate(DataLoader)"):
        return "data"
    return parent_phase


def _infer_forward(trace: Trace, host: np.ndarray, phase: np.ndarray, windows: list[tuple[float, float]]) -> bool:
    """A trace without profkit's labels has no forward marker: within each step, what runs before the first
    backward op (and is not data loading or the optimizer) is the forward pass. Returns whether it applied."""
    if (trace.name == labels.FORWARD).any():
        return False
    starts = np.array([w[0] for w in windows])
    ts = trace.ts[host]
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = k >= 0
    first_backward = np.full(len(windows), np.inf)
    bwd = inside & (phase[host] == "backward")
    np.minimum.at(first_backward, k[bwd], ts[bwd])
    forward = inside & (phase[host] == "unattributed") & (ts < first_backward[np.clip(k, 0, None)]) \
        & np.isfinite(first_backward[np.clip(k, 0, None)])
    phase[host[forward]] = "forward"
    return bool(forward.any())


def analyze_time(trace: Trace) -> TimeResult:
    notes: list[str] = []
    steps = trace.step_windows()
    host = np.flatnonzero(trace.mask(*HOST_CATS))
    host = host[np.lexsort((-trace.dur[host], trace.ts[host]))]  # by start, parents before children

    name, cat, ts, dur, seq = trace.name, trace.cat, trace.ts, trace.dur, trace.seq
    threads = trace.pid.astype(str) + "/" + trace.tid.astype(str)
    n = len(name)
    self_time = trace.dur.copy()
    phase = np.empty(n, dtype=object)
    context_cat = np.empty(n, dtype=object)  # category an op's launches (and nested frames) inherit
    self_cat = np.empty(n, dtype=object)  # category of an op's own self time (context_cat unless a frame)
    recompute = np.zeros(n, dtype=bool)
    norm = np.zeros(n, dtype=bool)
    norm_seqs: set[int] = set()
    stacks: dict[str, list[int]] = defaultdict(list)

    for i in host:
        stack = stacks[threads[i]]
        start = ts[i]
        while stack and ts[stack[-1]] + dur[stack[-1]] <= start + NESTING_SLACK_US:
            stack.pop()
        parent = stack[-1] if stack else -1
        nm = name[i]
        if parent >= 0:
            overlap = min(start + dur[i], ts[parent] + dur[parent]) - start
            self_time[parent] -= max(overlap, 0.0)
            phase[i] = _phase_of(nm, phase[parent])
            recompute[i] = recompute[parent] or nm == labels.RECOMPUTE
            norm[i] = norm[parent] or nm == labels.NORM
        else:
            phase[i] = _phase_of(nm, "unattributed")
            recompute[i] = nm == labels.RECOMPUTE
            norm[i] = nm == labels.NORM
        if nm.startswith(BACKWARD_NODE) and seq[i] in norm_seqs:
            norm[i] = True
        elif norm[i] and seq[i] >= 0:
            norm_seqs.add(int(seq[i]))
        if cat[i] in ("cuda_runtime", "cuda_driver"):
            context_cat[i] = context_cat[parent] if parent >= 0 else "other"
        elif cat[i] == "python_function":
            # A frame's own time is Python (or its phase's context); its children keep the context it runs in.
            own = categorize("", phase[i], recompute[i], norm[i])
            self_cat[i] = "host_overhead" if own == "other" else own
            context_cat[i] = context_cat[parent] if parent >= 0 else "other"
        else:
            c = categorize(nm, phase[i], recompute[i], norm[i])
            if c == "other" and not _OPERATOR.match(nm):
                c = "host_overhead"  # annotations and autograd wrappers: time between operators
            context_cat[i] = c
        if self_cat[i] is None:
            self_cat[i] = context_cat[i]
        stack.append(i)

    # The profiled thread is the one that carries the ProfilerStep annotations.
    if steps:
        main = threads[trace.step_indices()[0]]
        windows = steps
    else:
        top = defaultdict(float)
        for i in host:
            top[threads[i]] += dur[i]
        main = max(top, key=top.get)
        on_main = host[threads[host] == main]
        windows = [(float(ts[on_main].min()), float((ts[on_main] + dur[on_main]).max()))]
        notes.append(f"{trace.path.name}: no ProfilerStep markers; the whole trace is analysed as one step")
    n_steps = len(windows)
    if _infer_forward(trace, host, phase, windows):
        notes.append(f"{trace.path.name}: no profkit labels; the forward phase is what runs in each step before "
                     "its first backward op")
    starts = np.array([w[0] for w in windows])
    ends = np.array([w[1] for w in windows])

    def in_steps(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right") - 1
        return (k >= 0) & (t < ends[np.clip(k, 0, None)])

    counted = host[(threads[host] == main) & in_steps(ts[host])]
    other_threads = host[(threads[host] != main) & in_steps(ts[host])]
    step_s = float((ends - starts).mean()) / 1e6
    busy = float(self_time[other_threads].clip(min=0).sum()) / n_steps / 1e6 if len(other_threads) else 0.0
    if busy > 0.01 * step_s:
        notes.append(f"{trace.path.name}: {busy * 1e3:.2f} ms/step of op time on other threads is not in the "
                     "host breakdown (it runs concurrently with the profiled thread)")
    # Step annotations themselves: their self time is host time outside any op.
    rows = pd.DataFrame({"resource": "cpu", "category": self_cat[counted], "phase": phase[counted],
                         "name": name[counted], "us": self_time[counted].clip(min=0), "overlapped_us": 0.0})

    gpu_window_s = None
    if trace.has_gpu:
        gpu_rows, gpu_window_s = _gpu_rows(trace, host, context_cat, phase, in_steps, n_steps)
        rows = pd.concat([rows, gpu_rows], ignore_index=True)
    rows["seconds"] = rows.pop("us") / 1e6 / n_steps
    rows["overlapped_seconds"] = rows.pop("overlapped_us") / 1e6 / n_steps
    summary = rows.groupby(["resource", "category", "phase"], as_index=False)[["seconds", "overlapped_seconds"]].sum()
    names = rows.groupby(["resource", "category", "name"], as_index=False)[["seconds", "overlapped_seconds"]].sum()
    return TimeResult(summary, names.sort_values("seconds", ascending=False, ignore_index=True), step_s,
                      gpu_window_s, n_steps, notes)


def _gpu_rows(trace: Trace, host: np.ndarray, context_cat, phase, in_steps, n_steps: int):
    runtime = host[np.isin(trace.cat[host], ("cuda_runtime", "cuda_driver")) & (trace.correlation[host] >= 0)]
    launch = dict(zip(trace.correlation[runtime].tolist(), runtime.tolist()))
    gpu = np.flatnonzero(trace.mask(*GPU_CATS))
    cats, phases, keep = [], [], []
    for k in gpu:
        r = launch.get(int(trace.correlation[k]))
        launched_at = trace.ts[r] if r is not None else trace.ts[k]
        keep.append(launched_at)
        if trace.cat[k] != "kernel":
            c = "memcpy_memset"
        else:
            c = context_cat[r] if r is not None else None
            if c in (None, "other", "host_overhead"):
                c = by_name(trace.name[k]) or "other"
        cats.append(c)
        phases.append(phase[r] if r is not None else "unattributed")
    mask = in_steps(np.array(keep, dtype=float)) if len(gpu) else np.zeros(0, dtype=bool)
    gpu, cats, phases = gpu[mask], np.array(cats, dtype=object)[mask], np.array(phases, dtype=object)[mask]
    if not len(gpu):
        return pd.DataFrame(columns=["resource", "category", "phase", "name", "us", "overlapped_us"]), 0.0
    start, end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
    exposed = exposed_time(start, end, np.array([PRIORITY.get(c, 0) for c in cats]))
    window = float(end.max() - start.min())
    rows = pd.DataFrame({"resource": "gpu", "category": cats, "phase": phases, "name": trace.name[gpu], "us": exposed,
                         "overlapped_us": (end - start) - exposed})
    idle = pd.DataFrame([{"resource": "gpu", "category": "idle", "phase": "all", "name": "(no kernel running)",
                          "us": window - exposed.sum(), "overlapped_us": 0.0}])
    return pd.concat([rows, idle], ignore_index=True), window / n_steps / 1e6


# Which work holds the GPU when several kernels run at once: compute first (what the step waits for), then
# communication, then copies. Lower is higher priority.
PRIORITY = {"communication": 1, "memcpy_memset": 2}


def exposed_time(start: np.ndarray, end: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """Each interval's exposed time: over every stretch of time, only the intervals of the highest-priority
    class running there count, each 1/k of the stretch when k of that class run at once. The results add up
    to the length of the union. Vectorized with prefix sums: O(n log n)."""
    if not len(start):
        return np.zeros(0)
    bounds = np.unique(np.concatenate([start, end]))
    length = np.diff(bounds)
    classes = np.unique(priority)
    counts = {}
    for k in classes:
        s, e = np.sort(start[priority == k]), np.sort(end[priority == k])
        at = bounds[:-1]
        counts[k] = np.searchsorted(s, at, side="right") - np.searchsorted(e, at, side="right")
    top = np.full(len(length), np.iinfo(np.int64).max)
    for k in sorted(classes, reverse=True):
        top = np.where(counts[k] > 0, k, top)
    exposed = np.zeros(len(start))
    for k in classes:
        rate = np.where(top == k, length / np.maximum(counts[k], 1), 0.0)
        cumulative = np.concatenate([[0.0], np.cumsum(rate)])
        mine = priority == k
        i0 = np.searchsorted(bounds, start[mine])
        i1 = np.searchsorted(bounds, end[mine])
        exposed[mine] = cumulative[i1] - cumulative[i0]
    return exposed
