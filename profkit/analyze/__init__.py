"""Analysis of recorded runs: pure functions from stored files to long-format pandas DataFrames.

``breakdown(paths)`` is the facade: it finds runs (profkit run directories, directories of them, or plain
Kineto traces that profkit did not record), runs the time and memory analyzers on each, and collects
every problem with the file it concerns, so one bad input never stops the others. No torch import.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import psutil

from profkit import store
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.efficiency import EFFICIENCY_COLUMNS, analyze_efficiency, utilisation
from profkit.analyze.allocator_owners import AllocatorOwners, attribute_history
from profkit.analyze.lifetimes import LifetimeEvents, attribute, read_lifetimes
from profkit.analyze.memory import (MEMORY_CATEGORIES, SOURCES_COLUMNS, Timeline, analyze_lifetimes, analyze_memory,
                                    compare_sources, cpu_allocation_peak, disagreements, kv_cache_at, load_timeline,
                                    phase_windows)
from profkit.analyze.disturbed import disturbance, profiled_contention
from profkit.analyze.predicted import (PREDICTED_COLUMNS, PREDICTED_TIME_COLUMNS, predicted_time,
                                      predicted_vs_measured)
from profkit.analyze.time import analyze_time
from profkit.analyze.trace import TraceError, load_trace
from profkit.analyze.snapshot import SnapshotError, analyse_snapshot, load_snapshot
from profkit.analyze.trace_memory import LIVE_COLUMNS, PEAK_COLUMNS, analyze_trace_memory
from profkit.core import gpus, labels
from profkit.core.units import human_bytes as h
from profkit.store.manifest import ManifestError, RunRecord

TRACE_SUFFIXES = (".json", ".json.gz")
MEMORY_COLUMNS = ["run", "method", "category", "phase", "bytes"]
TIME_COLUMNS = ["run", "method", "resource", "category", "phase", "seconds", "overlapped_seconds"]
TIME_BY_NAME_COLUMNS = ["run", "method", "resource", "category", "name", "seconds", "overlapped_seconds"]
# Every run row has these columns, whatever it is (a failed run, a foreign trace): absent values are NaN/None.
RUN_COLUMNS = ["run", "path", "recorded_by_profkit", "method", "kind", "engine", "settings", "status", "reason",
               "allocator_cached_free_bytes", "allocator_fragmentation_bytes", "largest_free_block_bytes",
               "device", "clean_step_time_s", "tokens_per_s", "profiled_step_time_s", "gpu_step_time_s",
               "profiled_steps", "coverage_cpu", "coverage_gpu", "measured_peak_bytes", "predicted_peak_bytes",
               "rank", "world_size", "first_step_start_us", "communication_exposed_s", "communication_overlapped_s",
               "other_threads_op_s", "clean_step_min_s", "clean_step_max_s", "profiled_step_min_s", "profiled_step_max_s",
               "clean_cpu_wait_share", "profiled_cpu_wait_share",
               "repetition_of", "repetition", "ttft_median_s", "tpot_median_s", "tpot_p90_s", "kv_cache_bytes",
               "kv_cache_tokens", "device_name", "gpu", "model_flop_per_step", "hardware_flop_per_step",
               "flop_precision", "mfu", "hfu", "uncounted_time_fraction", "allocated_peak_bytes", "reserved_peak_bytes",
               "activation_peak_bytes", "disturbed", "profiled_contended"]


@dataclass(frozen=True)
class Source:
    """One thing to analyse: a profkit run directory, or a foreign trace file."""

    run: str
    path: Path
    recorded: bool  # True: a profkit run directory with a manifest
    record: RunRecord | None = None  # its manifest, read once by discovery (None: unreadable, reported later)


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    fatal: bool = True  # False: a warning; the input was still analysed

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


@dataclass
class Breakdown:
    runs: pd.DataFrame  # one row per run: status, timings, measured peak, coverage
    memory: pd.DataFrame  # run, method, category, phase, bytes
    time: pd.DataFrame  # run, method, resource, category, phase, seconds, overlapped_seconds (per profiled step;
    # GPU: seconds is exposed time, overlapped_seconds the kernel time hidden under higher-priority work)
    time_by_name: pd.DataFrame  # run, method, resource, category, name, seconds
    measured: pd.DataFrame  # run, method, phase, measured_peak_bytes, source
    predicted: pd.DataFrame  # run, method, category, phase, predicted_bytes, measured_bytes, error
    problems: list[Problem] = field(default_factory=list)
    notes: dict[str, list[str]] = field(default_factory=dict)
    phase_windows: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # run -> phase -> ns
    records: dict[str, RunRecord] = field(default_factory=dict)  # run -> its manifest (profkit runs only)
    # Traces profkit did not record, from their [memory] events: bytes live at each device's allocated peak by
    # the phase and category that allocated them; the peaks; allocated/reserved over time.
    trace_memory: pd.DataFrame = field(default_factory=pd.DataFrame)  # run, method, device, phase, category, ...
    trace_memory_peaks: pd.DataFrame = field(default_factory=pd.DataFrame)
    memory_over_time: pd.DataFrame = field(default_factory=pd.DataFrame)  # run, device, t_s, allocated/reserved
    # Host seconds of each category in each profiled step (run, method, category, step, seconds): the spread
    # that a difference between runs must exceed to be more than noise (profkit.analyze.noise).
    time_per_step: pd.DataFrame = field(default_factory=pd.DataFrame)
    # CUDA runs: the allocator snapshot profkit dumped (memory_snapshot.pickle, or oom_snapshot.pickle), analysed.
    snapshots: dict = field(default_factory=dict)  # run -> profkit.analyze.snapshot.SnapshotAnalysis
    # profkit runs: the memory cycle's timeline as loaded, so that renderers (plots) never read it again.
    timelines: dict[str, Timeline] = field(default_factory=dict)  # run -> profkit.analyze.memory.Timeline
    # profkit runs with both attributions: the storage lifetimes' and the profiler export's bytes per category
    # at the peak, side by side (run, method, category, lifetimes_bytes, export_bytes, difference_...).
    memory_sources: pd.DataFrame = field(default_factory=pd.DataFrame)
    # Traces with shapes: each time category's work (FLOPs, bytes) per step against its time, and on a known
    # GPU the roof that bounds it (run, method, resource, *analyze.efficiency.EFFICIENCY_COLUMNS).
    efficiency: pd.DataFrame = field(default_factory=pd.DataFrame)
    # GPU runs: the step time predicted before the run (``estimate --gpu``) beside the measured, per category.
    predicted_time: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def failed(self) -> bool:
        return any(p.fatal for p in self.problems)

    def common_notes(self) -> list[str]:
        """Notes that every run carries, to be said once."""
        lists = [set(n) for n in self.notes.values()]
        return sorted(set.intersection(*lists)) if len(lists) > 1 else []


def discover(paths: list[Path]) -> tuple[list[Source], list[Problem]]:
    sources: list[Source] = []
    problems: list[Problem] = []
    for path in paths:
        if not path.exists():
            problems.append(Problem(path, "no such file or directory"))
        elif path.is_file():
            if path.name.endswith(TRACE_SUFFIXES):
                sources.append(Source(_trace_run_name(path), path, False))
            else:
                problems.append(Problem(path, "not a trace (.json or .json.gz) or a run directory"))
        elif store.is_run_dir(path):
            sources += _run_sources(path)
        else:
            found = _discover_dir(path, problems)
            if not found:
                problems.append(Problem(path, "no profkit runs or Kineto traces found in this directory"))
            sources += found
    return _unique_names(sources), problems


def _run_sources(path: Path) -> list[Source]:
    """A run directory: itself, or for a complete run of several ranks each rank's directory, analysed as a run
    of its own named ``<run>/rank<k>`` (the cross-rank view groups them again). A multi-rank run that did not
    complete is one row, with the status and the rank that caused it."""
    try:
        record = store.RunDir(path).read_record()
    except ManifestError:
        return [Source(path.name, path, True)]  # reported as unreadable by the analysis
    if not record.complete or (record.world_size <= 1 and record.repeats <= 1):
        return [Source(path.name, path, True, record)]
    if record.repeats > 1:  # each repetition, itself perhaps a run of several ranks
        return [replace(src, run=f"{path.name}/{src.run}") for k in range(record.repeats)
                for src in _run_sources(store.RunDir(path).repetition(k).path)]
    return [_rank_source(f"{path.name}/{rank.path.name}", rank) for rank in
            (store.RunDir(path).rank(k) for k in range(record.world_size))]


def _rank_source(run: str, rank: store.RunDir) -> Source:
    try:
        return Source(run, rank.path, True, rank.read_record())
    except ManifestError:
        return Source(run, rank.path, True)  # reported as unreadable by the analysis


def _unique_names(sources: list[Source]) -> list[Source]:
    """Runs of the same name from different directories (two recordings of ``lora``) are told apart by their
    parent directory's name, and by a counter if that is not enough: a run name is a table column."""
    counts = Counter(s.run for s in sources)
    renamed = [replace(s, run=f"{s.path.parent.name}/{s.run}") if counts[s.run] > 1 else s for s in sources]
    seen: Counter = Counter()
    out = []
    for s in renamed:
        seen[s.run] += 1
        out.append(s if seen[s.run] == 1 else replace(s, run=f"{s.run}#{seen[s.run]}"))
    return out


def _discover_dir(path: Path, problems: list[Problem], depth: int = 0) -> list[Source]:
    found: list[Source] = []
    for child in sorted(path.iterdir()):
        if child.name.startswith("."):
            continue  # partial recordings and earlier attempts are never analysed as runs
        if child.is_dir():
            if store.is_run_dir(child):
                found += _run_sources(child)
            elif depth < 1:
                found += _discover_dir(child, problems, depth + 1)  # TensorBoard logdir/run/worker.pt.trace.json
        elif child.name.endswith(".raw.json.gz"):
            problems.append(Problem(child, "a memory timeline without a profkit manifest: skipped (the memory "
                                           "breakdown needs the run's inventory)", fatal=False))
        elif child.name.endswith(TRACE_SUFFIXES):
            found.append(Source(_trace_run_name(child) if depth == 0 else f"{path.name}/{_trace_run_name(child)}",
                                child, False))
        else:
            problems.append(Problem(child, "skipped: not a trace (.json or .json.gz)", fatal=False))
    return found


def _trace_run_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name


class _Collected:
    """What the analyzers produce for every source, gathered before it becomes one Breakdown."""

    def __init__(self) -> None:
        self.runs: list[dict] = []
        self.frames: dict[str, list[pd.DataFrame]] = {k: [] for k in (
            "memory", "time", "time_by_name", "measured", "predicted", "trace_memory", "trace_memory_peaks",
            "memory_over_time", "time_per_step", "memory_sources", "efficiency", "predicted_time")}
        self.notes: dict[str, list[str]] = {}
        self.windows: dict[str, dict] = {}
        self.records: dict[str, RunRecord] = {}
        self.snapshots: dict = {}
        self.timelines: dict[str, Timeline] = {}

    def merge(self, other: "_Collected") -> None:
        for kind, frames in other.frames.items():
            self.frames[kind] += frames
        self.windows.update(other.windows)
        self.records.update(other.records)
        self.snapshots.update(other.snapshots)
        self.timelines.update(other.timelines)

    def add(self, kind: str, frame: pd.DataFrame, run: str, method: str) -> None:
        self.frames[kind].append(frame.assign(run=run, method=method))

    def frame(self, kind: str, columns: list[str] | None = None) -> pd.DataFrame:
        got = [f for f in self.frames[kind] if not f.empty]
        if not got:
            return pd.DataFrame(columns=columns or [])
        out = pd.concat(got, ignore_index=True)
        return out[columns] if columns else out


# Many inputs (the ranks of a large job) are analysed in worker processes, one input at a time each, with as
# many workers as the memory of the largest input allows; a few small inputs are faster in this process.
# A spawned worker costs about a second to start (measured: 64 ranks of 110 MB in all took 1.4 s in this process
# and 2.2 s with two workers on two cores), so only inputs that take several seconds are worth it.
PARALLEL_MIN_BYTES = 256 << 20  # uncompressed trace bytes, all inputs together
PEAK_PER_TRACE_BYTE = 2.5  # analysis peak over the uncompressed trace (measured: reports/benchmarks/)
MEMORY_SHARE = 0.5  # of the memory available when the analysis starts


def breakdown(paths: list[Path | str], jobs: int | None = None) -> Breakdown:
    """``jobs``: worker processes (None: by CPU count and available memory; 1: none)."""
    sources, problems = discover([Path(p) for p in paths])
    c = _Collected()
    for src, (row, part, found, notes) in zip(sources, _analyse_all(sources, jobs)):
        c.runs.append(row)
        c.merge(part)
        problems += found
        c.notes[src.run] = notes
    for row in c.runs:
        row["disturbed"] = disturbance(row)
        row["profiled_contended"] = profiled_contention(row)
    return Breakdown(
        runs=_runs_frame(c.runs), memory=c.frame("memory", MEMORY_COLUMNS), time=c.frame("time", TIME_COLUMNS),
        time_by_name=c.frame("time_by_name", TIME_BY_NAME_COLUMNS), measured=c.frame("measured"),
        predicted=c.frame("predicted", ["run", "method", *PREDICTED_COLUMNS]),
        predicted_time=c.frame("predicted_time", ["run", "method", *PREDICTED_TIME_COLUMNS]),
        problems=problems, notes=c.notes, phase_windows=c.windows, records=c.records, snapshots=c.snapshots,
        timelines=c.timelines,
        trace_memory=c.frame("trace_memory", ["run", "method", *LIVE_COLUMNS]),
        trace_memory_peaks=c.frame("trace_memory_peaks", ["run", "method", *PEAK_COLUMNS]),
        memory_over_time=c.frame("memory_over_time"),
        time_per_step=c.frame("time_per_step", ["run", "method", "category", "step", "seconds"]),
        memory_sources=c.frame("memory_sources", ["run", "method", *SOURCES_COLUMNS]),
        efficiency=c.frame("efficiency", ["run", "method", "resource", *EFFICIENCY_COLUMNS]),
    )


def _analyse_one(src: Source) -> tuple[dict, "_Collected", list[Problem], list[str]]:
    part, found, notes = _Collected(), [], []
    row = _analyse(src, found, part, notes)
    return row, part, found, notes


def _analyse_all(sources: list[Source], jobs: int | None):
    sizes = [_trace_bytes(src) for src in sources]
    workers = jobs if jobs is not None else _auto_workers(sizes)
    workers = max(1, min(workers, len(sources)))
    if workers == 1:
        return [_analyse_one(src) for src in sources]
    # spawn: workers start from a clean interpreter, not a fork of a process that may hold threads (torch, a
    # GUI), and no server process outlives the analysis (forkserver's would).
    ctx = multiprocessing.get_context("spawn")
    # Largest first, so that a big input does not start last; results come back in input order.
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        order = sorted(range(len(sources)), key=lambda i: -sizes[i])
        futures = {i: pool.submit(_analyse_one, sources[i]) for i in order}
        return [futures[i].result() for i in range(len(sources))]


def _auto_workers(sizes: list[int]) -> int:
    if len(sizes) < 2 or sum(sizes) < PARALLEL_MIN_BYTES:
        return 1
    try:
        available = psutil.virtual_memory().available
    except Exception:
        return 1
    per_worker = max(max(sizes) * PEAK_PER_TRACE_BYTE, 1)
    return max(1, min(os.cpu_count() or 1, int(available * MEMORY_SHARE // per_worker)))


def _trace_bytes(src: Source) -> int:
    """The uncompressed size of what ``src`` will parse (a gzip file's trailer holds it, modulo 4 GiB)."""
    paths = [src.path] if not src.recorded else [store.RunDir(src.path).time_trace, store.RunDir(src.path).memory_trace]
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            if path.name.endswith(".gz") and size >= 4:
                with open(path, "rb") as fh:
                    fh.seek(-4, 2)
                    size = max(size, int.from_bytes(fh.read(4), "little"))
            total += size
        except OSError:
            continue
    return total


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    extra = [col for col in frame.columns if col not in RUN_COLUMNS]
    return frame.reindex(columns=RUN_COLUMNS + extra)


def _share(timings: dict, key: str, manifest: Path, problems: list[Problem]) -> float | None:
    """A share the manifest's timings hold (0 to 1), or None: absent (recorded before profkit read it, or where
    Linux's scheduler counts are missing), or damaged, which is reported and left out."""
    value = timings.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value)
    problems.append(Problem(manifest, f"timings.{key} is {value!r}, not a share between 0 and 1: left out",
                            fatal=False))
    return None


def _analyse(src: Source, problems: list[Problem], c: _Collected, notes: list[str]) -> dict:
    row: dict = {"run": src.run, "path": str(src.path), "recorded_by_profkit": src.recorded}
    reported = len(problems)  # this run's problems are those appended from here on
    if src.recorded:
        run_dir = store.RunDir(src.path)
        try:
            record = src.record or run_dir.read_record()
        except ManifestError as exc:
            problems.append(Problem(run_dir.manifest, str(exc).removeprefix(f"{run_dir.manifest}: ")))
            row.update(method=src.run, status="unreadable", reason=problems[-1].message)
            return row
        c.records[src.run] = record
        method = record.method
        timings = record.timings
        row.update(method=method, kind=record.kind, engine=record.engine, settings=record.settings,
                   status=record.status, reason=record.reason, device=record.device.get("type"),
                   clean_step_time_s=timings.get("step_time_s"), tokens_per_s=timings.get("tokens_per_s"),
                   clean_cpu_wait_share=_share(timings, "cpu_wait_share", run_dir.manifest, problems),
                   profiled_cpu_wait_share=_share(timings, "profiled_cpu_wait_share", run_dir.manifest, problems))
        if record.repetition is not None or src.path.name.startswith(store.REPETITION_PREFIX):
            row.update(repetition_of=src.path.parent.name, repetition=record.repetition)
        if record.kind == "infer":
            row.update({k: timings.get(k) for k in ("ttft_median_s", "tpot_median_s", "tpot_p90_s")})
            row.update({k: (record.inventory or {}).get(k) for k in ("kv_cache_bytes", "kv_cache_tokens")})
        if timings.get("step_times_s"):
            row.update(clean_step_min_s=min(timings["step_times_s"]), clean_step_max_s=max(timings["step_times_s"]))
        _allocator_snapshot(src, run_dir, row, c, notes, problems)
        if record.status != "ok":
            return row  # shown with its status, never as zeros
        time_trace = run_dir.time_trace
    else:
        method, record, time_trace = src.run, None, src.path
        row.update(method=method, status="foreign", reason=None)

    trace = t = None
    try:
        trace = load_trace(time_trace)
        problems += [Problem(time_trace, w, fatal=False) for w in trace.warnings]
        t = analyze_time(trace)
        c.add("time", t.rows, src.run, method)
        c.add("time_by_name", t.by_name, src.run, method)
        c.add("time_per_step", t.per_step, src.run, method)
        if t.windows:
            lengths = [(b - a) / 1e6 for a, b in t.windows]
            row.update(profiled_step_min_s=min(lengths), profiled_step_max_s=max(lengths))
        row.update(profiled_step_time_s=t.step_time_s, gpu_step_time_s=t.gpu_window_s, profiled_steps=t.n_steps,
                   coverage_cpu=t.coverage("cpu"), coverage_gpu=t.coverage("gpu") if t.gpu_window_s else None,
                   communication_exposed_s=t.communication_exposed_s,
                   communication_overlapped_s=t.communication_overlapped_s, other_threads_op_s=t.other_threads_s)
        info = trace.metadata.get("distributedInfo") if isinstance(trace.metadata.get("distributedInfo"), dict) else {}
        if record is not None and record.rank is not None:
            info = {**info, "rank": record.rank, "world_size": record.world_size}
        if isinstance(info.get("rank"), int) and isinstance(info.get("world_size"), int):
            # Kineto timestamps are µs since the epoch, or since baseTimeNanoseconds in newer traces.
            row.update(rank=info["rank"], world_size=info["world_size"],
                       first_step_start_us=t.windows[0][0] + trace.base_time_ns / 1e3 if t.windows else None)
        notes += t.notes
        _efficiency(trace, t, record, row, c, notes, src.run, method)
    except TraceError as exc:
        problems.append(Problem(exc.path, exc.reason))
    except Exception as exc:  # no input may end in a traceback: name the file, keep analysing the others
        problems.append(Problem(time_trace, _unexpected(exc)))

    if record is None and trace is None:
        # Why, from the problem just reported; nothing more to say about its memory.
        row.update(status="unreadable", reason="; ".join(p.message for p in problems[reported:]) or None)
        return row
    if record is None:
        _foreign_memory(src, trace, t, row, c, notes, problems)
        return row
    try:
        own = allocator = memory_trace = None
        if run_dir.memory_trace.is_file() or not run_dir.storage_lifetimes.is_file():
            memory_trace = load_trace(run_dir.memory_trace)
            problems += [Problem(run_dir.memory_trace, w, fatal=False) for w in memory_trace.warnings]
            c.windows[src.run] = phase_windows(memory_trace, labels.PHASE_OF_LABEL)
        else:  # the lifetimes carry their own phases; only the export and the CPU allocation count need the trace
            problems.append(Problem(run_dir.memory_trace, "missing: memory from the storage lifetimes alone, not "
                                    "compared with the profiler's export", fatal=False))
        if run_dir.storage_lifetimes.is_file():
            try:
                lifetimes = read_lifetimes(run_dir.storage_lifetimes)
                own = analyze_lifetimes(record, attribute(lifetimes.events, lifetimes.owners),
                                        cpu_allocation_peak(memory_trace) if memory_trace is not None else None)
                allocator = _allocator_owners(record, run_dir, lifetimes, notes)
            except ValueError as exc:
                problems.append(Problem(run_dir.storage_lifetimes, str(exc), fatal=not run_dir.memory_timeline.is_file()))
        export = None
        if memory_trace is not None and (run_dir.memory_timeline.is_file() or own is None):
            timeline = c.timelines[src.run] = load_timeline(run_dir.memory_timeline)
            m = export = analyze_memory(record, timeline, c.windows[src.run], kv_cache_at(record, memory_trace))
        cuda = "cuda_max_reserved" in record.peaks
        if own is not None and (export is None or cuda or record.settings.get("fsdp")):
            # The run's own attribution stands where the export is gone, on CUDA, and under FSDP (the export
            # cannot tell the gathered parameters from what else it calls parameters); the export is then only
            # compared. On an H100 (torch 2.11, reports/gpu/) the export filed 52-84% of a training peak as
            # UNKNOWN, the activations the lifetimes and the allocator's own history both name, and the
            # allocator's counters measure the peak the lifetimes split. On CPU, with neither, the export and the
            # lifetimes agree at the peak (within 0.14% on the micro and tiny matrices) and the export stays.
            m = own
            if not run_dir.memory_timeline.is_file() and not record.timings.get("memory_timeline_error"):
                notes.append("the profiler's memory timeline was not exported: nothing to compare the lifetimes with")
        if own is not None and (export is not None or allocator is not None):
            sources = compare_sources(export.rows if export is not None else None, own.rows, allocator)
            c.add("memory_sources", sources, src.run, method)
            notes += disagreements(sources)
        c.add("memory", m.rows, src.run, method)
        c.add("measured", m.measured, src.run, method)
        peak = m.measured.loc[m.measured.phase == "peak", "measured_peak_bytes"]
        row["measured_peak_bytes"] = int(peak.iloc[0]) if len(peak) else None
        cuda_peaks = record.peaks if cuda else {}
        row.update(allocated_peak_bytes=cuda_peaks.get("cuda_max_allocated", row["measured_peak_bytes"]),
                   reserved_peak_bytes=cuda_peaks.get("cuda_max_reserved"),
                   activation_peak_bytes=m.activation_peak_bytes)
        notes += m.notes
        estimate = record.estimate or {}
        if "instants" in estimate:
            row["predicted_peak_bytes"] = estimate["peak_bytes"]
            c.add("predicted", predicted_vs_measured(estimate, m.rows, m.measured, cuda_peaks), src.run, method)
        elif "error" in estimate:
            notes.append(f"no memory estimate: {estimate['error']}")
        if "error" in (estimate.get("step_time") or {}):
            notes.append(f"no step time predicted: {estimate['step_time']['error']}")
        elif t is not None:
            c.add("predicted_time", predicted_time(estimate, t.rows, row.get("clean_step_time_s")), src.run, method)
    except TraceError as exc:
        problems.append(Problem(exc.path, exc.reason))
    except ValueError as exc:
        problems.append(Problem(run_dir.memory_timeline, str(exc)))
    except Exception as exc:
        problems.append(Problem(run_dir.path, _unexpected(exc)))
    return row


def _efficiency(trace, t, record, row: dict, c: _Collected, notes: list[str], run: str, method: str) -> None:
    """The work per category against its time; MFU over the clean step where the run has one (a profiled
    step is slowed by the profiler), else the profiled step."""
    gpu, name = gpus.from_trace(trace.metadata)
    if not name and record is not None:
        name = record.device.get("name") or record.device.get("type") or ""
    row.update(device_name=name or None, gpu=gpu.key if gpu else None)
    if trace.has_gpu and gpu is None and name:
        notes.append(f"{trace.path.name}: the device {name!r} is not in profkit's GPU table: work and rates are "
                     "shown, shares of its peak are not")
    e = analyze_efficiency(trace, t, gpu)
    if e is None:
        if trace.has_gpu:
            notes.append(f"{trace.path.name}: recorded without shapes (record_shapes): no FLOPs or bytes per "
                         "category, no MFU")
        return
    c.add("efficiency", e.rows.assign(resource=e.resource), run, method)
    step = row.get("clean_step_time_s") or (t.gpu_window_s if e.resource == "gpu" else t.step_time_s)
    row.update(model_flop_per_step=e.model_flop, hardware_flop_per_step=e.hardware_flop,
               flop_precision=e.precision or None, uncounted_time_fraction=e.uncounted_fraction,
               **utilisation(e, step, gpu))
    notes += e.notes


def _allocator_owners(record, run_dir: store.RunDir, lifetimes: LifetimeEvents,
                      notes: list[str]) -> AllocatorOwners | None:
    """On CUDA, the allocator history of the memory cycle matched to the storage lifetimes of its followed step."""
    if not run_dir.cuda_snapshot.is_file() or lifetimes.window_us is None or "cuda_max_reserved" not in record.peaks:
        return None
    try:
        snapshot = load_snapshot(run_dir.cuda_snapshot)
    except SnapshotError as exc:
        notes.append(f"the allocator's history could not be matched to owners: {exc.reason}")
        return None
    devices = {int(d.split(":")[1]) for _t, _a, _n, _b, d, *_ in lifetimes.events if d.startswith("cuda:")}
    if len(devices) != 1:
        return None  # a rank follows its own device; more than one is not a layout profkit records
    found = attribute_history(snapshot, lifetimes.events, lifetimes.owners, lifetimes.window_us, devices.pop())
    if found is None:
        notes.append("the allocator's history holds nothing inside the followed step (its ring buffer dropped it?): "
                     "not matched to owners")
        return None
    notes += found.notes
    return found


def _allocator_snapshot(src: Source, run_dir: store.RunDir, row: dict, c: _Collected, notes: list[str],
                        problems: list[Problem]) -> None:
    """A CUDA run's allocator snapshot (at an OOM, the OOM's): ``allocator_overhead`` (reserved - allocated) split
    into wholly free cached segments and free blocks inside segments in use (fragmentation), at the dump."""
    path = next((p for p in (run_dir.oom_snapshot, run_dir.cuda_snapshot) if p.is_file()), None)
    if path is None:
        return
    try:
        snap = analyse_snapshot(path)
    except SnapshotError as exc:
        problems.append(Problem(exc.path, exc.reason, fatal=False))
        return
    c.snapshots[src.run] = snap
    d = snap.devices
    row.update(allocator_cached_free_bytes=int(d.empty_segment_bytes.sum()),
               allocator_fragmentation_bytes=int(d.inactive_split_bytes.sum()),
               largest_free_block_bytes=int(d.largest_free_block_bytes.max()))
    notes.append(f"allocator snapshot ({path.name}, at the end of the memory cycle): reserved - allocated = "
                 f"{h(int(d.free_in_reserved_bytes.sum()))}, of which {h(row['allocator_cached_free_bytes'])} in "
                 f"wholly free cached segments and {h(row['allocator_fragmentation_bytes'])} in free blocks inside "
                 f"segments in use (fragmentation; largest free block {h(row['largest_free_block_bytes'])}); "
                 f"`profkit snapshot {path}` for the rest")
    for _, o in snap.oom.iterrows():
        notes.append(f"out of memory: {o.verdict}: {o.explanation}")


def _foreign_memory(src: Source, trace, t, row: dict, c: _Collected, notes: list[str], problems: list[Problem]) -> None:
    """A trace profkit did not record: memory from its own [memory] events, where it has them."""
    tm = None
    if trace is not None:
        try:
            tm = analyze_trace_memory(trace, t.ops if t is not None else None)
        except Exception as exc:
            problems.append(Problem(src.path, _unexpected(exc)))
    if tm is None:
        notes.append("memory breakdown unavailable: the trace has no [memory] events (record with "
                     "profile_memory=True) and, not recorded by profkit, no inventory of parameters, gradients and "
                     "optimizer state; record with `profkit record` or `profkit.Session` for one")
        return
    c.add("trace_memory", tm.live, src.run, src.run)
    c.add("trace_memory_peaks", tm.peaks, src.run, src.run)
    c.add("memory_over_time", tm.timeline, src.run, src.run)
    accelerators = tm.peaks[tm.peaks.device != "cpu"]
    top = (accelerators if len(accelerators) else tm.peaks)
    top = top.loc[top.peak_allocated_bytes.idxmax()]
    row["measured_peak_bytes"] = int(top.peak_reserved_bytes) if pd.notna(top.peak_reserved_bytes) else \
        int(top.peak_allocated_bytes)
    row.update(allocated_peak_bytes=int(top.peak_allocated_bytes),
               reserved_peak_bytes=int(top.peak_reserved_bytes) if pd.notna(top.peak_reserved_bytes) else None)
    notes += tm.notes


def _unexpected(exc: Exception) -> str:
    return (f"could not be analysed: {type(exc).__name__}: {exc} (an input profkit does not understand; please "
            "report it with the file)")


__all__ = ["Breakdown", "MEMORY_CATEGORIES", "TIME_CATEGORIES", "breakdown", "discover"]
