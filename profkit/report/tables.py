"""Tables across runs built from a ``Breakdown``: the comparison (one row per run), deltas against a
baseline, and the JSON / CSV / Markdown renderings. Pure pandas; no printing."""

from __future__ import annotations

import math

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.ranks import groups
from profkit.analyze.views import memory_at, time_per_step
from profkit.core.categories import MEMORY_CATEGORIES
from profkit.core.units import human_bytes, human_seconds


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


def _share(name, share) -> str:
    return f"{name} {share:.0%}" if isinstance(name, str) else ""


LINE_BREAKS = ("\n", "<br>")  # a terminal cell's, a Markdown table cell's


def glance_cells(glance: pd.DataFrame, newline: str = "\n", narrow: bool = False) -> pd.DataFrame:
    """The at-a-glance table in display units, one row per run; ``newline`` joins a cell's lines (the
    terminal's line break, or Markdown's ``<br>``); ``narrow`` puts tokens/s under the clean step (80 columns).
    A disturbed run's name is marked with "!"."""
    show_reserved = glance.reserved_bytes.notna().any()
    rows = []
    for _, g in glance.iterrows():
        step = human_seconds(g.clean_step_s)
        if pd.notna(g.clean_step_spread):  # under the step where a cell has lines, else beside it
            step += f"{newline if newline in LINE_BREAKS else ' '}±{g.clean_step_spread:.0%}"
        row = {"run": g.run + (" !" if isinstance(g.disturbed, str) else ""), "peak": human_bytes(g.peak_bytes)}
        if show_reserved:
            row["reserved"] = human_bytes(g.reserved_bytes)
        rate = f"{g.tokens_per_s:,.0f}" if pd.notna(g.tokens_per_s) else "-"
        row.update({
            "clean step": step + (f"{newline}{rate} tok/s" if narrow and rate != "-" else ""),
            **({} if narrow else {"tokens/s": rate}),
            "memory at the peak": newline.join(filter(None, (_share(g.memory_first, g.memory_first_share),
                                                             _share(g.memory_second, g.memory_second_share)))) or "-",
            "time (profiled step)": newline.join(filter(None, (_share(g.time_first, g.time_first_share),
                                                               _share(g.time_second, g.time_second_share)))) or "-",
        })
        if g.within_budget is not None and not pd.isna(g.within_budget):
            row["fits"] = "yes" if g.within_budget else "no"
        if g.status not in ("ok", "foreign"):
            row["clean step"] = str(g.status)
        rows.append(row)
    return pd.DataFrame(rows)


def glance_notes(glance: pd.DataFrame, budget_bytes: int | None, reasons: bool = True) -> list[str]:
    """What the table's marks and order mean; with ``reasons``, why each marked run is (else the reader is
    pointed to the flagged runs)."""
    order = (f"within {human_bytes(budget_bytes)} first, fastest first; then the rest by peak" if budget_bytes
             is not None else "by peak memory, smallest first")
    notes = [f"Sorted {order}. Shares: of the peak (memory), of the profiled step (time); ± is half the "
             "clean steps' range over their median."]
    marked = [r for _, r in glance.iterrows() if isinstance(r.disturbed, str)]
    if marked and not reasons:
        notes.append("! marks a run whose clean steps look disturbed: its time is not compared (see the flagged "
                     "runs).")
    elif marked:
        notes += [f"! {r.run}: {r.disturbed}; its time is not compared." for r in marked]
    return notes


def family(bd: Breakdown, run: str) -> str:
    """The table a run's evidence goes in: training by its base (full, LoRA, QLoRA), generation apart, traces
    recorded by others apart."""
    rec = bd.records.get(run)
    if rec is None:
        return "traces recorded by others"
    if rec.kind == "infer":
        return "generation"
    s = rec.settings
    if not s:
        return "other runs"
    base = "full fine-tuning" if s.get("adapter") in (None, "none") else "LoRA"
    return ("QLoRA" if s.get("quantization") and base == "LoRA" else
            f"{base}, 4-bit" if s.get("quantization") else base)


def fit_markdown(frame: pd.DataFrame, width: int = 100) -> list[str]:
    """``frame`` as Markdown tables no wider than ``width`` characters: its columns split over as many tables as
    it takes, each repeating the index. A single column wider than ``width`` still gets its own table."""
    tables, chunk = [], []
    for col in frame.columns:
        trial = frame[chunk + [col]].to_markdown()
        if chunk and max(map(len, trial.splitlines())) > width:
            tables.append(frame[chunk].to_markdown())
            chunk = [col]
        else:
            chunk.append(col)
    if chunk:
        tables.append(frame[chunk].to_markdown())
    return tables
