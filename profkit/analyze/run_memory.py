"""A profkit run's memory: which of its sources attributes the peak, and that attribution against the estimate.

Three sources may describe a run's memory: the storage lifetimes profkit followed (``storage_lifetimes.json.gz``),
the profiler's memory export (``memory.pt.trace.json.gz`` with ``memory_timeline.raw.json.gz``), and on CUDA the
allocator's history (``memory_snapshot.pickle``), matched to the lifetimes' owners. ``choose_memory_source`` says
which one is used and why; the others are laid beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

from profkit import store
from profkit.analyze.allocator_owners import AllocatorOwners, attribute_history
from profkit.analyze.discovery import Problem
from profkit.analyze.lifetimes import LifetimeEvents, attribute, read_lifetimes
from profkit.analyze.memory import (MemoryResult, analyze_lifetimes, analyze_memory, compare_sources,
                                    cpu_allocation_peak, disagreements, kv_cache_at, load_timeline, phase_windows)
from profkit.analyze.parts import Part, merged, tagged, unexpected
from profkit.analyze.predicted import predicted_time, predicted_vs_measured
from profkit.analyze.snapshot import SnapshotError, load_snapshot
from profkit.analyze.trace import Trace, TraceError, load_trace
from profkit.core import labels
from profkit.store.manifest import RunRecord

LIFETIMES, EXPORT, ALLOCATOR = "lifetimes", "export", "allocator"
READ, ABSENT, DAMAGED = "read", "absent", "damaged"  # what became of a source's files


@dataclass(frozen=True)
class MemorySource:
    used: str | None  # LIFETIMES or EXPORT; None: no memory breakdown (the problems say why)
    why: str
    compared: tuple[str, ...] = ()  # the sources laid side by side in Breakdown.memory_sources


def choose_memory_source(lifetimes: str, export: str, allocator: str, cuda: bool, fsdp: bool) -> MemorySource:
    """Which source attributes the run's memory, from what became of each (READ, ABSENT or DAMAGED).

    The lifetimes stand where the export is gone, on CUDA, and under FSDP (the export cannot tell the gathered
    parameters from what else it calls parameters); the export is then only compared. On an H100 (torch 2.11,
    reports/gpu/) the export filed 52-84% of a training peak as UNKNOWN, the activations the lifetimes and the
    allocator's own history both name, and the allocator's counters measure the peak the lifetimes split. On CPU,
    with neither, the export and the lifetimes agree at the peak (within 0.14% on the micro and tiny matrices) and
    the export stays."""
    read = [name for name, state in ((EXPORT, export), (LIFETIMES, lifetimes), (ALLOCATOR, allocator))
            if state == READ]
    compared = tuple(read) if lifetimes == READ and len(read) > 1 else ()
    if lifetimes == READ:
        if export != READ:
            return MemorySource(LIFETIMES, f"the profiler's export is {export}", compared)
        if cuda:
            return MemorySource(LIFETIMES, "on CUDA the profiler's export files most activations as unknown",
                                compared)
        if fsdp:
            return MemorySource(LIFETIMES, "under FSDP the profiler's export cannot tell gathered parameters apart",
                                compared)
        return MemorySource(EXPORT, "on CPU the export and the storage lifetimes agree at the peak", compared)
    if export == READ:
        return MemorySource(EXPORT, f"the storage lifetimes are {lifetimes}")
    return MemorySource(None, f"the storage lifetimes are {lifetimes} and the profiler's export is {export}")


def recorded_memory(run: str, method: str, record: RunRecord, run_dir: store.RunDir, t,
                    clean_step: float | None) -> Part:
    """The memory part of a complete profkit run: every source read, one chosen, compared with the others."""
    parts: list[Part] = []
    try:
        trace, export_state, got = _memory_trace(run_dir)
        parts.append(got)
        own, allocator, lifetimes_state, got = _lifetimes(record, run_dir, trace)
        parts.append(got)
        export = None
        if trace is not None and (run_dir.memory_timeline.is_file() or own is None):
            export, export_state, got = _export(record, run_dir, trace, parts[0].windows)
            parts.append(got)
        cuda = "cuda_max_reserved" in record.peaks
        source = choose_memory_source(lifetimes_state, export_state, READ if allocator is not None else ABSENT,
                                      cuda, bool(record.settings.get("fsdp")))
        if source.used is not None:
            parts.append(_attributed(run, method, record, run_dir, source, own, export, allocator, t, clean_step))
    except TraceError as exc:
        parts.append(Part(problems=[Problem(exc.path, exc.reason)]))
    except ValueError as exc:
        parts.append(Part(problems=[Problem(run_dir.memory_timeline, str(exc))]))
    except Exception as exc:
        parts.append(Part(problems=[Problem(run_dir.path, unexpected(exc))]))
    return merged(parts)


def _memory_trace(run_dir: store.RunDir) -> tuple[Trace | None, str, Part]:
    """The memory cycle's trace: its phases, and the profiler's export with its timeline. Without it, the
    lifetimes carry their own phases; only the export and the CPU allocation count need the trace."""
    if not run_dir.memory_trace.is_file() and run_dir.storage_lifetimes.is_file():
        return None, ABSENT, Part(problems=[Problem(run_dir.memory_trace, "missing: memory from the storage "
                                                    "lifetimes alone, not compared with the profiler's export",
                                                    fatal=False)])
    try:
        trace = load_trace(run_dir.memory_trace)
    except TraceError as exc:
        state = DAMAGED if run_dir.memory_trace.is_file() else ABSENT
        return None, state, Part(problems=[Problem(exc.path, exc.reason)])
    part = Part(problems=[Problem(run_dir.memory_trace, w, fatal=False) for w in trace.warnings],
                windows=phase_windows(trace, labels.PHASE_OF_LABEL))
    return trace, ABSENT, part  # the export is read only where it is needed


def _lifetimes(record: RunRecord, run_dir: store.RunDir,
               trace: Trace | None) -> tuple[MemoryResult | None, AllocatorOwners | None, str, Part]:
    if not run_dir.storage_lifetimes.is_file():
        return None, None, ABSENT, Part()
    # A damaged lifetimes file stops the run's analysis only where the export can stand in for it.
    fatal = not (run_dir.memory_timeline.is_file() and run_dir.memory_trace.is_file())
    try:
        lifetimes = read_lifetimes(run_dir.storage_lifetimes)
        own = analyze_lifetimes(record, attribute(lifetimes.events, lifetimes.owners),
                                cpu_allocation_peak(trace) if trace is not None else None)
    except ValueError as exc:
        return None, None, DAMAGED, Part(problems=[Problem(run_dir.storage_lifetimes, str(exc), fatal=fatal)])
    try:
        allocator, notes = _allocator_owners(record, run_dir, lifetimes)
    except ValueError as exc:
        return own, None, READ, Part(problems=[Problem(run_dir.storage_lifetimes, str(exc), fatal=fatal)])
    return own, allocator, READ, Part(notes=notes)


def _export(record: RunRecord, run_dir: store.RunDir, trace: Trace,
            windows: dict) -> tuple[MemoryResult | None, str, Part]:
    """The profiler's categorized memory timeline, attributed to the run's inventory."""
    part = Part()
    try:
        part.timeline = load_timeline(run_dir.memory_timeline)
        export = analyze_memory(record, part.timeline, windows, kv_cache_at(record, trace))
    except TraceError as exc:
        part.problems.append(Problem(exc.path, exc.reason))
    except ValueError as exc:
        part.problems.append(Problem(run_dir.memory_timeline, str(exc)))
    else:
        return export, READ, part
    return None, DAMAGED if run_dir.memory_timeline.is_file() else ABSENT, part


def _attributed(run: str, method: str, record: RunRecord, run_dir: store.RunDir, source: MemorySource,
                own: MemoryResult | None, export: MemoryResult | None, allocator: AllocatorOwners | None, t,
                clean_step: float | None) -> Part:
    """The chosen attribution's rows, its peaks, and the estimate made before the run against them."""
    m = own if source.used == LIFETIMES else export
    part = Part()
    if m is own and not run_dir.memory_timeline.is_file() and not record.timings.get("memory_timeline_error"):
        part.notes.append("the profiler's memory timeline was not exported: nothing to compare the lifetimes with")
    if source.compared:
        sources = compare_sources(export.rows if export is not None else None, own.rows, allocator)
        part.frames["memory_sources"] = tagged(sources, run, method)
        part.notes += disagreements(sources)
    part.frames.update(memory=tagged(m.rows, run, method), measured=tagged(m.measured, run, method))
    peak = m.measured.loc[m.measured.phase == "peak", "measured_peak_bytes"]
    part.row["measured_peak_bytes"] = int(peak.iloc[0]) if len(peak) else None
    cuda_peaks = record.peaks if "cuda_max_reserved" in record.peaks else {}
    part.row.update(allocated_peak_bytes=cuda_peaks.get("cuda_max_allocated", part.row["measured_peak_bytes"]),
                    reserved_peak_bytes=cuda_peaks.get("cuda_max_reserved"),
                    activation_peak_bytes=m.activation_peak_bytes)
    part.notes += m.notes
    estimate = record.estimate or {}
    if "instants" in estimate:
        part.row["predicted_peak_bytes"] = estimate["peak_bytes"]
        part.frames["predicted"] = tagged(predicted_vs_measured(estimate, m.rows, m.measured, cuda_peaks), run, method)
    elif "error" in estimate:
        part.notes.append(f"no memory estimate: {estimate['error']}")
    if "error" in (estimate.get("step_time") or {}):
        part.notes.append(f"no step time predicted: {estimate['step_time']['error']}")
    elif t is not None:
        part.frames["predicted_time"] = tagged(predicted_time(estimate, t.rows, clean_step), run, method)
    return part


def _allocator_owners(record: RunRecord, run_dir: store.RunDir,
                      lifetimes: LifetimeEvents) -> tuple[AllocatorOwners | None, list[str]]:
    """On CUDA, the allocator history of the memory cycle matched to the storage lifetimes of its followed step."""
    if not run_dir.cuda_snapshot.is_file() or lifetimes.window_us is None or "cuda_max_reserved" not in record.peaks:
        return None, []
    try:
        snapshot = load_snapshot(run_dir.cuda_snapshot)
    except SnapshotError as exc:
        return None, [f"the allocator's history could not be matched to owners: {exc.reason}"]
    devices = {int(d.split(":")[1]) for _t, _a, _n, _b, d, *_ in lifetimes.events if d.startswith("cuda:")}
    if len(devices) != 1:
        return None, []  # a rank follows its own device; more than one is not a layout profkit records
    found = attribute_history(snapshot, lifetimes.events, lifetimes.owners, lifetimes.window_us, devices.pop())
    if found is None:
        return None, ["the allocator's history holds nothing inside the followed step (its ring buffer dropped "
                      "it?): not matched to owners"]
    return found, list(found.notes)
