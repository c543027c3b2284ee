"""Where the step time went: operator categories by phase, per profiled step.

Host side (every trace): the self time of each op -- its duration minus that of the ops nested in it
on the same thread -- so nested ops are never counted twice, and the self times of the profiled thread
add up to the step's wall time. Context comes from the enclosing annotations: profkit's phase labels
(forward, backward, optimizer, data, generate), its recompute and norm labels, and autograd sequence
numbers, which carry a forward op's label to the backward nodes it created.

GPU side (traces with kernels): kernel, memcpy and memset time, with intervals where several run at once
split evenly between them so the categories add up to the GPU's busy time, plus ``idle`` (no kernel
running) so that busy + idle is the GPU's window. A kernel takes its launching op's category (found
through the correlation id of its runtime launch) or, failing that, its own name's.
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
    if name.startswith(BACKWARD_NODE):
        return "backward"
    return parent_phase


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
    context_cat = np.empty(n, dtype=object)  # category an op's own time (or its launches) get
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
        else:
            c = categorize(nm, phase[i], recompute[i], norm[i])
            if c == "other" and not _OPERATOR.match(nm):
                c = "host_overhead"  # annotations and autograd wrappers: time between operators
            context_cat[i] = c
        stack.append(i)

    # The profiled thread is the one that carries the ProfilerStep annotations.
    if steps:
        step_idx = np.flatnonzero((cat == "user_annotation") & np.char.startswith(name.astype(str), "ProfilerStep#"))
        main = threads[step_idx[0]]
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
    rows = pd.DataFrame({"resource": "cpu", "category": context_cat[counted], "phase": phase[counted],
                         "name": name[counted], "us": self_time[counted].clip(min=0)})

    gpu_window_s = None
    if trace.has_gpu:
        gpu_rows, gpu_window_s = _gpu_rows(trace, host, context_cat, phase, in_steps, n_steps)
        rows = pd.concat([rows, gpu_rows], ignore_index=True)
    rows["seconds"] = rows.pop("us") / 1e6 / n_steps
    summary = rows.groupby(["resource", "category", "phase"], as_index=False)["seconds"].sum()
    names = rows.groupby(["resource", "category", "name"], as_index=False)["seconds"].sum()
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
        return pd.DataFrame(columns=["resource", "category", "phase", "name", "us"]), 0.0
    share = _split_overlaps(trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu])
    window = float((trace.ts[gpu] + trace.dur[gpu]).max() - trace.ts[gpu].min())
    rows = pd.DataFrame({"resource": "gpu", "category": cats, "phase": phases, "name": trace.name[gpu], "us": share})
    idle = pd.DataFrame([{"resource": "gpu", "category": "idle", "phase": "all", "name": "(no kernel running)",
                          "us": window - share.sum()}])
    return pd.concat([rows, idle], ignore_index=True), window / n_steps / 1e6


def _split_overlaps(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Each interval's share of the union: stretches covered by k intervals count 1/k for each."""
    share = np.zeros(len(start))
    bounds = np.concatenate([start, end])
    kind = np.concatenate([np.ones(len(start), dtype=int), -np.ones(len(end), dtype=int)])
    who = np.concatenate([np.arange(len(start)), np.arange(len(end))])
    order = np.lexsort((kind, bounds))  # at equal times, ends (-1) before starts (+1)
    active: set[int] = set()
    last = None
    for j in order:
        t = bounds[j]
        if active and last is not None and t > last:
            piece = (t - last) / len(active)
            for a in active:
                share[a] += piece
        last = t
        if kind[j] > 0:
            active.add(int(who[j]))
        else:
            active.discard(int(who[j]))
    return share
