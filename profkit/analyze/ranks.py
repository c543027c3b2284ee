"""Several ranks of one job side by side: traces that carry ``distributedInfo`` (rank, world size), recorded
by anyone, analysed one by one by the facade and compared here. Pure functions of a Breakdown.

A group is the ranks found in one directory with the same world size. For each time category: the
minimum, median and maximum over ranks and the rank with the most; per rank: its step time, how late its
first profiled step started against the earliest rank (step-start skew, on the traces' own clocks), and its
communication, exposed and overlapped (the GPU's exposed-time semantics).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from profkit.analyze import Breakdown

ACROSS_COLUMNS = ["group", "category", "min_s", "median_s", "max_s", "slowest_rank", "ranks"]
RANK_COLUMNS = ["group", "run", "rank", "step_s", "start_skew_ms", "communication_s", "communication_overlapped_s"]


def groups(bd: Breakdown) -> dict[str, list[str]]:
    """Group name -> the runs of its ranks, in rank order. Only groups of two ranks or more."""
    r = bd.runs[bd.runs.world_size.notna() & (bd.runs.world_size > 1) & bd.runs["rank"].notna()]
    out: dict[str, list[str]] = {}
    for (parent, world), g in r.groupby([r.path.map(lambda p: str(Path(p).parent)), "world_size"], sort=False):
        if len(g) > 1:
            name = f"{Path(parent).name or parent} ({len(g)} of {int(world)} ranks)"
            out[name] = list(g.sort_values("rank").run)
    return out


def _per_rank_time(bd: Breakdown, runs: list[str]) -> pd.DataFrame:
    from profkit.report.tables import time_per_step

    return time_per_step(bd).reindex(runs).fillna(0.0)


def across_ranks(bd: Breakdown) -> pd.DataFrame:
    rows = []
    rank_of = bd.runs.set_index("run")["rank"]
    for group, runs in groups(bd).items():
        t = _per_rank_time(bd, runs)
        for category in t.columns:
            col = t[category]
            rows.append({"group": group, "category": category, "min_s": float(col.min()),
                         "median_s": float(col.median()), "max_s": float(col.max()),
                         "slowest_rank": int(rank_of[col.idxmax()]), "ranks": len(runs)})
    return pd.DataFrame(rows, columns=ACROSS_COLUMNS)


def rank_summary(bd: Breakdown) -> pd.DataFrame:
    rows = []
    runs_by_name = bd.runs.set_index("run")
    for group, runs in groups(bd).items():
        starts = runs_by_name.loc[runs, "first_step_start_us"].astype(float)
        for run in runs:
            r = runs_by_name.loc[run]
            gpu = bd.time[(bd.time.run == run) & (bd.time.resource == "gpu") & (bd.time.category == "communication")]
            step = r.gpu_step_time_s if pd.notna(r.gpu_step_time_s) else r.profiled_step_time_s
            rows.append({"group": group, "run": run, "rank": int(r["rank"]), "step_s": float(step),
                         "start_skew_ms": float(starts[run] - starts.min()) / 1e3,
                         "communication_s": float(gpu.seconds.sum()),
                         "communication_overlapped_s": float(gpu.overlapped_seconds.sum())})
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def sentences(bd: Breakdown) -> list[str]:
    """Per group: the slowest rank and the category that makes it slow, and the step-start skew."""
    from profkit.report.units import human_seconds

    out = []
    summary = rank_summary(bd)
    for group, runs in groups(bd).items():
        s = summary[summary.group == group].set_index("run")
        slow = s.step_s.idxmax()
        t = _per_rank_time(bd, runs)
        excess = (t.loc[slow] - t.median()).sort_values(ascending=False)
        out.append(f"{group}: the slowest rank is {int(s.loc[slow, 'rank'])} ({human_seconds(s.loc[slow, 'step_s'])} "
                   f"per step against a median of {human_seconds(s.step_s.median())}), most of it in {excess.index[0]} "
                   f"(+{human_seconds(excess.iloc[0])} over the median rank's); the first profiled step started "
                   f"{s.start_skew_ms.max():.2f} ms apart between the earliest and the latest rank.")
        waits = s.communication_s.idxmax()
        if s.loc[waits, "start_skew_ms"] <= s.start_skew_ms.median() < s.start_skew_ms.max():
            out.append(f"{group}: rank {int(s.loc[waits, 'rank'])} spends the most in communication "
                       f"({human_seconds(s.loc[waits, 'communication_s'])} per step) and started among the earliest: "
                       "collectives wait for the ranks that arrive last.")
    return out
