"""Whether the step's time was well spent: the work each time category did against the time it took, beside
the device's roofs.

Each op's work (FLOPs, bytes moved: ``core.work``) is counted once, at the outermost op that has a formula
(``aten::addmm`` under ``aten::linear``; an attention op over the kernels and ops it runs). On a GPU trace its
time is that of the kernels it launched (found through the launch's correlation id, as the time analysis
finds them) and its category is theirs; on a CPU trace its time is the op's own duration and its category the
op's. Per category and kind of work (GEMM, attention, dequantization, memory-bound ops: one layer's attention
category holds its fused attention kernel and the elementwise ops around it, which meet different roofs;
"uncounted" is time whose work has no formula or no recorded shapes): achieved FLOP/s and bytes/s, arithmetic intensity, and -- on a GPU in ``core.gpus`` --
the roof that bounds it (compute where the intensity is above the device's ridge point, memory below) and the
share of that roof reached.

Model FLOPs utilisation (MFU): the step's model FLOPs over the clean step time and the device's dense peak at
the GEMMs' precision. The model FLOPs are the counted GEMM and attention FLOPs of every phase but recompute,
less the scores a fused attention backward recomputes (gradient checkpointing's second forward and a kernel's
recomputation are work the model does not need, so they are not in MFU; the hardware's utilisation, with them,
is ``hfu``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from profkit.core import work as work_of
from profkit.analyze.categories import by_name
from profkit.analyze.time import TimeResult
from profkit.analyze.trace import GPU_CATS, Trace
from profkit.core.gpus import Gpu

EFFICIENCY_COLUMNS = ["category", "work", "seconds", "counted_seconds", "flop", "bytes", "flop_per_s", "bytes_per_s",
                      "flop_per_byte", "precision", "peak_flop_per_s", "peak_bytes_per_s", "bound", "roof_fraction"]
MODEL_WORK = ("gemm", "attention")
UNCOUNTED = "uncounted"


@dataclass
class EfficiencyResult:
    rows: pd.DataFrame  # EFFICIENCY_COLUMNS, per profiled step
    resource: str  # "gpu" (kernel time) or "cpu" (op time)
    model_flop: float  # per step: GEMM and attention FLOPs outside recompute
    hardware_flop: float  # per step: with recompute
    precision: str  # the GEMMs' precision, by FLOPs ("" where none)
    ops_with_shapes: int  # counted ops that had recorded shapes
    notes: list[str] = field(default_factory=list)
    # One row per counted op call: category, kind, flops, bytes, precision, seconds (its kernels', or its own on
    # a CPU), kernels; what a step-time model is fitted on (analyses/fit_step_time.py)
    ops: pd.DataFrame = field(default_factory=pd.DataFrame)
    uncounted_fraction: float = 0.0  # of the time (kernel or op) whose work is not counted


def analyze_efficiency(trace: Trace, t: TimeResult, gpu: Gpu | None) -> EfficiencyResult | None:
    """None where the trace has no shapes (recorded without ``record_shapes``): nothing can be counted."""
    if t.ops is None or trace.input_id is None or not (trace.input_id >= 0).any():
        return None
    owner = _formula_owners(trace, t.ops)
    works, work = _work_lookup(trace, t.ops.host)
    in_steps = _in_windows(t.windows)
    if trace.has_gpu:
        resource = "gpu"
        seconds, category_of_owner, owner_us, owner_kernels = _kernel_time(trace, t, owner, work, in_steps)
    else:
        resource = "cpu"
        seconds, category_of_owner, owner_us, owner_kernels = _op_time(trace, t, owner, work, in_steps)
    n = max(t.n_steps, 1)
    rows, by_precision, model, hardware = _rows(seconds, category_of_owner, work, n,
                                                gpu if resource == "gpu" else None)
    all_precisions: dict[str, float] = defaultdict(float)
    for per in by_precision.values():
        for p, v in per.items():
            all_precisions[p] += v
    uncounted = sum(r["seconds"] for r in rows if r["work"] == UNCOUNTED)
    uncounted_fraction = uncounted / sum(r["seconds"] for r in rows) if rows else 0.0
    notes = _notes(works, resource, uncounted_fraction)
    per_op = pd.DataFrame([dict(category=c, kind=works[j].kind, flops=works[j].flops, bytes=works[j].bytes,
                                precision=works[j].precision, tiles=works[j].tiles,
                                tile_flop=works[j].tile_flop, backward=works[j].backward, seconds=owner_us[j] / 1e6,
                                kernels=owner_kernels[j])
                           for j, c in category_of_owner.items()])
    return EfficiencyResult(pd.DataFrame(rows, columns=EFFICIENCY_COLUMNS), resource, model / n, hardware / n,
                            max(all_precisions, key=all_precisions.get) if all_precisions else "",
                            sum(1 for w in works.values() if w is not None and w.kind), notes, per_op,
                            uncounted_fraction)


def _formula_owners(trace: Trace, ops) -> np.ndarray:
    """The outermost op with a formula around each host event, as a host position (-1: none); parents come before
    children in walk order."""
    host, parent = ops.host, ops.parent
    name_id = trace.name_id[host].tolist()
    has_formula = [work_of.has_formula(n) for n in trace.names]
    owner = np.full(len(host), -1, dtype=np.int64)
    par = parent.tolist()
    for j in range(len(host)):
        p = par[j]
        if p >= 0 and owner[p] >= 0:
            owner[j] = owner[p]
        elif has_formula[name_id[j]]:
            owner[j] = j
    return owner


def _work_lookup(trace: Trace, host: np.ndarray):
    """The work of the op at a host position, worked out on first use (None: no shapes recorded), and every one
    worked out so far by position."""
    works: dict[int, work_of.Work] = {}
    cache: dict[tuple[int, int], work_of.Work] = {}

    def work(j: int) -> work_of.Work | None:
        if j not in works:
            i = int(host[j])
            key = (int(trace.name_id[i]), int(trace.input_id[i]))
            if key[1] < 0:
                works[j] = None  # no shapes recorded for this op
            else:
                if key not in cache:
                    dims, types, concrete = trace.inputs_of(i) or ([], [], [])
                    cache[key] = work_of.work(trace.names[key[0]], dims, types, concrete)
                works[j] = cache[key]
        return works[j]

    return works, work


def _in_windows(steps: list[tuple[float, float]]):
    starts = np.array([a for a, _ in steps])
    ends = np.array([b for _, b in steps])

    def in_steps(x: np.ndarray) -> np.ndarray:
        k = np.searchsorted(starts, x, side="right") - 1
        return (k >= 0) & (x < ends[np.clip(k, 0, None)])

    return in_steps


def _kernel_time(trace: Trace, t: TimeResult, owner: np.ndarray, work, in_steps):
    """A GPU trace: each kernel launched in a profiled step, its time (µs) by category and kind of work; each
    counted op's category (the one holding most of its kernel time), kernel time and kernel count."""
    host, names = t.ops.host, trace.names
    seconds: dict[tuple[str, str], float] = defaultdict(float)  # (category, work kind) -> µs
    category_of_owner: dict[int, str] = {}
    owner_us: dict[int, float] = defaultdict(float)
    owner_categories: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    owner_kernels: dict[int, int] = defaultdict(int)
    local = np.full(len(trace.ts), -1, dtype=np.int64)
    local[host] = np.arange(len(host))
    code = {c: i for i, c in enumerate(trace.cats)}
    runtime = np.flatnonzero(np.isin(trace.cat_id, [code[c] for c in ("cuda_runtime", "cuda_driver") if c in code])
                             & (trace.correlation >= 0))
    launch = dict(zip(trace.correlation[runtime].tolist(), local[runtime].tolist()))
    kernels = np.flatnonzero(trace.mask(*GPU_CATS) & (trace.cat_id == code.get("kernel", -1)))
    launched_at = np.array([trace.ts[host[launch[c]]] if c in launch else trace.ts[k]
                            for k, c in zip(kernels.tolist(), trace.correlation[kernels].tolist())])
    kernels = kernels[in_steps(launched_at)] if len(kernels) else kernels
    context = t.ops.category
    for k in kernels.tolist():
        r = launch.get(int(trace.correlation[k]))
        c = context[r] if r is not None else None
        if c in (None, "other", "host_overhead"):
            c = by_name(names[trace.name_id[k]]) or "other"
        o = owner[r] if r is not None else -1
        w = work(o) if o >= 0 else None
        if w is not None and not (w.flops or w.bytes):
            w = None  # a formula that could not count these shapes (its note says why)
        d = float(trace.dur[k])
        # A kernel's time stays in its own category, as the time breakdown has it; its op's work goes to the
        # category that holds most of the op's kernel time (an op's kernels rarely straddle two).
        if w is not None and w.kind:
            owner_categories[o][c] += d
            owner_us[o] += d
            owner_kernels[o] += 1
        seconds[c, w.kind if w is not None and w.kind else UNCOUNTED] += d
    for o, split in owner_categories.items():
        category_of_owner[o] = max(split, key=split.get)
    return seconds, category_of_owner, owner_us, owner_kernels


def _op_time(trace: Trace, t: TimeResult, owner: np.ndarray, work, in_steps):
    """A CPU trace: each counted op in a profiled step, its own duration (µs) by its category and kind of work."""
    host = t.ops.host
    seconds: dict[tuple[str, str], float] = defaultdict(float)  # (category, work kind) -> µs
    category_of_owner: dict[int, str] = {}
    owner_us: dict[int, float] = defaultdict(float)
    owner_kernels: dict[int, int] = defaultdict(int)
    owners = np.flatnonzero((owner == np.arange(len(host))) & in_steps(trace.ts[host]))
    for j in owners.tolist():
        w = work(j)
        if w is None or not w.kind or not (w.flops or w.bytes):
            continue
        c = t.ops.category[j] or "other"
        seconds[c, w.kind] += float(trace.dur[host[j]])
        category_of_owner[j] = c
        owner_us[j] += float(trace.dur[host[j]])
    return seconds, category_of_owner, owner_us, owner_kernels


def _rows(seconds: dict, category_of_owner: dict[int, str], work, n: int, gpu: Gpu | None):
    """One row per category and kind of work, per step, largest category first; with each key's FLOPs by
    precision, and the step's model and hardware FLOPs (``gpu``: the device whose roofs bound a GPU run)."""
    recompute_owner = {j for j, c in category_of_owner.items() if c == "recompute"}
    flop: dict[tuple[str, str], float] = defaultdict(float)
    moved: dict[tuple[str, str], float] = defaultdict(float)
    by_precision: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    model = hardware = 0.0
    for j, c in category_of_owner.items():
        w = work(j)
        flop[c, w.kind] += w.flops
        moved[c, w.kind] += w.bytes
        if w.precision:
            by_precision[c, w.kind][w.precision] += w.flops
        if w.kind in MODEL_WORK:
            hardware += w.flops
            if j not in recompute_owner:
                model += w.model
    rows = []
    total = defaultdict(float)
    for (c, _), us in seconds.items():
        total[c] += us
    for key in sorted(seconds, key=lambda k: (-total[k[0]], k[1] == UNCOUNTED, -seconds[k])):
        c, kind = key
        cs = 0.0 if kind == UNCOUNTED else seconds[key] / 1e6 / n
        f, b = flop[key] / n, moved[key] / n
        precision = max(by_precision[key], key=by_precision[key].get) if by_precision[key] else ""
        row = dict(category=c, work=kind, seconds=seconds[key] / 1e6 / n, counted_seconds=cs, flop=f, bytes=b,
                   flop_per_s=f / cs if cs else np.nan, bytes_per_s=b / cs if cs else np.nan,
                   flop_per_byte=f / b if b else np.nan, precision=precision, peak_flop_per_s=np.nan,
                   peak_bytes_per_s=np.nan, bound="", roof_fraction=np.nan)
        if gpu is not None and cs:
            _roofline(row, gpu)
        rows.append(row)
    return rows, by_precision, model, hardware


def _notes(works: dict, resource: str, uncounted_fraction: float) -> list[str]:
    """What the counts leave out: ops whose formula counted only part, uncounted kernel time, ops without shapes."""
    partial: dict[str, int] = defaultdict(int)
    for w in works.values():
        if w is not None and w.note:
            partial[w.note] += 1
    notes = [f"{k} op call(s): {note}" for note, k in partial.items()]
    if resource == "gpu" and uncounted_fraction > 0.05:
        notes.append(f"{uncounted_fraction:.0%} of the kernel time ran work that is not "
                     "counted (ops without a formula or recorded shapes, kernels compiled by torch.compile, "
                     "kernels launched before the trace began): the FLOPs per step and MFU are lower bounds")
    missing = sum(1 for j, w in works.items() if w is None)
    if missing:
        notes.append(f"{missing} op(s) with a formula recorded no shapes: their work is not counted")
    return notes


def _roofline(row: dict, gpu: Gpu) -> None:
    peak = gpu.peak_flop_per_s(row["precision"]) if row["precision"] else None
    bandwidth = gpu.bytes_per_s
    row["peak_flop_per_s"] = peak if peak else np.nan
    row["peak_bytes_per_s"] = bandwidth if bandwidth else np.nan
    if not bandwidth:
        return
    if peak and row["flop"] and row["flop_per_byte"] >= peak / bandwidth:
        row["bound"], row["roof_fraction"] = "compute", row["flop_per_s"] / peak
    else:
        row["bound"], row["roof_fraction"] = "memory", row["bytes_per_s"] / bandwidth


def utilisation(result: EfficiencyResult, step_time_s: float | None, gpu: Gpu | None) -> dict[str, float | None]:
    """MFU and HFU over ``step_time_s`` (the clean step where the run has one) at the GEMMs' precision."""
    peak = gpu.peak_flop_per_s(result.precision) if gpu is not None and result.precision else None
    if not peak or not step_time_s or result.resource != "gpu":
        return {"mfu": None, "hfu": None}
    return {"mfu": result.model_flop / step_time_s / peak, "hfu": result.hardware_flop / step_time_s / peak}
