"""The analysis of one source (a profkit run directory or a foreign trace): each analysis returns a Part, and
the parts are merged into the source's one (``analyse_source``). Every problem is caught here and named with its
file, so one bad input never stops the others."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profkit import store
from profkit.analyze.discovery import Problem, Source
from profkit.analyze.efficiency import analyze_efficiency, utilisation
from profkit.analyze.parts import Part, merged, tagged, unexpected
from profkit.analyze.run_memory import recorded_memory
from profkit.analyze.snapshot import EmptySnapshotError, SnapshotError, analyse_snapshot
from profkit.analyze.time import analyze_time
from profkit.analyze.trace import Trace, TraceError, load_trace
from profkit.analyze.trace_memory import analyze_trace_memory
from profkit.core import gpus
from profkit.core.units import human_bytes as h
from profkit.store.manifest import ManifestError, RunRecord

# Host calls that start work on a CUDA device: present without any GPU event, the device side was not recorded.
CUDA_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cudaMemcpyAsync")


def analyse_source(src: Source) -> Part:
    """Everything profkit can say about one source, as one Part (its row, tables, notes and problems)."""
    return merged(_recorded(src) if src.recorded else _foreign(src))


def _recorded(src: Source) -> list[Part]:
    run_dir = store.RunDir(src.path)
    base = {"run": src.run, "path": str(src.path), "recorded_by_profkit": True}
    try:
        record = src.record or run_dir.read_record()
    except ManifestError as exc:
        problem = Problem(run_dir.manifest, str(exc).removeprefix(f"{run_dir.manifest}: "))
        return [Part(row={**base, "method": src.run, "status": "unreadable", "reason": problem.message},
                     problems=[problem])]
    parts = [_record_part(src, run_dir, record, base), _allocator_snapshot(run_dir)]
    if record.status != "ok":
        return parts  # shown with its status, never as zeros
    clean_step = record.timings.get("step_time_s")
    time_part, _trace, t = _trace_part(src.run, record.method, run_dir.time_trace, record, clean_step)
    memory = recorded_memory(src.run, record.method, record, run_dir, t, clean_step)
    return parts + [time_part, memory]


def _foreign(src: Source) -> list[Part]:
    first = Part(row={"run": src.run, "path": str(src.path), "recorded_by_profkit": False, "method": src.run,
                      "status": "foreign", "reason": None})
    time_part, trace, t = _trace_part(src.run, src.run, src.path, None, None)
    if trace is None:  # why, from the problems just reported; nothing more to say about its memory
        why = Part(row={"status": "unreadable", "reason": "; ".join(p.message for p in time_part.problems) or None})
        return [first, time_part, why]
    return [first, time_part, _foreign_memory(src, trace, t)]


def _record_part(src: Source, run_dir: store.RunDir, record: RunRecord, base: dict) -> Part:
    """The run's manifest: what it ran, its status and its clean timings."""
    timings = record.timings
    clean_wait, clean_problems = _share(timings, "cpu_wait_share", run_dir.manifest)
    profiled_wait, profiled_problems = _share(timings, "profiled_cpu_wait_share", run_dir.manifest)
    row = {**base, "method": record.method, "kind": record.kind, "engine": record.engine,
           "settings": record.settings, "status": record.status, "reason": record.reason,
           "device": record.device.get("type"), "clean_step_time_s": timings.get("step_time_s"),
           "tokens_per_s": timings.get("tokens_per_s"), "clean_cpu_wait_share": clean_wait,
           "profiled_cpu_wait_share": profiled_wait}
    if record.repetition is not None or src.path.name.startswith(store.REPETITION_PREFIX):
        row.update(repetition_of=src.path.parent.name, repetition=record.repetition)
    if record.kind == "infer":
        row.update({k: timings.get(k) for k in ("ttft_median_s", "tpot_median_s", "tpot_p90_s")})
        row.update({k: (record.inventory or {}).get(k) for k in ("kv_cache_bytes", "kv_cache_tokens")})
    if timings.get("step_times_s"):
        row.update(clean_step_min_s=min(timings["step_times_s"]), clean_step_max_s=max(timings["step_times_s"]))
    return Part(row=row, problems=clean_problems + profiled_problems, record=record)


def _trace_part(run: str, method: str, path: Path, record: RunRecord | None,
                clean_step: float | None) -> tuple[Part, Trace | None, object | None]:
    """The time trace: time by category, the profiled steps, the ranks, and the work against its time. Returns
    the part with the trace and its time analysis (None where it could not be read), which memory uses."""
    parts = [Part()]
    trace = t = None
    try:
        trace = load_trace(path)
        parts[0].problems += [Problem(path, w, fatal=False) for w in trace.warnings]
        t = analyze_time(trace)
        parts.append(_time_part(run, method, trace, t, record))
        parts.append(_efficiency(trace, t, record, clean_step, run, method))
    except TraceError as exc:
        parts.append(Part(problems=[Problem(exc.path, exc.reason)]))
    except Exception as exc:  # no input may end in a traceback: name the file, keep analysing the others
        parts.append(Part(problems=[Problem(path, unexpected(exc))]))
    return merged(parts), trace, t


def _time_part(run: str, method: str, trace: Trace, t, record: RunRecord | None) -> Part:
    frames = {kind: tagged(frame, run, method) for kind, frame in
              (("time", t.rows), ("time_by_name", t.by_name), ("time_per_step", t.per_step))}
    row: dict = {}
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
    return Part(row=row, frames=frames, notes=list(t.notes) + _host_only(trace))


def _host_only(trace: Trace) -> list[str]:
    """A trace whose host launched CUDA work but that holds no GPU event was recorded without the CUDA activity:
    its times are the host's alone, and saying nothing would pass them off as the step's."""
    if trace.has_gpu:
        return []
    launches = int(trace.named(*CUDA_LAUNCHES).sum())
    if not launches:
        return []
    return [f"{trace.path.name}: the host launched CUDA work ({launches:,} cudaLaunchKernel/cuLaunchKernel/"
            "cudaMemcpyAsync calls) but the trace holds no GPU events (recorded without ProfilerActivity.CUDA): "
            "the GPU side is missing, the times are host-side only"]


def _efficiency(trace: Trace, t, record: RunRecord | None, clean_step: float | None, run: str, method: str) -> Part:
    """The work per category against its time; MFU over the clean step where the run has one (a profiled
    step is slowed by the profiler), else the profiled step."""
    gpu, name = gpus.from_trace(trace.metadata)
    if not name and record is not None:
        name = record.device.get("name") or record.device.get("type") or ""
    part = Part(row={"device_name": name or None, "gpu": gpu.key if gpu else None})
    if trace.has_gpu and gpu is None and name:
        part.notes.append(f"{trace.path.name}: the device {name!r} is not in profkit's GPU table: work and rates are "
                          "shown, shares of its peak are not")
    e = analyze_efficiency(trace, t, gpu)
    if e is None:
        if trace.has_gpu:
            part.notes.append(f"{trace.path.name}: recorded without shapes (record_shapes): no FLOPs or bytes per "
                              "category, no MFU")
        return part
    part.frames["efficiency"] = tagged(e.rows.assign(resource=e.resource), run, method)
    step = clean_step or (t.gpu_window_s if e.resource == "gpu" else t.step_time_s)
    part.row.update(model_flop_per_step=e.model_flop, hardware_flop_per_step=e.hardware_flop,
                    flop_precision=e.precision or None, uncounted_time_fraction=e.uncounted_fraction,
                    **utilisation(e, step, gpu))
    part.notes += e.notes
    return part


def _allocator_snapshot(run_dir: store.RunDir) -> Part:
    """A CUDA run's allocator snapshot (at an OOM, the OOM's): ``allocator_overhead`` (reserved - allocated) split
    into wholly free cached segments and free blocks inside segments in use (fragmentation), at the dump."""
    path = next((p for p in (run_dir.oom_snapshot, run_dir.cuda_snapshot) if p.is_file()), None)
    if path is None:
        return Part()
    try:
        snap = analyse_snapshot(path)
    except EmptySnapshotError as exc:
        return Part(notes=[f"allocator snapshot ({path.name}): {exc.reason}"])
    except SnapshotError as exc:
        return Part(problems=[Problem(exc.path, exc.reason, fatal=False)])
    d = snap.devices
    row = {"allocator_cached_free_bytes": int(d.empty_segment_bytes.sum()),
           "allocator_fragmentation_bytes": int(d.inactive_split_bytes.sum()),
           "largest_free_block_bytes": int(d.largest_free_block_bytes.max())}
    notes = [f"allocator snapshot ({path.name}, at the end of the memory cycle): reserved - allocated = "
             f"{h(int(d.free_in_reserved_bytes.sum()))}, of which {h(row['allocator_cached_free_bytes'])} in "
             f"wholly free cached segments and {h(row['allocator_fragmentation_bytes'])} in free blocks inside "
             f"segments in use (fragmentation; largest free block {h(row['largest_free_block_bytes'])}); "
             f"`profkit snapshot {path}` for the rest"]
    notes += [f"out of memory: {o.verdict}: {o.explanation}" for _, o in snap.oom.iterrows()]
    return Part(row=row, notes=notes, snapshot=snap)


def _foreign_memory(src: Source, trace: Trace, t) -> Part:
    """A trace profkit did not record: memory from its own [memory] events, where it has them."""
    part = Part()
    tm = None
    try:
        tm = analyze_trace_memory(trace, t.ops if t is not None else None)
    except Exception as exc:
        part.problems.append(Problem(src.path, unexpected(exc)))
    if tm is None:
        part.notes.append("memory breakdown unavailable: the trace has no [memory] events (record with "
                          "profile_memory=True) and, not recorded by profkit, no inventory of parameters, gradients "
                          "and optimizer state; record with `profkit record` or `profkit.Session` for one")
        return part
    part.frames.update(trace_memory=tagged(tm.live, src.run, src.run),
                       trace_memory_peaks=tagged(tm.peaks, src.run, src.run),
                       memory_over_time=tagged(tm.timeline, src.run, src.run))
    accelerators = tm.peaks[tm.peaks.device != "cpu"]
    top = (accelerators if len(accelerators) else tm.peaks)
    top = top.loc[top.peak_allocated_bytes.idxmax()]
    reserved = int(top.peak_reserved_bytes) if pd.notna(top.peak_reserved_bytes) else None
    part.row.update(measured_peak_bytes=reserved if reserved is not None else int(top.peak_allocated_bytes),
                    allocated_peak_bytes=int(top.peak_allocated_bytes), reserved_peak_bytes=reserved)
    part.notes += tm.notes
    return part


def _share(timings: dict, key: str, manifest: Path) -> tuple[float | None, list[Problem]]:
    """A share the manifest's timings hold (0 to 1), or None: absent (recorded before profkit read it, or where
    Linux's scheduler counts are missing), or damaged, which is reported and left out."""
    value = timings.get(key)
    if value is None:
        return None, []
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value <= 1.0:
        return float(value), []
    return None, [Problem(manifest, f"timings.{key} is {value!r}, not a share between 0 and 1: left out",
                          fatal=False)]
