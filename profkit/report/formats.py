"""The breakdown rendered for scripts and documents: JSON, CSV and Markdown, each from the same Breakdown and the
same tables and findings the terminal shows."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import pandas as pd

from profkit.analyze import Breakdown, ranks
from profkit.analyze.disturbed import CONTENDED_WAIT_SHARE, WIDE_SPREAD
from profkit.analyze.glance import at_a_glance
from profkit.analyze.measures import measure_pairs
from profkit.analyze.views import explain, memory_at, primary_resource, time_per_step, time_shares
from profkit.core.units import mib, ms
from profkit.report import findings, tables
from profkit.report.answers import NOTHING, answers
from profkit.report.tables import comparison, predicted_cells


def _clean(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def _rows(frame) -> list[dict]:
    return [{k: _clean(v) for k, v in row.items() if k != "group"} for row in frame.to_dict("records")]


def _rank_groups(bd: Breakdown) -> dict[str, dict]:
    """Run -> its job's cross-rank figures: its own row, the group's verdict and the table across ranks."""
    out: dict[str, dict] = {run: {"group": None, "not_compared": why} for run, why in ranks.unmatched(bd).items()}
    groups = ranks.groups(bd)
    if not groups:
        return out
    per_rank, verdicts, across = ranks.rank_summary(bd), ranks.verdict(bd), ranks.across_ranks(bd)
    for group, runs in groups.items():
        shared = {"group": group, "verdict": _rows(verdicts[verdicts.group == group])[0],
                  "across_ranks": _rows(across[across.group == group])}
        for row in _rows(per_rank[per_rank.group == group]):
            out[row["run"]] = {**shared, "this_rank": row}
    return out


def to_records(bd: Breakdown, explained: str | None = None) -> list[dict]:
    """The JSON form: one object per run with ``memory`` (bytes) and ``time`` (seconds per step) maps, and in
    ``figures`` every per-run figure the analysis has (the terminal's tables are made from these). With
    ``explained``, each run also lists the names in that time category (``explain``)."""
    mem, out, rank_groups = memory_at(bd), [], _rank_groups(bd)
    names = explain(bd, explained) if explained else None
    shares = {resource: time_shares(time_per_step(bd, resource)) for resource in (None, "cpu")}
    for _, r in bd.runs.iterrows():
        run = r["run"]
        rec = {"run": run, "method": r.get("method"), "status": r.get("status"), "reason": _clean(r.get("reason")),
               "clean_step_time": _clean(r.get("clean_step_time_s")), "tokens_per_s": _clean(r.get("tokens_per_s")),
               "memory": None, "time": None, "notes": bd.notes.get(run, []),
               "figures": {k: _clean(v) for k, v in r.items() if k != "settings" and _clean(v) is not None}}
        if run in rank_groups:
            rec["ranks"] = rank_groups[run]
        if run in mem.index:
            rec["memory"] = {c: _clean(v) for c, v in mem.loc[run].items()}
            rec["memory"]["measured_peak"] = _clean(r.get("measured_peak_bytes"))
            rec["memory_by_phase"] = {
                phase: dict(zip(g.category, g.bytes.astype(int).tolist()))
                for phase, g in bd.memory[bd.memory.run == run].groupby("phase")}
        sources = bd.memory_sources[bd.memory_sources.run == run] if len(bd.memory_sources) else []
        if len(sources):
            # Both attributions at the peak: the run's storage lifetimes beside the profiler's export.
            rec["memory_sources"] = [{k: _clean(v) for k, v in r.items() if k not in ("run", "method")}
                                     for r in sources.to_dict("records")]
        p = bd.predicted[bd.predicted.run == run]
        if len(p):
            rec["predicted_vs_measured"] = [
                {k: _clean(v) for k, v in r.items() if k not in ("run", "method")} for r in p.to_dict("records")]
        pt = bd.predicted_time[bd.predicted_time.run == run] if len(bd.predicted_time) else []
        if len(pt):
            rec["predicted_time_vs_measured"] = _rows(pt.drop(columns=["run", "method"]))
        t = bd.time[bd.time.run == run]
        if len(t):
            res = primary_resource(bd, run)
            rec["time_resource"] = res
            rec["time"] = t[t.resource == res].groupby("category").seconds.sum().to_dict()
            rec["time"]["step_time"] = _clean(r.get("gpu_step_time_s") if res == "gpu" else r.get("profiled_step_time_s"))
            rec.update(_shares("time", *shares[None], run))
            rec["time_by_phase"] = {phase: g.groupby("category").seconds.sum().to_dict()
                                    for phase, g in t[t.resource == res].groupby("phase")}
            if res == "gpu":
                rec["time_cpu"] = t[t.resource == "cpu"].groupby("category").seconds.sum().to_dict()
                rec["time_cpu"]["step_time"] = _clean(r.get("profiled_step_time_s"))
                rec.update(_shares("time_cpu", *shares["cpu"], run))
                kernels = t[t.resource == "gpu"].groupby("category")[["seconds", "overlapped_seconds"]].sum()
                rec["time_overlapped"] = {c: v for c, v in kernels.overlapped_seconds.items() if v > 0}
                # Exposed and hidden together: each category's whole kernel time.
                rec["time_including_overlapped"] = {c: float(v.seconds + v.overlapped_seconds)
                                                    for c, v in kernels.iterrows() if v.overlapped_seconds > 0}
                idle = bd.time_by_name[(bd.time_by_name.run == run) & (bd.time_by_name.category == "idle")]
                rec["gpu_idle_by_reason"] = {n.removeprefix("idle: "): v for n, v in zip(idle.name, idle.seconds)}
        e = bd.efficiency[bd.efficiency.run == run] if len(bd.efficiency) else []
        if len(e):
            # Per step: each category's work (FLOPs, bytes) and time, its rates and, on a known GPU, its roof; then
            # the same in the terminal's units, and the run's summary row.
            rec["efficiency"] = _rows(e.drop(columns=["run", "method"]))
            rec["work_table"] = _rows(tables.efficiency(bd, run))
            summary = tables.utilisation(bd)
            rec["work_summary"] = _rows(summary[summary.run == run].drop(columns="run"))[0]
        peaks = bd.trace_memory_peaks[bd.trace_memory_peaks.run == run] if len(bd.trace_memory_peaks) else []
        if len(peaks):
            rec["trace_memory"] = {
                "peaks": [{k: _clean(v) for k, v in p.items() if k not in ("run", "method")}
                          for p in peaks.to_dict("records")],
                "live_at_peak": [{k: _clean(v) for k, v in p.items() if k not in ("run", "method")}
                                 for p in bd.trace_memory[bd.trace_memory.run == run].to_dict("records")]}
        if names is not None:
            mine = names[names.run == run].drop(columns="run")
            rec["explain"] = {"category": explained, "names": [{k: _clean(v) for k, v in r.items()}
                                                              for r in mine.to_dict("records")]}
        out.append(rec)
    return out


def _shares(key: str, share, total, run: str) -> dict:
    """The terminal's shares of the profiled step, and the sum of the categories they are shares of."""
    if run not in share.index:
        return {}
    return {f"{key}_share": {c: float(v) for c, v in share.loc[run].items() if pd.notna(v)},
            f"{key}_categories_total_s": float(total[run])}


def to_document(bd: Breakdown, explained: str | None = None, budget_bytes: int | None = None,
                baseline: str | None = None) -> dict:
    """Everything the breakdown says, as one JSON-ready object: the at-a-glance table, the answers, the measure
    pairs they quote, the findings ranked by size, the flagged runs, the runs against ``baseline`` (the terminal's
    comparison sentences, with the time differences and ranges behind them), the inputs that could not be read, and
    each run's record (``to_records``)."""
    baseline = baseline or tables.default_baseline(bd)
    return {
        "budget_bytes": budget_bytes,
        "thresholds": {"nothing_fraction": NOTHING, "wide_spread_ratio": WIDE_SPREAD,
                       "contended_wait_share": CONTENDED_WAIT_SHARE},
        "at_a_glance": _rows(at_a_glance(bd, budget_bytes)),
        "answers": [{"question": a.question, "lead": a.lead, "points": list(a.points)}
                    for a in answers(bd, budget_bytes)],
        "measures": _rows(measure_pairs(bd)),
        "findings": [asdict(f) for f in findings.ranked(bd)],
        "flagged": findings.flags(bd),
        "against_baseline": {"baseline": baseline,
                             "sentences": findings.delta_sentences(bd, baseline) if baseline else [],
                             "time_differences": _rows(findings.time_differences(bd, baseline)) if baseline else []},
        # What could not be read, and why (the terminal's "error:" and "warning:" lines).
        "problems": [{"path": str(p.path), "message": p.message, "fatal": p.fatal} for p in bd.problems],
        "runs": to_records(bd, explained),
    }


def to_json(bd: Breakdown, explained: str | None = None, budget_bytes: int | None = None,
            baseline: str | None = None) -> str:
    return json.dumps(to_document(bd, explained, budget_bytes, baseline), indent=2, default=_clean)


def to_csv(bd: Breakdown) -> str:
    return comparison(bd).to_csv(index=False)


def to_markdown(bd: Breakdown, baseline: str | None = None, explained: str | None = None,
                budget_bytes: int | None = None) -> str:
    parts = []
    glance = at_a_glance(bd, budget_bytes)
    if not glance.empty:
        parts.append("## At a glance\n\n" + tables.glance_cells(glance, "<br>").to_markdown(index=False) + "\n\n"
                     + "\n".join(tables.glance_notes(glance, budget_bytes)))
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
    summary = tables.utilisation(bd)
    if not summary.empty:
        parts.append("## Work per profiled step\n\n" + summary.to_markdown(index=False, floatfmt=".3g"))
        for run in summary.run:
            parts.append(f"### {run}: how each category used the device\n\n"
                         + tables.efficiency(bd, run).to_markdown(index=False, floatfmt=".3g"))
    baseline = baseline or tables.default_baseline(bd)
    if baseline:
        lines = [f"- {s}" for s in findings.delta_sentences(bd, baseline)]
        if lines:
            parts.append(f"## Against {baseline}\n\n" + "\n".join(lines))
    if explained:
        names = explain(bd, explained)
        if not names.empty:
            names = names.assign(time_per_step_ms=names.seconds.map(ms), share_of_step=names.share_of_step.map(
                lambda v: f"{v:.1%}")).drop(columns=["seconds", "share_of_category"])
            parts.append(f"## Names in {explained}\n\n" + names.to_markdown(index=False))
    return "\n\n".join(parts) + "\n"
