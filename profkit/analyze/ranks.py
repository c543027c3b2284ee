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
from profkit.analyze.views import time_per_step

ACROSS_COLUMNS = ["group", "category", "min_s", "median_s", "max_s", "rank_with_most", "ranks"]
RANK_COLUMNS = ["group", "run", "rank", "step_s", "compute_s", "communication_s", "idle_s", "start_skew_ms",
                "communication_overlapped_s", "step_spread_s"]
VERDICT_COLUMNS = ["group", "verdict", "rank", "waiting_s", "peers_waiting_s", "compute_s", "peers_compute_s",
                   "idle_s", "peers_idle_s", "noise_s", "ranks"]
# Below this share of the step, a difference between ranks is not called a straggler even if the steps are steady.
NOISE_SHARE = 0.02
MEMORY_COLUMNS = ["group", "run", "rank", "parameters_bytes", "whole_parameters_bytes", "parameters_fraction",
                  "gradients_bytes", "optimizer_state_bytes", "measured_peak_bytes"]
PARAMETER_OWNERS = ("parameters_trainable", "parameters_frozen", "parameters_quantized")
ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "uint8": 1, "bool": 1}


def _rank_sets(bd: Breakdown):
    """(directory, world size, its runs) for every directory holding two or more ranks of the same world size."""
    r = bd.runs[bd.runs.world_size.notna() & (bd.runs.world_size > 1) & bd.runs["rank"].notna()]
    for (parent, world), g in r.groupby([r.path.map(lambda p: str(Path(p).parent)), "world_size"], sort=False):
        if len(g) > 1:
            yield parent, int(world), g


def groups(bd: Breakdown) -> dict[str, list[str]]:
    """Group name -> the runs of its ranks, in rank order. Only groups of two ranks or more, each rank once: a
    directory where a rank repeats holds several jobs' traces (``unmatched``)."""
    out: dict[str, list[str]] = {}
    for parent, world, g in _rank_sets(bd):
        if not g["rank"].duplicated().any():
            out[f"{Path(parent).name or parent} ({len(g)} of {world} ranks)"] = list(g.sort_values("rank").run)
    return out


def unmatched(bd: Breakdown) -> dict[str, str]:
    """Run -> why it is not compared with other ranks: its directory holds another trace of the same rank and
    world size, so the traces are several jobs' and nothing in them says which belong together."""
    out: dict[str, str] = {}
    for parent, world, g in _rank_sets(bd):
        repeated = sorted({int(r) for r in g["rank"][g["rank"].duplicated()]})
        if repeated:
            why = (f"{Path(parent).name or parent}: {len(g)} traces of world size {world} repeat rank "
                   f"{', '.join(map(str, repeated))}, so they are several jobs' and which ranks belong together "
                   "cannot be told; ranks are compared when each job's traces are in a directory of their own")
            out.update(dict.fromkeys(g.run, why))
    return out


def per_rank_time(bd: Breakdown, runs: list[str]) -> pd.DataFrame:
    return time_per_step(bd).reindex(runs).fillna(0.0)


def across_ranks(bd: Breakdown) -> pd.DataFrame:
    rows = []
    rank_of = bd.runs.set_index("run")["rank"]
    for group, runs in groups(bd).items():
        t = per_rank_time(bd, runs)
        for category in t.columns:
            col = t[category]
            rows.append({"group": group, "category": category, "min_s": float(col.min()),
                         "median_s": float(col.median()), "max_s": float(col.max()),
                         "rank_with_most": int(rank_of[col.idxmax()]), "ranks": len(runs)})
    return pd.DataFrame(rows, columns=ACROSS_COLUMNS)


def rank_summary(bd: Breakdown) -> pd.DataFrame:
    """Per rank, per step: the step, and on the resource that times it (the GPU where there is one) the time spent
    computing, waiting in collectives (communication not hidden under compute) and idle."""
    rows = []
    runs_by_name = bd.runs.set_index("run")
    for group, runs in groups(bd).items():
        starts = runs_by_name.loc[runs, "first_step_start_us"].astype(float)
        for run in runs:
            r = runs_by_name.loc[run]
            gpu = pd.notna(r.gpu_step_time_s)
            t = bd.time[(bd.time.run == run) & (bd.time.resource == ("gpu" if gpu else "cpu"))]
            idle = float(t[t.category == "idle"].seconds.sum())
            step = float(r.gpu_step_time_s if gpu else r.profiled_step_time_s)
            # Waiting: communication not hidden under compute (on CPU: while the profiled thread ran no operator).
            waiting = float(r.communication_exposed_s)
            spread = (r.profiled_step_max_s - r.profiled_step_min_s) if pd.notna(r.profiled_step_max_s) else 0.0
            rows.append({"group": group, "run": run, "rank": int(r["rank"]), "step_s": step,
                         "compute_s": step - waiting - idle, "communication_s": waiting,
                         "idle_s": idle, "start_skew_ms": float(starts[run] - starts.min()) / 1e3,
                         "communication_overlapped_s": float(r.communication_overlapped_s),
                         "step_spread_s": float(spread)})
    return pd.DataFrame(rows, columns=RANK_COLUMNS)


def verdict(bd: Breakdown) -> pd.DataFrame:
    """Per group: the rank the others wait for, or lockstep. In synchronous collectives every rank waits for the
    last to arrive, so the rank holding the job back is the one that waits *least* in its collectives: the others'
    waiting is the time they spend for it. What it does instead (computes more, or leaves its device idle while
    its host works) is set beside its peers'. A rank that waits longest is a victim, never the culprit. The
    margin must exceed the noise: the largest spread between a rank's own profiled steps, and at least
    ``NOISE_SHARE`` of the step; otherwise the ranks are in lockstep."""
    rows = []
    summary = rank_summary(bd)
    for group, s in summary.groupby("group", sort=False):
        s = s.set_index("rank")
        noise = max(NOISE_SHARE * float(s.step_s.median()), float(s.step_spread_s.max()))
        candidate = s.communication_s.idxmin()
        peers = s.drop(candidate)
        row = {"group": group, "rank": int(candidate), "noise_s": noise, "ranks": len(s)}
        for column, name in (("communication_s", "waiting_s"), ("compute_s", "compute_s"), ("idle_s", "idle_s")):
            row[name], row[f"peers_{name}"] = float(s.loc[candidate, column]), float(peers[column].median())
        row["verdict"] = "straggler" if row["peers_waiting_s"] - row["waiting_s"] > noise else "lockstep"
        rows.append(row)
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


def rank_memory(bd: Breakdown) -> pd.DataFrame:
    """Memory per rank: what each rank holds of the parameters, gradients and optimizer state (from its
    inventory, for runs profkit recorded), the parameters as a fraction of the whole model's, and the measured
    peak (every run). Under ZeRO-3 the fraction is 1/N for partitioned parameters; parameters below DeepSpeed's
    persistence threshold stay whole on every rank, so the fraction is above 1/N on small layers."""
    rows = []
    runs_by_name = bd.runs.set_index("run")
    for group, runs in groups(bd).items():
        for run in runs:
            r = runs_by_name.loc[run]
            row = {"group": group, "run": run, "rank": int(r["rank"]),
                   "measured_peak_bytes": r.measured_peak_bytes if pd.notna(r.measured_peak_bytes) else None}
            record = bd.records.get(run)
            if record is not None and record.inventory:
                inv = record.inventory["rows"]
                held = sum(x["bytes"] for x in inv if x["owner"] in PARAMETER_OWNERS)
                # Logical elements times element size; 4-bit weights count their packed half byte per element.
                whole = sum(x["numel"] * (0.5 if x["detail"] == "nf4 weight" else ITEMSIZE.get(x["dtype"], 0))
                            for x in inv if x["owner"] in PARAMETER_OWNERS)
                row.update(parameters_bytes=held, whole_parameters_bytes=int(whole),
                           parameters_fraction=held / whole if whole else None,
                           gradients_bytes=sum(x["bytes"] for x in inv if x["owner"] == "gradients"),
                           optimizer_state_bytes=sum(x["bytes"] for x in inv if x["owner"] == "optimizer_state"))
            rows.append(row)
    return pd.DataFrame(rows, columns=MEMORY_COLUMNS)
