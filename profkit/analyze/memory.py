"""Where the memory went: the decomposition at the run's peak and at each phase's peak.

Sources, and which wins:
- the exact inventory in the manifest (live objects, counted once per storage): parameters
  (trainable, frozen incl. buffers, quantized incl. quantization state) and optimizer state. The
  profiler only categorizes tensors it saw used while profiling; where the two differ the inventory
  wins and the difference shows up in ``unattributed``.
- the profiler's memory timeline (``export_memory_timeline`` raw events) for everything that comes and
  goes within a step: gradients, activations (saved for backward, inputs, autograd state) and
  temporaries, read at the instant of each peak.
- the measured peak: on CUDA the allocator's ``max_memory_reserved`` (``allocator_overhead`` =
  reserved - allocated at peak); on CPU there is no allocator counter, so the measured peak is the
  timeline's own total at its peak (process RSS, which also holds code and libraries, is reported
  beside it, not reconciled).

- inference: the KV cache generate() built, measured to the byte at the end of the memory-profiled request
  (the inventory) and growing by the same bytes per token through it: at an instant inside a forward pass
  it is the cache as that pass leaves it (filled layer by layer, so an upper bound by at most one pass).
  The profiler files the cache under ACTIVATION (it is a forward op's output), so it is taken from there.

``unattributed`` is measured minus everything attributed: never dropped, never spread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd

from profkit.analyze.allocator_owners import AllocatorOwners
from profkit.analyze.lifetimes import Lifetimes, categories
from profkit.analyze.trace import Trace, read_json
from profkit.core import labels
from profkit.core.categories import MEMORY_CATEGORIES  # also re-exported: analyze's public vocabulary
from profkit.store.manifest import RunRecord

# torch.profiler._memory_profiler category indices in the raw export (_CATEGORY_TO_INDEX order).
TIMELINE_CATEGORIES = ("PARAMETER", "OPTIMIZER_STATE", "INPUT", "TEMPORARY", "ACTIVATION", "GRADIENT",
                       "AUTOGRAD_DETAIL", "UNKNOWN")
_T = {name: i for i, name in enumerate(TIMELINE_CATEGORIES)}
# The profiler's own timeline categories, grouped as the breakdown groups them (before reconciliation).
TIMELINE_GROUPS = {
    "parameters": ("PARAMETER",), "optimizer_state": ("OPTIMIZER_STATE",), "gradients": ("GRADIENT",),
    "activations": ("ACTIVATION",), "inputs": ("INPUT",), "temporaries": ("TEMPORARY", "AUTOGRAD_DETAIL"),
    "unknown": ("UNKNOWN",),
}


@dataclass
class Timeline:
    """Live bytes per profiler category after each distinct timestamp (ns)."""

    t_ns: np.ndarray
    live: np.ndarray  # shape (len(t_ns), 8)

    @property
    def total(self) -> np.ndarray:
        return self.live.sum(axis=1)

    def peak_index(self, start_ns: float | None = None, end_ns: float | None = None) -> int | None:
        lo = 0 if start_ns is None else max(int(np.searchsorted(self.t_ns, start_ns, side="right")) - 1, 0)
        hi = len(self.t_ns) if end_ns is None else int(np.searchsorted(self.t_ns, end_ns, side="right"))
        if hi <= lo:
            return None
        return lo + int(np.argmax(self.total[lo:hi]))


def load_timeline(path: Path) -> Timeline:
    """Read a ``*.raw.json.gz`` export: rows of [time_ns, action, signed bytes, category index]."""
    raw = np.asarray(read_json(path), dtype=np.int64)
    if raw.ndim != 2 or raw.shape[1] != 4 or not len(raw):
        raise ValueError(f"{path}: not a raw memory timeline (expected rows of 4 numbers)")
    raw = raw[np.argsort(raw[:, 0], kind="stable")]
    onehot = np.zeros((len(raw), len(TIMELINE_CATEGORIES)), dtype=np.int64)
    onehot[np.arange(len(raw)), raw[:, 3]] = raw[:, 2]
    live = np.cumsum(onehot, axis=0)
    last_of_each_time = np.r_[raw[1:, 0] != raw[:-1, 0], True]  # state after all events at a timestamp
    return Timeline(raw[last_of_each_time, 0], live[last_of_each_time])


@dataclass
class MemoryResult:
    rows: pd.DataFrame  # category, phase, bytes
    measured: pd.DataFrame  # phase, measured_peak_bytes, source
    notes: list[str] = field(default_factory=list)
    # Activations at their own largest during the memory step: what gradient checkpointing changes, whenever the
    # run's peak falls (often at the optimizer step, when activations are gone).
    activation_peak_bytes: int | None = None


def inventory_totals(record: RunRecord) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in (record.inventory or {}).get("rows", []):
        key = row["owner"]
        if key in ("gradients", "framework") and row["detail"].startswith("deepspeed:"):
            key = f"zero_{key}"  # ZeRO's persistent flat buffers, invisible to the profiler's categories
        out[key] = out.get(key, 0) + row["bytes"]
    return out


def phase_windows(trace: Trace, labels_to_phase: dict[str, str]) -> dict[str, tuple[float, float]]:
    """Absolute ns windows of each phase annotation in the memory trace's last profiled step."""
    steps = trace.step_windows()
    lo, hi = steps[-1] if steps else (-np.inf, np.inf)
    base = trace.base_time_ns
    out: dict[str, tuple[float, float]] = {}
    for name, phase in labels_to_phase.items():
        idx = np.flatnonzero(trace.named(name) & (trace.ts >= lo) & (trace.ts < hi))
        if len(idx):
            i = idx[-1]
            out[phase] = (base + trace.ts[i] * 1e3, base + (trace.ts[i] + trace.dur[i]) * 1e3)
    return out


def kv_cache_at(record: RunRecord, trace: Trace) -> Callable[[float], int] | None:
    """For an inference run: a function of an absolute ns instant giving the KV cache's bytes then (see the
    module docstring), or None when the run holds no cache measurement."""
    inv = record.inventory or {}
    total, tokens = inv.get("kv_cache_bytes"), inv.get("kv_cache_tokens")
    if record.kind != "infer" or not total or not tokens:
        return None
    steps = trace.step_windows()
    lo, hi = steps[-1] if steps else (-np.inf, np.inf)
    in_step = (trace.ts >= lo) & (trace.ts < hi)
    prefill = trace.ts[trace.named(labels.PREFILL) & in_step]
    decodes = np.sort(trace.ts[trace.named(labels.DECODE) & in_step]) * 1e3 + trace.base_time_ns
    start = prefill.min() * 1e3 + trace.base_time_ns if len(prefill) else -np.inf
    prompt = tokens - len(decodes)  # each decode pass feeds one new token back; the last one is only returned

    def at(t_ns: float) -> int:
        if t_ns < start:
            return 0
        held = prompt + int(np.searchsorted(decodes, t_ns, side="right"))
        return total * min(held, tokens) // tokens

    return at


def _reconcile(tl: np.ndarray, inv: dict[str, int], kv_cache: int = 0) -> dict:
    """Split the profiler's live bytes at one instant (``tl``: one timeline row), or at every instant at once
    (``tl``: the whole timeline; each category is then an array over time), into profkit's categories,
    inventory first.

    Inventory tensors are matched against the profiler categories they can hide in, in this order:
    parameters (the profiler files NF4 weights under INPUT: it does not see ``Params4bit`` as
    parameters), optimizer state, ZeRO's other buffers, then gradients -- live only as far as the
    profiler shows them (``param.grad`` exists from backward to ``zero_grad``) -- and an inference run's
    KV cache (under ACTIVATION). What remains is named by profkit's definitions, the estimate's and the
    storage lifetimes': what backward computes and drops within backward (AUTOGRAD_DETAIL: activation
    gradients, and ZeRO-2's reduce bucket, which backward writes into) and GRADIENT beyond the
    parameters' gradients are temporaries, INPUT is an activation (the batch), UNKNOWN is unattributed.
    Static bytes the profiler never saw make ``unattributed`` negative: the inventory wins.
    """
    pool = {name: tl[..., _T[name]].astype(np.int64) for name in TIMELINE_CATEGORIES}

    def take(amount, sources: tuple[str, ...]):
        """Remove ``amount`` from the pools in order; return how much could not be found."""
        for src in sources:
            got = np.minimum(amount, pool[src])
            pool[src] -= got
            amount -= got
        return amount

    params = inv.get("parameters_trainable", 0) + inv.get("parameters_frozen", 0) + inv.get("buffers", 0) \
        + inv.get("parameters_quantized", 0)
    missing = take(params, ("PARAMETER", "INPUT", "UNKNOWN"))
    missing += take(inv.get("optimizer_state", 0), ("OPTIMIZER_STATE", "UNKNOWN", "PARAMETER"))
    framework = inv.get("zero_framework", 0)
    missing += take(framework, ("UNKNOWN", "GRADIENT", "INPUT"))
    grads_total = inv.get("gradients", 0) + inv.get("zero_gradients", 0)
    gradients = grads_total - take(grads_total, ("GRADIENT",))
    missing += take(kv_cache, ("ACTIVATION", "TEMPORARY", "UNKNOWN"))
    return {
        "parameters_trainable": inv.get("parameters_trainable", 0),
        "parameters_frozen": inv.get("parameters_frozen", 0) + inv.get("buffers", 0),
        "parameters_quantized": inv.get("parameters_quantized", 0),
        # FSDP's gathered parameters: the export cannot tell them (it files them as activations or UNKNOWN), so
        # FSDP runs are broken down from the storage lifetimes and the export is only compared
        "parameters_unsharded": 0,
        "gradients": gradients,
        "optimizer_state": inv.get("optimizer_state", 0),
        "kv_cache": kv_cache,
        "activations": pool["ACTIVATION"] + pool["INPUT"],
        "temporaries": pool["TEMPORARY"] + pool["GRADIENT"] + pool["AUTOGRAD_DETAIL"] + framework,
        "allocator_overhead": 0,
        "unattributed": pool["UNKNOWN"] + pool["PARAMETER"] + pool["OPTIMIZER_STATE"] - missing,
    }


def analyze_memory(record: RunRecord, timeline: Timeline, windows: dict[str, tuple[float, float]],
                   kv_cache: Callable[[float], int] | None = None) -> MemoryResult:
    inv = inventory_totals(record)
    peaks = record.peaks
    cuda = "cuda_max_reserved" in peaks
    notes: list[str] = []
    rows, measured = [], []

    instants = {"peak": timeline.peak_index()}
    for phase, (start, end) in windows.items():
        instants[phase] = timeline.peak_index(start, end)

    for phase, i in instants.items():
        if i is None:
            notes.append(f"phase {phase}: no memory events inside its window")
            continue
        cats = {c: int(b) for c, b in _reconcile(timeline.live[i], inv,
                                                  kv_cache(timeline.t_ns[i]) if kv_cache else 0).items()}
        if cuda and phase == "peak":
            # The allocator's own counters are the measurement; the timeline only splits it.
            allocated, reserved = peaks["cuda_max_allocated"], peaks["cuda_max_reserved"]
            cats["allocator_overhead"] = reserved - allocated
            cats["unattributed"] += allocated - int(timeline.total[i])
            measured_peak, source = reserved, "cuda max_memory_reserved (memory cycle)"
        else:
            measured_peak = int(timeline.total[i])
            source = "profiler memory timeline" + (" (allocated; reserved is recorded for the run peak only)" if cuda else "")
        measured_peak += _ddp_buckets(cats, inv)
        rows += [{"category": c, "phase": phase, "bytes": int(b)} for c, b in cats.items()]
        measured.append({"phase": phase, "measured_peak_bytes": int(measured_peak), "source": source})
        if cats["unattributed"] < 0 and phase == "peak":
            notes.append(
                f"the inventory holds {-cats['unattributed']:,} bytes more than the profiler saw live at the peak "
                "(tensors it never saw used); the inventory wins, so unattributed is negative")
    if not cuda:
        notes.append("CPU runs have no allocator counters: allocator_overhead is 0 and the measured peak is the "
                     "profiler's memory timeline (process RSS, which includes code and libraries, is in the manifest)")
    return MemoryResult(pd.DataFrame(rows), pd.DataFrame(measured), notes,
                        activation_peak_bytes=_activation_peak(timeline, inv) if record.kind == "train" else None)


def _ddp_buckets(cats: dict[str, int], inventory: dict[str, int]) -> int:
    """DDP's gradient buckets (the inventory's ``ddp_buckets``, as DDP reports them) into ``gradients``. DDP
    allocates them when it wraps the model and no object walk reaches them: the allocator's counters hold them,
    and the storage lifetimes once its copies into them show the storages, both unattributed until here. What
    the instant's unattributed bytes cannot hold was seen by neither: it adds to the measurement (returned)."""
    buckets = inventory.get("ddp_buckets", 0)
    seen = min(buckets, max(cats["unattributed"], 0))
    cats["unattributed"] -= seen
    cats["gradients"] += buckets
    return buckets - seen


def _activation_peak(timeline: Timeline, inventory: dict[str, int]) -> int | None:
    """The reconciled activations at every instant of the memory step, at their largest."""
    if not len(timeline.t_ns):
        return None
    return int(np.max(_reconcile(timeline.live, inventory)["activations"]))


def cpu_allocation_peak(trace: Trace) -> int | None:
    """The peak of the CPU allocator's own count (``Total Allocated``) in a profkit memory trace: what the memory
    step allocated, from zero at its start. None where the trace has no such count (an older schema)."""
    mem = trace.memory
    if mem is None or not len(mem.ts):
        return None
    counted = mem.total_allocated[mem.device_type == 0]
    return int(counted.max()) if len(counted) and (counted >= 0).all() else None


def analyze_lifetimes(record: RunRecord, lifetimes: Lifetimes, cpu_allocated: int | None = None) -> MemoryResult:
    """The breakdown from the run's own storage lifetimes (``analyze.lifetimes``): the peak and each phase's peak.
    On CUDA the allocator's counters are the measurement and the lifetimes split it. On CPU the profiler's
    allocation counter (``cpu_allocated``: the peak of what the memory step allocated) and what was live when
    following began measure the peak too: what they count above the lifetimes' peak was allocated outside the
    dispatcher (Inductor's kernel buffers, an op's own workspace) and is unattributed. On every eager method of
    the micro and tiny matrices the two measurements agree within 0.14%."""
    inv = record.inventory or {}
    inv_totals = inventory_totals(record)
    kv_cache = int(inv.get("kv_cache_bytes") or 0) if record.kind == "infer" else 0
    peaks = record.peaks
    cuda = "cuda_max_reserved" in peaks
    counted = None if cuda or cpu_allocated is None else lifetimes.live_at_start + cpu_allocated
    unseen = max(counted - lifetimes.peak.bytes, 0) if counted is not None else 0
    rows, measured = [], []
    instants = {"peak": lifetimes.peak, **{p: v for p, v in lifetimes.phase_peaks.items() if p != "unattributed"}}
    for phase, at in instants.items():
        cats = dict.fromkeys(MEMORY_CATEGORIES, 0) | categories(at, kv_cache)
        if cuda and phase == "peak":
            allocated, reserved = peaks["cuda_max_allocated"], peaks["cuda_max_reserved"]
            cats["allocator_overhead"] = reserved - allocated
            cats["unattributed"] += allocated - at.bytes
            measured_peak, source = reserved, "cuda max_memory_reserved (memory cycle)"
        elif phase == "peak" and unseen:
            cats["unattributed"] += unseen
            measured_peak, source = at.bytes + unseen, "storage lifetimes and the profiler's allocation counter"
        else:
            measured_peak, source = at.bytes, "storage lifetimes"
        measured_peak += _ddp_buckets(cats, inv_totals)
        rows += [{"category": c, "phase": phase, "bytes": int(b)} for c, b in cats.items()]
        measured.append({"phase": phase, "measured_peak_bytes": int(measured_peak), "source": source})
    error = record.timings.get("memory_timeline_error")
    notes = ["memory from the run's storage lifetimes" + (f": the profiler's memory timeline was not exported ({error})"
                                                          if error else "")]
    if unseen:
        notes.append(f"the CPU allocator's count puts the peak {unseen:,} bytes above what the dispatcher saw "
                     f"({unseen / max(lifetimes.peak.bytes + unseen, 1):.1%} of it): allocated outside the dispatcher "
                     "(a compiled kernel's buffers, an op's own workspace), so unattributed")
    return MemoryResult(pd.DataFrame(rows), pd.DataFrame(measured), notes,
                        activation_peak_bytes=lifetimes.largest_category.get("activations", 0)
                        if record.kind == "train" else None)


SOURCES_COLUMNS = ["category", "lifetimes_bytes", "export_bytes", "difference_bytes", "difference_of_peak",
                   "allocator_bytes", "allocator_difference_of_peak"]


def compare_sources(export: pd.DataFrame | None, own: pd.DataFrame,
                    allocator: AllocatorOwners | None = None) -> pd.DataFrame:
    """The attributions at their own peaks, per category: what the profiler's export and, on CUDA, the allocator's
    history matched to the same owners (``analyze.allocator_owners``) say beside the storage lifetimes, and each
    difference as a share of the lifetimes' peak. A source that is missing has no figures (None)."""
    o = own[own.phase == "peak"].set_index("category").bytes
    e = export[export.phase == "peak"].set_index("category").bytes if export is not None else None
    a = allocator.by_category if allocator is not None else None
    peak = max(int(o.drop(["allocator_overhead"], errors="ignore").sum()), 1)
    present = [c for c in MEMORY_CATEGORIES if c != "allocator_overhead"
               and (o.get(c, 0) or (e is not None and e.get(c, 0)) or (a is not None and a.get(c, 0)))]
    rows = []
    for c in present:
        mine = int(o.get(c, 0))
        row = {"category": c, "lifetimes_bytes": mine, "export_bytes": None, "difference_bytes": None,
               "difference_of_peak": None, "allocator_bytes": None, "allocator_difference_of_peak": None}
        if e is not None:
            row.update(export_bytes=int(e.get(c, 0)), difference_bytes=mine - int(e.get(c, 0)),
                       difference_of_peak=(mine - int(e.get(c, 0))) / peak)
        if a is not None:
            row.update(allocator_bytes=int(a.get(c, 0)), allocator_difference_of_peak=(mine - int(a.get(c, 0))) / peak)
        rows.append(row)
    return pd.DataFrame(rows, columns=SOURCES_COLUMNS)


SOURCES_AGREE = 0.01  # of the peak: where two attributions differ by more, the breakdown says so


def disagreements(sources: pd.DataFrame) -> list[str]:
    """A note for each category where the storage lifetimes and another source (the profiler's export, the CUDA
    allocator's history) differ by more than ``SOURCES_AGREE`` of the peak (``compare_sources``' table): a
    disagreement is shown, never averaged away."""
    notes = []
    for column, difference, name in (("export_bytes", "difference_of_peak", "the profiler's export"),
                                     ("allocator_bytes", "allocator_difference_of_peak", "the allocator's history")):
        known = sources[sources[difference].notna()]
        for r in known[known[difference].astype(float).abs() > SOURCES_AGREE].itertuples():
            notes.append(f"{r.category}: the storage lifetimes say {r.lifetimes_bytes:,} bytes at their peak, "
                         f"{name} {int(getattr(r, column)):,} ({float(getattr(r, difference)):+.1%} of the peak)")
    return notes
