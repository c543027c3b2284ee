"""Analysis of recorded runs: pure functions from stored files to long-format pandas DataFrames.

``breakdown(paths)`` is the facade: it finds runs (profkit run directories, directories of them, or plain
Kineto traces that profkit did not record), runs the time and memory analyzers on each, and collects
every problem with the file it concerns, so one bad input never stops the others. No torch import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from profkit import labels, store
from profkit.manifest import ManifestError, RunRecord
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.memory import MEMORY_CATEGORIES, analyze_memory, load_timeline, phase_windows
from profkit.analyze.predicted import PREDICTED_COLUMNS, predicted_vs_measured
from profkit.analyze.time import analyze_time
from profkit.analyze.trace import TraceError, load_trace

TRACE_SUFFIXES = (".json", ".json.gz")
MEMORY_COLUMNS = ["run", "method", "category", "phase", "bytes"]
TIME_COLUMNS = ["run", "method", "resource", "category", "phase", "seconds", "overlapped_seconds"]


@dataclass(frozen=True)
class Source:
    """One thing to analyse: a profkit run directory, or a foreign trace file."""

    run: str
    path: Path
    recorded: bool  # True: a profkit run directory with a manifest


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
            sources.append(Source(path.name, path, True))
        else:
            found = _discover_dir(path, problems)
            if not found:
                problems.append(Problem(path, "no profkit runs or Kineto traces found in this directory"))
            sources += found
    return _unique_names(sources), problems


def _unique_names(sources: list[Source]) -> list[Source]:
    """Runs of the same name from different directories (two recordings of ``lora``) are told apart by their
    parent directory's name, and by a counter if that is not enough: a run name is a table column."""
    from collections import Counter
    from dataclasses import replace

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
                found.append(Source(child.name, child, True))
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


def breakdown(paths: list[Path | str]) -> Breakdown:
    sources, problems = discover([Path(p) for p in paths])
    runs, memory, time, by_name, measured, predicted = [], [], [], [], [], []
    notes: dict[str, list[str]] = {}
    windows: dict[str, dict] = {}
    records: dict[str, RunRecord] = {}
    for src in sources:
        row, run_notes = _analyse(src, problems, memory, time, by_name, measured, predicted, windows, records)
        runs.append(row)
        notes[src.run] = run_notes
    return Breakdown(
        runs=pd.DataFrame(runs),
        memory=pd.concat(memory, ignore_index=True) if memory else pd.DataFrame(columns=MEMORY_COLUMNS),
        time=pd.concat(time, ignore_index=True) if time else pd.DataFrame(columns=TIME_COLUMNS),
        time_by_name=pd.concat(by_name, ignore_index=True) if by_name else pd.DataFrame(),
        measured=pd.concat(measured, ignore_index=True) if measured else pd.DataFrame(),
        predicted=pd.concat(predicted, ignore_index=True) if predicted else
        pd.DataFrame(columns=["run", "method", *PREDICTED_COLUMNS]),
        problems=problems, notes=notes, phase_windows=windows, records=records,
    )


def _analyse(src: Source, problems: list[Problem], memory, time, by_name, measured, predicted,
             windows: dict, records: dict) -> tuple[dict, list[str]]:
    notes: list[str] = []
    row: dict = {"run": src.run, "path": str(src.path), "recorded_by_profkit": src.recorded}
    if src.recorded:
        run_dir = store.RunDir(src.path)
        try:
            record = run_dir.read_record()
        except ManifestError as exc:
            problems.append(Problem(run_dir.manifest, str(exc).removeprefix(f"{run_dir.manifest}: ")))
            row.update(method=src.run, status="unreadable")
            return row, notes
        records[src.run] = record
        method = record.method
        timings = record.timings
        row.update(method=method, kind=record.kind, engine=record.engine, settings=record.settings,
                   status=record.status, reason=record.reason, device=record.device.get("type"),
                   clean_step_time_s=timings.get("step_time_s"), tokens_per_s=timings.get("tokens_per_s"))
        if record.status != "ok":
            return row, notes  # shown with its status, never as zeros
        time_trace = run_dir.time_trace
    else:
        method, record, time_trace = src.run, None, src.path
        row.update(method=method, status="foreign", reason=None)

    try:
        t = analyze_time(load_trace(time_trace))
        time.append(t.rows.assign(run=src.run, method=method)[TIME_COLUMNS])
        by_name.append(t.by_name.assign(run=src.run, method=method))
        row.update(profiled_step_time_s=t.step_time_s, gpu_step_time_s=t.gpu_window_s, profiled_steps=t.n_steps,
                   coverage_cpu=t.coverage("cpu"), coverage_gpu=t.coverage("gpu") if t.gpu_window_s else None)
        notes += t.notes
    except TraceError as exc:
        problems.append(Problem(exc.path, exc.reason))
    except Exception as exc:  # no input may end in a traceback: name the file, keep analysing the others
        problems.append(Problem(time_trace, _unexpected(exc)))

    if record is None:
        notes.append("memory breakdown unavailable: not recorded by profkit, so there is no inventory of "
                     "parameters, gradients and optimizer state, and no categorized memory timeline; record with "
                     "`profkit record` for one")
        return row, notes
    try:
        timeline = load_timeline(run_dir.memory_timeline)
        windows[src.run] = phase_windows(load_trace(run_dir.memory_trace), labels.PHASE_OF_LABEL)
        m = analyze_memory(record, timeline, windows[src.run])
        memory.append(m.rows.assign(run=src.run, method=method)[MEMORY_COLUMNS])
        measured.append(m.measured.assign(run=src.run, method=method))
        peak = m.measured.loc[m.measured.phase == "peak", "measured_peak_bytes"]
        row["measured_peak_bytes"] = int(peak.iloc[0]) if len(peak) else None
        notes += m.notes
        estimate = record.estimate or {}
        if "instants" in estimate:
            row["predicted_peak_bytes"] = estimate["peak_bytes"]
            predicted.append(predicted_vs_measured(estimate, m.rows, m.measured).assign(run=src.run, method=method))
        elif "error" in estimate:
            notes.append(f"no memory estimate: {estimate['error']}")
    except TraceError as exc:
        problems.append(Problem(exc.path, exc.reason))
    except ValueError as exc:
        problems.append(Problem(run_dir.memory_timeline, str(exc)))
    except Exception as exc:
        problems.append(Problem(run_dir.path, _unexpected(exc)))
    return row, notes


def _unexpected(exc: Exception) -> str:
    return (f"could not be analysed: {type(exc).__name__}: {exc} (an input profkit does not understand; please "
            "report it with the file)")


__all__ = ["Breakdown", "MEMORY_CATEGORIES", "TIME_CATEGORIES", "breakdown", "discover"]
