"""Tables across runs built from a ``Breakdown``: the comparison (one row per run), deltas against a
baseline, and the JSON / CSV / Markdown renderings. Pure pandas; no printing."""

from __future__ import annotations

import math

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.ranks import groups
from profkit.analyze.views import memory_at, time_per_step
from profkit.core.categories import MEMORY_CATEGORIES
from profkit.core.units import human_bytes


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


def efficiency(bd: Breakdown, run: str) -> pd.DataFrame:
    """One run's work per category and kind, in display units (the terminal's, and the JSON's ``work_table``):
    seconds per step, TFLOP/s, GB/s, FLOP per byte, the bounding roof and the share of it reached."""
    e = bd.efficiency[bd.efficiency.run == run] if len(bd.efficiency) else bd.efficiency
    if e.empty:
        return pd.DataFrame()
    return pd.DataFrame({
        "category": e.category, "work": e.work, "seconds": e.seconds, "tflop_per_s": e.flop_per_s / 1e12,
        "gbyte_per_s": e.bytes_per_s / 1e9, "flop_per_byte": e.flop_per_byte, "bound": e.bound,
        "roof_fraction": e.roof_fraction,
    }).reset_index(drop=True)


def utilisation(bd: Breakdown) -> pd.DataFrame:
    """One row per run with counted work: the device, model FLOPs per step, MFU and HFU, and the GEMMs' rate."""
    if bd.efficiency.empty:
        return pd.DataFrame()
    rows = []
    for run, e in bd.efficiency.groupby("run", sort=False):
        r = bd.runs.set_index("run").loc[run]
        gemm = e[e.work == "gemm"]
        counted = gemm.counted_seconds.sum()
        rows.append({"run": run, "device": r.get("gpu") or r.get("device_name") or "-",
                     "model_gflop_per_step": r.get("model_flop_per_step", math.nan) / 1e9,
                     "gemm_tflop_per_s": gemm.flop.sum() / counted / 1e12 if counted else math.nan,
                     "mfu": r.get("mfu"), "hfu": r.get("hfu")})
    return pd.DataFrame(rows)
