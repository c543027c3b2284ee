"""The facade of the analysis: ``breakdown(paths)`` finds runs (profkit run directories, directories of them, or
plain Kineto traces that profkit did not record), analyses each (``analyze.sources``), and collects every problem
with the file it concerns, so one bad input never stops the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from profkit.analyze.discovery import Problem, discover
from profkit.analyze.disturbed import disturbance, profiled_contention
from profkit.analyze.efficiency import EFFICIENCY_COLUMNS
from profkit.analyze.memory import SOURCES_COLUMNS, Timeline
from profkit.analyze.parts import FRAME_KINDS
from profkit.analyze.predicted import PREDICTED_COLUMNS, PREDICTED_TIME_COLUMNS
from profkit.analyze.trace_memory import LIVE_COLUMNS, PEAK_COLUMNS
from profkit.analyze.workers import analyse_all
from profkit.store.manifest import RunRecord

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


def breakdown(paths: list[Path | str], jobs: int | None = None) -> Breakdown:
    """``jobs``: worker processes (None: by CPU count and available memory; 1: none)."""
    sources, problems = discover([Path(p) for p in paths])
    parts = analyse_all(sources, jobs)
    runs = [part.row for part in parts]
    for row in runs:
        row["disturbed"] = disturbance(row)
        row["profiled_contended"] = profiled_contention(row)
    frames = {kind: _frame([p.frames[kind] for p in parts if kind in p.frames]) for kind in FRAME_KINDS}

    def frame(kind: str, columns: list[str] | None = None) -> pd.DataFrame:
        got = frames[kind]
        if got is None:
            return pd.DataFrame(columns=columns or [])
        return got[columns] if columns else got

    def kept(name: str) -> dict:
        return {src.run: getattr(p, name) for src, p in zip(sources, parts) if getattr(p, name) is not None}

    return Breakdown(
        runs=_runs_frame(runs), memory=frame("memory", MEMORY_COLUMNS), time=frame("time", TIME_COLUMNS),
        time_by_name=frame("time_by_name", TIME_BY_NAME_COLUMNS), measured=frame("measured"),
        predicted=frame("predicted", ["run", "method", *PREDICTED_COLUMNS]),
        predicted_time=frame("predicted_time", ["run", "method", *PREDICTED_TIME_COLUMNS]),
        problems=problems + [p for part in parts for p in part.problems],
        notes={src.run: part.notes for src, part in zip(sources, parts)}, phase_windows=kept("windows"),
        records=kept("record"), snapshots=kept("snapshot"), timelines=kept("timeline"),
        trace_memory=frame("trace_memory", ["run", "method", *LIVE_COLUMNS]),
        trace_memory_peaks=frame("trace_memory_peaks", ["run", "method", *PEAK_COLUMNS]),
        memory_over_time=frame("memory_over_time"),
        time_per_step=frame("time_per_step", ["run", "method", "category", "step", "seconds"]),
        memory_sources=frame("memory_sources", ["run", "method", *SOURCES_COLUMNS]),
        efficiency=frame("efficiency", ["run", "method", "resource", *EFFICIENCY_COLUMNS]),
    )


def _frame(frames: list[pd.DataFrame]) -> pd.DataFrame | None:
    got = [f for f in frames if not f.empty]
    return pd.concat(got, ignore_index=True) if got else None


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    extra = [col for col in frame.columns if col not in RUN_COLUMNS]
    return frame.reindex(columns=RUN_COLUMNS + extra)
