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


EXPLAIN_COLUMNS = ["run", "resource", "name", "seconds", "share_of_step", "share_of_category"]


def explain(bd: Breakdown, category: str) -> pd.DataFrame:
    """The op and kernel names that make up a time category, per run and resource, largest first: each name's
    time per step, its share of the profiled step on that resource and of the category. ``--explain other``
    says, trace by trace, what no rule or context could name."""
    names = bd.time_by_name
    if names.empty:
        return pd.DataFrame(columns=EXPLAIN_COLUMNS)
    step = names.groupby(["run", "resource"]).seconds.sum()
    mine = names[names.category == category]
    in_category = mine.groupby(["run", "resource"]).seconds.transform("sum")
    keys = pd.MultiIndex.from_frame(mine[["run", "resource"]])
    out = mine.assign(share_of_step=mine.seconds.to_numpy() / step.reindex(keys).to_numpy(),
                      share_of_category=mine.seconds / in_category.where(in_category > 0))
    order = {run: k for k, run in enumerate(bd.runs.run)}
    out = out.sort_values(["run", "resource", "seconds"], key=lambda c: c.map(order) if c.name == "run" else c,
                          ascending=[True, True, False])
    return out[EXPLAIN_COLUMNS].reset_index(drop=True)
