"""Where the step time went: operator categories by phase, per profiled step.

Host side (every trace): the self time of each op -- its duration minus that of the ops nested in it
on the same thread -- so nested ops are never counted twice, and the self times of the profiled thread
add up to the step's wall time. Context comes from the enclosing annotations: profkit's phase labels
(forward, backward, optimizer, data, generate) and recompute label, PyTorch's optimizer annotations, the
modules in the stack and the labels that say what a layer is (``categories.context_of``), and autograd
sequence numbers, which carry a forward op's layer to the backward nodes it created. A runtime call outside
any op is the host launching (host_overhead) or, a synchronisation, the host waiting for the GPU (idle).

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

from profkit.analyze.categories import MODULE_FRAME, by_name, categorize, context_of
from profkit.analyze.trace import GPU_CATS, HOST_CATS, Trace
from profkit.core import labels

BACKWARD_NODE = "autograd::engine::evaluate_function:"
# Older PyTorch named backward nodes directly: "NllLossBackward", "ConvolutionBackward0", AccumulateGrad.
LEGACY_BACKWARD_NODE = re.compile(r"^(torch::autograd::AccumulateGrad|[A-Z][A-Za-z0-9]*Backward\d*)$")
_OPERATOR = re.compile(r"^(?!autograd::|torch::autograd)[A-Za-z_0-9]+::[A-Za-z_0-9]+")
NESTING_SLACK_US = 1e-3  # timestamps are rounded; a child may end a nanosecond after its parent


@dataclass
class HostOps:
    """What the walk worked out for every host event, in walk order (position j is trace index ``host[j]``),
    for analyzers that attribute other events to the op that ran them (memory events)."""

    host: np.ndarray  # trace indices
    parent: np.ndarray  # host position of the enclosing op, -1 at the top
    phase: np.ndarray  # object
    category: np.ndarray  # object: the context category (what the op's own work is)


@dataclass
class TimeResult:
    rows: pd.DataFrame  # resource, category, phase, seconds (per step)
    by_name: pd.DataFrame  # resource, category, name, seconds (per step)
    step_time_s: float  # mean wall time of a profiled step (CPU side)
    gpu_window_s: float | None  # per step, GPU traces only
    n_steps: int
    notes: list[str] = field(default_factory=list)
    ops: HostOps | None = None
    windows: list[tuple[float, float]] = field(default_factory=list)  # profiled steps, µs
    # Per step: communication that nothing hid (exposed) and the part that ran under compute (overlapped).
    communication_exposed_s: float = 0.0
    communication_overlapped_s: float = 0.0
    # Host time of each category in each profiled step (category, step, seconds): the step-to-step spread.
    per_step: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Per step: op self time on threads other than the profiled one (concurrent, so not in the host breakdown).
    other_threads_s: float = 0.0

    def coverage(self, resource: str = "cpu") -> float:
        mine = (self.rows.resource == resource).to_numpy()
        seconds = self.rows.seconds.to_numpy()
        total = seconds[mine].sum()
        other = seconds[mine & (self.rows.category == "other").to_numpy()].sum()
        return float(1 - other / total) if total else 0.0


def _phase_of(name: str, parent_phase: str | None) -> str | None:
    """The phase a name starts (a label, the optimizer's step, a backward node, data loading), else the
    parent's."""
    if name in labels.PHASE_OF_LABEL:
        return labels.PHASE_OF_LABEL[name]
    if name.startswith("Optimizer.step") or name.startswith("Optimizer.zero_grad"):
        return "optimizer"
    if name.startswith(BACKWARD_NODE):
        return "backward"
    if name.startswith("enumerate(DataLoader)"):
        return "data"
    return parent_phase


def _infer_forward(trace: Trace, host: np.ndarray, phase: np.ndarray, windows: list[tuple[float, float]]) -> bool:
    """``phase`` is in host order (``phase[j]`` belongs to ``host[j]``)."""
    """A trace without profkit's labels has no forward marker: within each step, what runs before the first
    backward op (and is not data loading or the optimizer) is the forward pass. Returns whether it applied."""
    if trace.named(labels.FORWARD).any():
        return False
    starts = np.array([w[0] for w in windows])
    ts = trace.ts[host]
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = k >= 0
    first_backward = np.full(len(windows), np.inf)
    bwd = inside & (phase == "backward")
    np.minimum.at(first_backward, k[bwd], ts[bwd])
    forward = inside & (phase == "unattributed") & (ts < first_backward[np.clip(k, 0, None)]) \
        & np.isfinite(first_backward[np.clip(k, 0, None)])
    phase[forward] = "forward"
    return bool(forward.any())


def analyze_time(trace: Trace) -> TimeResult:
    notes: list[str] = []
    steps = trace.step_windows()
    host = np.flatnonzero(trace.mask(*HOST_CATS))
    host = host[np.lexsort((-trace.dur[host], trace.ts[host]))]  # by start, parents before children
    phase, context_cat, self_cat, parents, self_time = _walk_host(trace, host)
    phase = np.array(phase, dtype=object)
    main, windows = _profiled_thread(trace, host, steps, notes)
    n_steps = len(windows)
    ranges = int(trace.mask(COUNTER_RANGE).sum())
    if ranges and not trace.has_gpu:
        notes.append(f"{trace.path.name}: recorded in CUPTI counter mode: its {ranges:,} kernel ranges carry "
                     "performance counters, not the kernels' timing (the range profiler replays each kernel), so "
                     "the GPU side has no time breakdown; the host side is analysed")
    if _infer_forward(trace, host, phase, windows):
        notes.append(f"{trace.path.name}: no profkit labels; the forward phase is what runs in each step before "
                     "its first backward op")
    starts = np.array([w[0] for w in windows])
    ends = np.array([w[1] for w in windows])

    def in_steps(t: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, t, side="right") - 1
        return (k >= 0) & (t < ends[np.clip(k, 0, None)])

    host_in_steps = in_steps(trace.ts[host])
    on_main = trace.thread_id[host] == main
    counted = np.flatnonzero(on_main & host_in_steps)  # positions in host order
    others = np.flatnonzero(~on_main & host_in_steps)
    self_arr = np.asarray(self_time)
    step_s = float((ends - starts).mean()) / 1e6
    busy = float(self_arr[others].clip(min=0).sum()) / n_steps / 1e6 if len(others) else 0.0
    if busy > 0.01 * step_s:
        notes.append(f"{trace.path.name}: {busy * 1e3:.2f} ms/step of op time on other threads is not in the "
                     "host breakdown (it runs concurrently with the profiled thread)")
    # Step annotations themselves: their self time is host time outside any op. Columns are plain arrays
    # until the two summaries: a small trace is analysed in milliseconds, and intermediate DataFrames cost more.
    parts = [{"resource": np.full(len(counted), "cpu", dtype=object),
              "category": np.array(self_cat, dtype=object)[counted], "phase": phase[counted],
              "name_id": trace.name_id[host[counted]].astype(np.int64), "us": self_arr[counted].clip(min=0),
              "overlapped_us": np.zeros(len(counted))}]
    gpu_window_s = None
    if trace.has_gpu:
        # Back to whole-trace indexing for what the GPU side needs (a kernel's launch is a host event).
        local = np.full(len(trace.ts), -1, dtype=np.int64)
        local[host] = np.arange(len(host))
        gpu_part, gpu_window_s = _gpu_rows(trace, host, local, context_cat, phase, in_steps, n_steps)
        parts.append(gpu_part)
        comm = gpu_part["category"] == "communication"
        exposed_us, overlapped_us = gpu_part["us"][comm].sum(), gpu_part["overlapped_us"][comm].sum()
    else:
        exposed_us, overlapped_us = _host_communication(trace, host, np.asarray(self_cat, dtype=object),
                                                        on_main, host_in_steps)
    summary, by_name, per_step = _summaries(trace, parts, n_steps, np.searchsorted(
        starts, trace.ts[host[counted]], side="right") - 1)
    ops = HostOps(host, np.asarray(parents, dtype=np.int64), phase, np.array(context_cat, dtype=object))
    return TimeResult(summary, by_name, step_s, gpu_window_s, n_steps, notes, ops, windows,
                      float(exposed_us) / n_steps / 1e6, float(overlapped_us) / n_steps / 1e6, per_step, busy)


def _walk_host(trace: Trace, host: np.ndarray) -> tuple[list, list, list, list, list]:
    """Every host event in walk order (position j is ``host[j]``), nested by thread: its phase, the category its
    launches and nested frames inherit, the category of its own self time, its enclosing op's position (-1 at the
    top) and its self time (µs)."""
    names = trace.names
    sets_phase, legacy_backward, backward_node, is_recompute, operator, waits, layer_context, annotation_context = \
        _what_names_say(trace)
    code = {c: i for i, c in enumerate(trace.cats)}
    runtime_codes = {code.get("cuda_runtime"), code.get("cuda_driver")} - {None}
    python_code = code.get("python_function")
    annotation_code = code.get("user_annotation")

    # Plain lists over the host events only, in walk order (position j is host[j]): the walk touches every
    # host event, and list indexing is far cheaper than numpy's.
    m = len(host)
    ts = trace.ts[host].tolist()
    end_ = (trace.ts[host] + trace.dur[host]).tolist()
    nid, cid, thread = trace.name_id[host].tolist(), trace.cat_id[host].tolist(), trace.thread_id[host].tolist()
    seq = trace.seq
    self_time = trace.dur[host].tolist()
    phase: list = [None] * m
    context_cat: list = [None] * m  # category an op's launches (and nested frames) inherit
    self_cat: list = [None] * m  # category of an op's own self time (context_cat unless a frame)
    recompute = [False] * m
    context: list = [None] * m  # the layer the event runs in (categories.context_of)
    parents = [-1] * m
    seq_context: dict[int, str] = {}  # autograd sequence number -> the layer of the forward op that has it
    stacks: dict[int, list[int]] = defaultdict(list)
    cache: dict[tuple, str] = {}

    for i in range(m):
        stack = stacks[thread[i]]
        start = ts[i]
        while stack and end_[stack[-1]] <= start + NESTING_SLACK_US:
            stack.pop()
        parent = stack[-1] if stack else -1
        parents[i] = parent
        k = nid[i]
        if parent >= 0:
            overlap = min(end_[i], end_[parent]) - start
            if overlap > 0:
                self_time[parent] -= overlap
            parent_phase = phase[parent]
            rec = recompute[parent] or is_recompute[k]
            ctx = context[parent]
        else:
            parent_phase, rec, ctx = "unattributed", is_recompute[k], None
        c = cid[i]
        opened = annotation_context[k] if c == annotation_code else layer_context[k]
        if opened is not None:
            ctx = opened
        ph = sets_phase[k] or ("backward" if legacy_backward[k] and parent_phase == "unattributed" else parent_phase)
        if backward_node[k] or ctx is not None:
            sq = int(seq[host[i]])
            if backward_node[k]:
                ctx = seq_context.get(sq, ctx)
            elif sq >= 0:
                seq_context[sq] = ctx
        phase[i], recompute[i], context[i] = ph, rec, ctx
        if c in runtime_codes:
            inherited = context_cat[parent] if parent >= 0 else None
            if inherited in (None, "other", "host_overhead"):
                # Outside any op: the host launching work (a Triton kernel, a graph) or waiting for the GPU.
                context_cat[i], self_cat[i] = "host_overhead", "idle" if waits[k] else "host_overhead"
            else:
                context_cat[i] = self_cat[i] = inherited
        elif c == python_code:
            # A frame's own time is Python (or its phase's context); its children keep the context it runs in.
            own = categorize("", ph, rec, "norm" if ctx == "norm" else None)
            self_cat[i] = "host_overhead" if own == "other" else own
            context_cat[i] = context_cat[parent] if parent >= 0 else "other"
        else:
            is_op = operator[k] and c != annotation_code  # an annotation is never an op, whatever its name
            key = (k, ph, rec, ctx if is_op or ctx == "norm" else None, is_op)
            cat = cache.get(key)
            if cat is None:
                cat = categorize(names[k], ph, rec, key[3])
                if cat == "other" and not is_op:
                    cat = "host_overhead"  # annotations and autograd wrappers: time between operators
                cache[key] = cat
            context_cat[i] = self_cat[i] = cat
        stack.append(i)
    return phase, context_cat, self_cat, parents, self_time


def _what_names_say(trace: Trace) -> tuple[list, ...]:
    """What each name says, worked out once per distinct name (a trace has few names and many events): the phase it
    starts, whether it is a backward node (legacy or not), the recompute label, an operator or a synchronisation, and
    the layer context it opens (as a frame or annotation, and as an annotation)."""
    names = trace.names
    sets_phase = [_phase_of(nm, None) for nm in names]
    legacy_backward = [bool(LEGACY_BACKWARD_NODE.match(nm)) for nm in names]
    backward_node = [nm.startswith(BACKWARD_NODE) for nm in names]
    is_recompute = [nm == labels.RECOMPUTE for nm in names]
    operator = [bool(_OPERATOR.match(nm)) for nm in names]
    waits = [bool(HOST_WAIT.search(nm)) for nm in names]
    annotation_code = {c: i for i, c in enumerate(trace.cats)}.get("user_annotation")
    # The layer context a name opens: a module frame in a stack or an annotation (never an op or a plain frame).
    layer_context = [context_of(nm) if nm.startswith(MODULE_FRAME) or nm == labels.NORM else None for nm in names]
    annotation_context = list(layer_context)
    if annotation_code is not None:
        for k in np.unique(trace.name_id[trace.cat_id == annotation_code]).tolist():
            annotation_context[k] = context_of(names[k])
    return (sets_phase, legacy_backward, backward_node, is_recompute, operator, waits, layer_context,
            annotation_context)


def _profiled_thread(trace: Trace, host: np.ndarray, steps: list[tuple[float, float]],
                     notes: list[str]) -> tuple[int, list[tuple[float, float]]]:
    """The profiled thread, the one that carries the ProfilerStep annotations, and the step windows; without
    markers, the busiest thread and the whole of its span as one step."""
    if steps:
        return trace.thread_id[trace.step_indices()[0]], steps
    threads = trace.thread_id
    busy_by_thread = np.bincount(threads[host], weights=trace.dur[host], minlength=len(trace.threads))
    main = int(np.argmax(busy_by_thread))
    on_main = host[threads[host] == main]
    notes.append(f"{trace.path.name}: no ProfilerStep markers; the whole trace is analysed as one step")
    return main, [(float(trace.ts[on_main].min()), float((trace.ts[on_main] + trace.dur[on_main]).max()))]


def _summaries(trace: Trace, parts: list[dict], n_steps: int, step_of: np.ndarray
               ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The rows (host first, then GPU) summed per step by category and phase, by category and name (largest
    first), and the host rows per category in each profiled step (``step_of``)."""
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    rows["seconds"] = rows.pop("us") / 1e6 / n_steps
    rows["overlapped_seconds"] = rows.pop("overlapped_us") / 1e6 / n_steps
    summary = _sum_by(rows, ["resource", "category", "phase"], ["seconds", "overlapped_seconds"])
    by_name = _sum_by(rows, ["resource", "category", "name_id"], ["seconds", "overlapped_seconds"])
    labels_of = np.asarray(trace.names + [f"idle: {r}" for r in IDLE_REASONS], dtype=object)
    by_name.insert(2, "name", labels_of[by_name.pop("name_id").astype(np.int64)])
    per_step = _sum_by({"category": parts[0]["category"], "step": step_of, "us": parts[0]["us"]},
                       ["category", "step"], ["us"])
    per_step = per_step.assign(seconds=per_step.pop("us") / 1e6)
    return summary, by_name.sort_values("seconds", ascending=False, ignore_index=True), per_step


# Kineto's category for the kernels of a CUPTI range-profiler (counter mode) trace.
COUNTER_RANGE = "cuda_profiler_range"
NOT_WORK = ("communication", "host_overhead", "other", "data")


def _host_communication(trace: Trace, host: np.ndarray, self_cat: np.ndarray, on_main: np.ndarray,
                        in_steps: np.ndarray) -> tuple[float, float]:
    """Communication on a CPU backend (gloo), µs over the profiled steps: the collectives run on the backend's
    own threads (and block the profiled thread while it waits for them). Exposed is the time a collective runs
    while the profiled thread runs no operator work -- it is waiting, or only Python runs; overlapped is the
    rest, the GPU semantics with the profiled thread in place of the compute stream."""
    comm = np.flatnonzero(in_steps & (self_cat == "communication"))
    if not len(comm):
        return 0.0, 0.0
    work = np.flatnonzero(in_steps & on_main & ~np.isin(self_cat, NOT_WORK))
    idx = np.concatenate([host[comm], host[work]])
    start, end = trace.ts[idx], trace.ts[idx] + trace.dur[idx]
    priority = np.concatenate([np.ones(len(comm), dtype=np.int64), np.zeros(len(work), dtype=np.int64)])
    exposed = float(exposed_time(start, end, priority)[: len(comm)].sum())
    union = float(exposed_time(start[: len(comm)], end[: len(comm)], np.zeros(len(comm), dtype=np.int64)).sum())
    return exposed, union - exposed


def _sum_by(columns: dict[str, np.ndarray], keys: list[str], values: list[str]) -> pd.DataFrame:
    """``DataFrame(columns).groupby(keys)[values].sum()``, keys sorted, without building the frame or paying
    groupby's fixed cost: a small trace is analysed in a few ms, and those took half of it (measured)."""
    codes, uniques = zip(*(pd.factorize(columns[k], sort=True, use_na_sentinel=False) for k in keys))
    combined = np.zeros(len(columns[keys[0]]), dtype=np.int64)
    for c, u in zip(codes, uniques):
        combined = combined * max(len(u), 1) + c
    groups, inverse = np.unique(combined, return_inverse=True)
    out = {}
    rest = groups
    for k, u in reversed(list(zip(keys, uniques))):
        out[k] = np.asarray(u)[rest % max(len(u), 1)]
        rest = rest // max(len(u), 1)
    data = {k: out[k] for k in keys}
    for v in values:
        data[v] = np.bincount(inverse, weights=np.asarray(columns[v], dtype=float), minlength=len(groups))
    return pd.DataFrame(data)


def _gpu_rows(trace: Trace, host: np.ndarray, local: np.ndarray, context_cat: list, phase: np.ndarray, in_steps,
              n_steps: int):
    """``context_cat`` and ``phase`` are in host order; ``local`` maps a trace index to its host position."""
    code = {c: i for i, c in enumerate(trace.cats)}
    runtime = np.flatnonzero(np.isin(trace.cat_id, [code[c] for c in ("cuda_runtime", "cuda_driver") if c in code])
                             & (trace.correlation >= 0))
    launch = dict(zip(trace.correlation[runtime].tolist(), local[runtime].tolist()))
    gpu = np.flatnonzero(trace.mask(*GPU_CATS))
    kernel_code = code.get("kernel", -1)
    names = trace.names
    ts, corr, cid, nid = trace.ts, trace.correlation[gpu].tolist(), trace.cat_id[gpu].tolist(), trace.name_id[gpu].tolist()
    host_ts = trace.ts[host].tolist()
    cats, phases, launched = [], [], np.empty(len(gpu))
    for j, k in enumerate(gpu.tolist()):
        r = launch.get(corr[j])  # the launch's host position
        launched[j] = host_ts[r] if r is not None else ts[k]
        if cid[j] != kernel_code:
            c = "memcpy_memset"
        else:
            c = context_cat[r] if r is not None else None
            if c in (None, "other", "host_overhead"):
                c = by_name(names[nid[j]]) or "other"  # cached per name; only kernels without context
        cats.append(c)
        phases.append(phase[r] if r is not None else "unattributed")
    mask = in_steps(launched) if len(gpu) else np.zeros(0, dtype=bool)
    gpu, cats, phases = gpu[mask], np.array(cats, dtype=object)[mask], np.array(phases, dtype=object)[mask]
    if not len(gpu):
        empty = {k: np.zeros(0, dtype=object) for k in ("resource", "category", "phase")}
        return {**empty, "name_id": np.zeros(0, dtype=np.int64), "us": np.zeros(0), "overlapped_us": np.zeros(0)}, 0.0
    start, end = trace.ts[gpu], trace.ts[gpu] + trace.dur[gpu]
    # Priority by what the event occupies: a kernel that copies (context memcpy_memset) still runs on the SMs
    # and hides communication as any compute kernel does; only the copy engines' memcpy/memset rank last.
    engine_copy = trace.cat_id[gpu] != kernel_code
    priority = np.where(engine_copy, PRIORITY["memcpy_memset"],
                        np.where(cats == "communication", PRIORITY["communication"], 0))
    exposed = exposed_time(start, end, priority)
    window = float(end.max() - start.min())
    sync = np.flatnonzero(trace.mask(*HOST_CATS, "cuda_sync") & np.isin(trace.name_id, trace.name_ids(SYNC.search)))
    reasons = idle_reasons(start, end, launched[mask], trace.ts[sync], trace.ts[sync] + trace.dur[sync], in_steps)
    n_idle = len(reasons)
    part = {"resource": np.full(len(gpu) + n_idle, "gpu", dtype=object),
            "category": np.concatenate([cats, np.full(n_idle, "idle", dtype=object)]),
            "phase": np.concatenate([phases, np.full(n_idle, "all", dtype=object)]),
            "name_id": np.concatenate([trace.name_id[gpu].astype(np.int64),
                                       len(trace.names) + np.array([IDLE_REASONS.index(r) for r in reasons])]),
            "us": np.concatenate([exposed, np.array(list(reasons.values()), dtype=float)]),
            "overlapped_us": np.concatenate([(end - start) - exposed, np.zeros(n_idle)])}
    return part, window / n_steps / 1e6


# A host thread blocked until the device is done, outside any op: the host's idle time.
HOST_WAIT = re.compile(r"^(cuda|hip)(Device|Stream|Event)Synchronize$")
# Host calls that block until the device is done: the GPU goes idle when they return, until the next launch.
SYNC = re.compile(r"^(cuda|hip)(Device|Stream|Event)Synchronize|^(cuda|hip)Memcpy(2D)?$|^(cuda|hip)StreamWaitEvent")
IDLE_REASONS = ("waiting for the host to launch", "waiting on a synchronisation", "outside a profiled step",
                "launch latency and dependencies")


def idle_reasons(start: np.ndarray, end: np.ndarray, launched: np.ndarray, sync_start: np.ndarray,
                 sync_end: np.ndarray, in_steps) -> dict[str, float]:
    """Why the GPU is idle in each gap between kernels (µs by reason, adding up to the idle time): outside
    every profiled step; else a blocking host call (synchronize, synchronous copy) overlaps the gap; else the
    next kernel was launched only after the gap began (the host could not keep up); else launch latency and
    stream dependencies."""
    order = np.argsort(start, kind="stable")
    s, e, launch = start[order], end[order], launched[order]
    reach = np.maximum.accumulate(e)  # the union's end so far
    gap_start, gap_end = reach[:-1], s[1:]
    is_gap = gap_end > gap_start
    gap_start, gap_end, next_launch = gap_start[is_gap], gap_end[is_gap], launch[1:][is_gap]
    out = dict.fromkeys(IDLE_REASONS, 0.0)
    if not len(gap_start):
        return out
    length = gap_end - gap_start
    outside = ~in_steps((gap_start + gap_end) / 2)
    if len(sync_start):
        order_s = np.argsort(sync_start)
        ss, se = sync_start[order_s], np.maximum.accumulate(sync_end[order_s])
        k = np.searchsorted(ss, gap_end, side="left") - 1  # the last sync call starting before the gap ends
        synced = (k >= 0) & (se[np.clip(k, 0, None)] > gap_start)
    else:
        synced = np.zeros(len(length), dtype=bool)
    host_late = next_launch >= gap_start
    out[IDLE_REASONS[2]] = float(length[outside].sum())
    out[IDLE_REASONS[1]] = float(length[~outside & synced].sum())
    out[IDLE_REASONS[0]] = float(length[~outside & ~synced & host_late].sum())
    out[IDLE_REASONS[3]] = float(length[~outside & ~synced & ~host_late].sum())
    return out


# Which work holds the GPU when several kernels run at once: compute kernels first (what the step waits for),
# then communication kernels, then the copy engines' memcpy/memset. Lower is higher priority.
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
