"""Views of a Breakdown that every renderer shares: memory by category at a phase's peak and time by category
per profiled step, one row per run. Pure pandas over what was loaded; no file is read again."""

from __future__ import annotations

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.core.categories import MEMORY_CATEGORIES


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


def time_shares(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.Series]:
    """Each category's share of the profiled step, and the step the shares are of: the sum of the categories
    (on the GPU, kernels and idle fill its window; on the host, the self times fill the step)."""
    total = frame.sum(axis=1)
    return frame.div(total.where(total > 0), axis=0), total
