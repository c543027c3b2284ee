"""At a glance: one row per run with what a reader compares first. Peak memory (and, on CUDA, reserved), the
clean step and tokens/s with their spread, the two largest memory owners and time categories as shares, and
whether the run's clean steps look disturbed. Pure pandas over a Breakdown.

The order answers "what fits, fastest first": with a budget, the runs within it by clean step, then the others
by peak; without one, by peak memory. Runs that were not measured come last, with their status.
"""

from __future__ import annotations

import math

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.views import memory_at, time_per_step, time_shares

GLANCE_COLUMNS = ["run", "kind", "status", "peak_bytes", "reserved_bytes", "clean_step_s", "clean_step_min_s",
                  "clean_step_max_s", "clean_step_spread", "tokens_per_s", "memory_first", "memory_first_share", "memory_second",
                  "memory_second_share", "time_first", "time_first_share", "time_second", "time_second_share",
                  "within_budget", "disturbed"]
MEASURED = ("ok", "foreign")
SMALLEST_SHARE = 0.005  # an owner or category below half a percent would read "0%": not named


def _top_two(row: pd.Series | None) -> list[tuple[str | None, float]]:
    if row is None:
        return [(None, math.nan)] * 2
    row = row.dropna()
    row = row[row >= SMALLEST_SHARE].sort_values(ascending=False)
    top = [(str(c), float(v)) for c, v in row.head(2).items()]
    return top + [(None, math.nan)] * (2 - len(top))


def _trace_owners(bd: Breakdown, run: str, allocated_peak: float) -> pd.Series | None:
    """A trace recorded by others: what was live at its device's allocated peak, by the operator category that
    allocated it ("allocated before the trace" where its [memory] events began too late to say)."""
    live = bd.trace_memory[bd.trace_memory.run == run] if len(bd.trace_memory) else bd.trace_memory
    if live.empty:
        return None
    peaks = bd.trace_memory_peaks[bd.trace_memory_peaks.run == run]
    device = peaks.loc[peaks.peak_allocated_bytes.idxmax(), "device"]
    mine = live[live.device == device]
    return mine.groupby("category")["bytes"].sum() / allocated_peak


def _spread(r: pd.Series) -> float:
    """Half the clean steps' range over their median: "12.3 ms ±5%"."""
    lo, hi, mid = r.get("clean_step_min_s"), r.get("clean_step_max_s"), r.get("clean_step_time_s")
    return (hi - lo) / (2 * mid) if pd.notna(lo) and pd.notna(hi) and pd.notna(mid) and mid > 0 else math.nan


def at_a_glance(bd: Breakdown, budget_bytes: int | None = None) -> pd.DataFrame:
    """One row per run (``GLANCE_COLUMNS``). Shares: of the measured peak (memory; the owners at that instant),
    of the profiled step (time; kernels and idle on a GPU, self time on a CPU)."""
    if bd.runs.empty:
        return pd.DataFrame(columns=GLANCE_COLUMNS)
    memory = memory_at(bd)
    shares, _ = time_shares(time_per_step(bd))
    rows = []
    for _, r in bd.runs.iterrows():
        run, measured_peak = r["run"], r.get("measured_peak_bytes")
        peak = r.get("allocated_peak_bytes") if pd.notna(r.get("allocated_peak_bytes")) else measured_peak
        owners = None
        if run in memory.index and pd.notna(measured_peak) and measured_peak > 0:
            owners = memory.loc[run] / measured_peak
        elif pd.notna(peak) and peak > 0:
            owners = _trace_owners(bd, run, peak)
        (m1, s1), (m2, s2) = _top_two(owners)
        (t1, u1), (t2, u2) = _top_two(shares.loc[run] if run in shares.index else None)
        fits = None if budget_bytes is None or pd.isna(measured_peak) else bool(measured_peak <= budget_bytes)
        rows.append({
            "run": run, "kind": r.get("kind") or ("trace" if r.get("status") == "foreign" else None),
            "status": r.get("status"), "peak_bytes": peak, "reserved_bytes": r.get("reserved_peak_bytes"),
            "clean_step_s": r.get("clean_step_time_s"), "clean_step_min_s": r.get("clean_step_min_s"),
            "clean_step_max_s": r.get("clean_step_max_s"), "clean_step_spread": _spread(r),
            "tokens_per_s": r.get("tokens_per_s"),
            "memory_first": m1, "memory_first_share": s1, "memory_second": m2, "memory_second_share": s2,
            "time_first": t1, "time_first_share": u1, "time_second": t2, "time_second_share": u2,
            "within_budget": fits, "disturbed": r.get("disturbed") if isinstance(r.get("disturbed"), str) else None,
        })
    table = pd.DataFrame(rows, columns=GLANCE_COLUMNS)
    return _ordered(table, budget_bytes)


def _ordered(table: pd.DataFrame, budget_bytes: int | None) -> pd.DataFrame:
    measured = table.status.isin(MEASURED)
    if budget_bytes is None:
        key = [(0 if m else 1, p if pd.notna(p) else math.inf, 0.0) for m, p in zip(measured, table.peak_bytes)]
    else:
        # Within the budget, fastest first (no clean step: after those with one); then the rest, smallest first.
        key = [(0 if m and fits else 1 if m else 2, 0.0 if fits else (p if pd.notna(p) else math.inf),
                (s if pd.notna(s) else math.inf) if fits else 0.0)
               for m, fits, p, s in zip(measured, table.within_budget, table.peak_bytes, table.clean_step_s)]
    order = sorted(range(len(table)), key=lambda i: key[i])
    return table.iloc[order].reset_index(drop=True)
