"""Tables across runs built from a ``Breakdown``: the comparison (one row per run), deltas against a
baseline, and the JSON / CSV / Markdown renderings. Pure pandas; no printing."""

from __future__ import annotations

import json
import math

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.memory import MEMORY_CATEGORIES


def primary_resource(bd: Breakdown, run: str) -> str:
    """GPU runs are judged by GPU time (kernels + idle); CPU-only runs by host time."""
    r = bd.time[bd.time.run == run]
    return "gpu" if (r.resource == "gpu").any() else "cpu"


def memory_at(bd: Breakdown, phase: str = "peak") -> pd.DataFrame:
    """Rows: runs; columns: memory categories (bytes) at the given phase's peak."""
    m = bd.memory[bd.memory.phase == phase]
    table = m.pivot_table(index="run", columns="category", values="bytes", aggfunc="sum") \
        .reindex(columns=list(MEMORY_CATEGORIES))
    if not table.empty and not table["kv_cache"].fillna(0).any():
        table = table.drop(columns="kv_cache")  # training runs only: a row of zeros that says nothing
    return table


def time_per_step(bd: Breakdown, resource: str | None = None) -> pd.DataFrame:
    """Rows: runs; columns: time categories (seconds per profiled step), summed over phases."""
    frames = []
    for run in bd.time.run.unique():
        res = resource or primary_resource(bd, run)
        t = bd.time[(bd.time.run == run) & (bd.time.resource == res)]
        frames.append(t.groupby("category").seconds.sum().rename(run))
    if not frames:
        return pd.DataFrame(columns=list(TIME_CATEGORIES))
    out = pd.concat(frames, axis=1).T.reindex(columns=list(TIME_CATEGORIES))
    return out.loc[:, out.notna().any()]


def exposure_sentences(bd: Breakdown) -> list[str]:
    """GPU runs: each category that ran partly hidden under other work, with its exposed share
    ("communication 37.0 ms per step, of which 30.0 ms exposed")."""
    from profkit.report.units import human_seconds

    gpu = bd.time[bd.time.resource == "gpu"]
    out = []
    for run, g in gpu.groupby("run", sort=False):
        cats = g.groupby("category")[["seconds", "overlapped_seconds"]].sum()
        cats = cats[cats.overlapped_seconds > 1e-3 * (cats.seconds + cats.overlapped_seconds).sum()]
        pieces = [f"{cat} {human_seconds(r.seconds + r.overlapped_seconds)}, of which {human_seconds(r.seconds)} "
                  f"exposed" for cat, r in cats.sort_values("overlapped_seconds", ascending=False).iterrows()]
        if pieces:
            out.append(f"{run} (GPU, per step; the rest ran under higher-priority work): " + "; ".join(pieces))
    return out


def idle_sentences(bd: Breakdown) -> list[str]:
    """GPU runs: why the GPU was idle, per profiled step."""
    from profkit.report.units import human_seconds

    idle = bd.time_by_name[(bd.time_by_name.resource == "gpu") & (bd.time_by_name.category == "idle")]
    out = []
    for run, g in idle.groupby("run", sort=False):
        g = g[g.seconds > 0].sort_values("seconds", ascending=False)
        if len(g):
            reasons = ", ".join(f"{human_seconds(r.seconds)} {r['name'].removeprefix('idle: ')}" for _, r in g.iterrows())
            out.append(f"{run}: GPU idle {human_seconds(g.seconds.sum())} per step: {reasons}")
    return out


def comparison(bd: Breakdown) -> pd.DataFrame:
    """One row per run (failed and unsupported runs included, with their status)."""
    if bd.runs.empty:
        return pd.DataFrame()
    base = bd.runs.set_index("run")
    mem = memory_at(bd).add_prefix("memory.")
    tim = time_per_step(bd).add_prefix("time.")
    return base.join(mem, how="left").join(tim, how="left").reset_index()


def default_baseline(bd: Breakdown) -> str | None:
    ok = bd.runs[bd.runs.status.isin(["ok", "foreign"])] if not bd.runs.empty else bd.runs
    if ok.empty:
        return None
    return "full" if (ok.run == "full").any() else str(ok.run.iloc[0])


def deltas(bd: Breakdown, baseline: str) -> pd.DataFrame:
    """Long table: run, baseline, kind (memory/time), category, delta (bytes or seconds per step)."""
    from profkit.analyze.ranks import groups

    # Ranks of one job are compared with each other in the cross-rank view, not as runs against a baseline.
    same_job = next((set(runs) for runs in groups(bd).values() if baseline in runs), {baseline})
    rows = []
    mem, tim = memory_at(bd), time_per_step(bd)
    for kind, table in (("memory", mem), ("time", tim)):
        if baseline not in table.index:
            continue
        ref = table.loc[baseline].fillna(0)
        for run in table.index:
            if run in same_job:
                continue
            diff = table.loc[run].fillna(0) - ref
            rows += [{"run": run, "baseline": baseline, "kind": kind, "category": c, "delta": float(d)}
                     for c, d in diff.items() if d != 0]
    return pd.DataFrame(rows, columns=["run", "baseline", "kind", "category", "delta"])


def predicted_cells(bd: Breakdown) -> pd.DataFrame:
    """Rows: compared categories (with the phase they are compared at); columns: runs; cells:
    "predicted / measured (error)" in human units."""
    from profkit.report.units import human_bytes

    p = bd.predicted
    if p.empty:
        return pd.DataFrame()
    p = p.assign(label=p.category + " (" + p.phase + ")",
                 cell=[f"{human_bytes(a)} / {human_bytes(b)} ({format_error(e)})"
                       for a, b, e in zip(p.predicted_bytes, p.measured_bytes, p.error)])
    order = list(dict.fromkeys(p.label))
    return p.pivot(index="label", columns="run", values="cell").reindex(order)


def predicted_errors(bd: Breakdown) -> pd.DataFrame:
    """Rows: runs; columns: compared categories; values: predicted / measured - 1 (narrow enough for a terminal)."""
    p = bd.predicted
    if p.empty:
        return pd.DataFrame()
    present = set(p.category)
    order = [c for c in (*MEMORY_CATEGORIES, "peak") if c in present]  # the breakdown's order, the peak last
    return p.pivot(index="run", columns="category", values="error").reindex(
        columns=order, index=list(dict.fromkeys(p.run)))


def format_error(error) -> str:
    return "-" if error is None or (isinstance(error, float) and math.isnan(error)) else f"{error:+.1%}"


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def to_records(bd: Breakdown) -> list[dict]:
    """The JSON form: one object per run with ``memory`` (bytes) and ``time`` (seconds per step) maps."""
    mem, out = memory_at(bd), []
    for _, r in bd.runs.iterrows():
        run = r["run"]
        rec = {"run": run, "method": r.get("method"), "status": r.get("status"), "reason": _clean(r.get("reason")),
               "clean_step_time": _clean(r.get("clean_step_time_s")), "tokens_per_s": _clean(r.get("tokens_per_s")),
               "memory": None, "time": None, "notes": bd.notes.get(run, [])}
        if run in mem.index:
            rec["memory"] = {c: _clean(v) for c, v in mem.loc[run].items()}
            rec["memory"]["measured_peak"] = _clean(r.get("measured_peak_bytes"))
            rec["memory_by_phase"] = {
                phase: dict(zip(g.category, g.bytes.astype(int).tolist()))
                for phase, g in bd.memory[bd.memory.run == run].groupby("phase")}
        p = bd.predicted[bd.predicted.run == run]
        if len(p):
            rec["predicted_vs_measured"] = [
                {k: _clean(v) for k, v in r.items() if k not in ("run", "method")} for r in p.to_dict("records")]
        t = bd.time[bd.time.run == run]
        if len(t):
            res = primary_resource(bd, run)
            rec["time_resource"] = res
            rec["time"] = t[t.resource == res].groupby("category").seconds.sum().to_dict()
            rec["time"]["step_time"] = _clean(r.get("gpu_step_time_s") if res == "gpu" else r.get("profiled_step_time_s"))
            rec["time_by_phase"] = {phase: g.groupby("category").seconds.sum().to_dict()
                                    for phase, g in t[t.resource == res].groupby("phase")}
            if res == "gpu":
                rec["time_cpu"] = t[t.resource == "cpu"].groupby("category").seconds.sum().to_dict()
                rec["time_cpu"]["step_time"] = _clean(r.get("profiled_step_time_s"))
                hidden = t[t.resource == "gpu"].groupby("category").overlapped_seconds.sum()
                rec["time_overlapped"] = {c: v for c, v in hidden.items() if v > 0}
                idle = bd.time_by_name[(bd.time_by_name.run == run) & (bd.time_by_name.category == "idle")]
                rec["gpu_idle_by_reason"] = {n.removeprefix("idle: "): v for n, v in zip(idle.name, idle.seconds)}
        peaks = bd.trace_memory_peaks[bd.trace_memory_peaks.run == run] if len(bd.trace_memory_peaks) else []
        if len(peaks):
            rec["trace_memory"] = {
                "peaks": [{k: _clean(v) for k, v in p.items() if k not in ("run", "method")}
                          for p in peaks.to_dict("records")],
                "live_at_peak": [{k: _clean(v) for k, v in p.items() if k not in ("run", "method")}
                                 for p in bd.trace_memory[bd.trace_memory.run == run].to_dict("records")]}
        out.append(rec)
    return out


def to_json(bd: Breakdown) -> str:
    return json.dumps(to_records(bd), indent=2, default=_clean)


def to_csv(bd: Breakdown) -> str:
    return comparison(bd).to_csv(index=False)


def to_markdown(bd: Breakdown, baseline: str | None = None) -> str:
    from profkit.report.units import mib, ms

    parts = []
    runs = bd.runs.copy()
    if not runs.empty:
        cols = [c for c in ("run", "method", "status", "clean_step_time_s", "tokens_per_s", "profiled_step_time_s",
                            "measured_peak_bytes", "coverage_cpu", "reason") if c in runs]
        parts.append("## Runs\n\n" + runs[cols].to_markdown(index=False))
    mem = memory_at(bd)
    if not mem.empty:
        parts.append("## Memory at the peak (MiB)\n\n" + mem.map(mib).T.to_markdown())
    cells = predicted_cells(bd)
    if not cells.empty:
        parts.append("## Memory predicted / measured (error)\n\n" + cells.to_markdown())
    tim = time_per_step(bd)
    if not tim.empty:
        parts.append("## Time per profiled step (ms)\n\n" + tim.map(ms).T.to_markdown())
    baseline = baseline or default_baseline(bd)
    if baseline:
        lines = [f"- {s}" for s in delta_sentences(bd, baseline)]
        if lines:
            parts.append(f"## Against {baseline}\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def delta_sentences(bd: Breakdown, baseline: str, top: int = 3) -> list[str]:
    """Per run, its largest differences from ``baseline``: memory (exact, from the inventory and the timeline) and
    time, where a time difference counts only if it exceeds the spread measured in the same runs
    (``analyze.noise``); the rest is said to be within the noise, with the band."""
    from profkit.analyze import noise
    from profkit.report.units import human_seconds, signed_bytes, signed_ms

    d = deltas(bd, baseline)
    tim = time_per_step(bd)
    out = []
    for run, g in d.groupby("run", sort=False):
        pieces = []
        m = g[g.kind == "memory"]
        m = m.reindex(m.delta.abs().sort_values(ascending=False).index).head(top)
        pieces += [f"{c} {signed_bytes(v)}" for c, v in zip(m.category, m.delta)]
        t = g[g.kind == "time"]
        real, within = [], []
        for c, v in zip(t.category, t.delta):
            value_a, value_b = (tim.loc[r].get(c, 0.0) if r in tim.index else 0.0 for r in (baseline, run))
            diff = noise.category(bd, baseline, run, c, 0.0 if pd.isna(value_a) else float(value_a),
                                  0.0 if pd.isna(value_b) else float(value_b))
            (real if diff.measurable else within).append((c, v))
        real.sort(key=lambda x: -abs(x[1]))
        pieces += [f"{c} {signed_ms(v)}" for c, v in real[:top]]
        if within:
            pieces.append("no measurable time difference" + ("" if real else " in any category") +
                          (f" in {len(within)} other categories" if real else "") +
                          " (within the runs' step-to-step spread)")
        clean = noise.clean_step(bd, baseline, run)
        if pd.notna(clean.value):
            pieces.append(f"clean step {signed_ms(clean.value)} (steps {clean.ranges(human_seconds)})"
                          if clean.measurable else
                          f"clean step: no measurable difference ({signed_ms(clean.value)}; steps "
                          f"{clean.ranges(human_seconds)} overlap)")
        if pieces:
            out.append(f"{run} vs {baseline}: " + ", ".join(pieces))
    return out
