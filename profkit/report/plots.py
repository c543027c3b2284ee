"""PNG plots of a Breakdown (matplotlib, no display needed). Each function writes one file and returns
its path; none computes anything the tables do not already hold."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from profkit.analyze import Breakdown, ranks, views  # noqa: E402
from profkit.analyze.memory import TIMELINE_CATEGORIES, TIMELINE_GROUPS  # noqa: E402
from profkit.core.units import human_bytes  # noqa: E402

MIB = 2**20
COLORS = {
    "parameters_trainable": "#1b9e77", "parameters_frozen": "#66a61e", "parameters_quantized": "#a6d854",
    "parameters_unsharded": "#b3de69",
    "gradients": "#e7298a", "optimizer_state": "#d95f02", "kv_cache": "#1f78b4", "activations": "#7570b3",
    "temporaries": "#e6ab02",
    "allocator_overhead": "#a6761d", "unattributed": "#999999",
    "gemm": "#1f77b4", "attention": "#ff7f0e", "convolution": "#8c564b", "quantization": "#2ca02c",
    "norm": "#d62728", "elementwise": "#9467bd", "embedding_loss": "#e377c2", "optimizer": "#bcbd22",
    "recompute": "#17becf", "communication": "#7f7f7f", "memcpy_memset": "#aec7e8", "data": "#ffbb78",
    "host_overhead": "#c5b0d5", "idle": "#dddddd", "other": "#000000",
}
TIMELINE_COLORS = {"parameters": "#66a61e", "optimizer_state": "#d95f02", "gradients": "#e7298a",
                   "activations": "#7570b3", "inputs": "#1f78b4", "temporaries": "#e6ab02", "unknown": "#999999"}


def _save(fig, path: Path, dpi: int = 110) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path


def _stacked(ax, frame, scale: float, unit: str) -> None:
    bottom = np.zeros(len(frame))
    for cat in frame.columns:
        values = frame[cat].fillna(0).clip(lower=0).to_numpy() / scale
        if values.any():
            ax.bar(frame.index, values, bottom=bottom, label=cat, color=COLORS.get(cat))
            bottom += values
    ax.set_ylabel(unit)
    ax.tick_params(axis="x", rotation=45)
    for tick in ax.get_xticklabels():
        tick.set_ha("right")


def _bar_chart(frame, scale: float, unit: str, title: str, path: Path, annotate=None) -> Path:
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(frame) + 3), 5))
    _stacked(ax, frame, scale, unit)
    if annotate:
        annotate(ax)
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)


def memory_bars(bd: Breakdown, path: Path) -> Path | None:
    """Composition as a share of each run's measured peak, the peak itself written on the bar: peaks span
    three orders of magnitude across methods, and stacked bars on a log axis would misdraw the parts."""
    mem = views.memory_at(bd)
    if mem.empty:
        return None  # traces profkit did not record have no inventory to decompose
    measured = bd.runs.set_index("run")["measured_peak_bytes"].reindex(mem.index)
    share = mem.clip(lower=0).div(measured, axis=0) * 100

    def label_peaks(ax) -> None:
        for x, (run, peak) in enumerate(measured.items()):
            ax.text(x, 101, human_bytes(peak), ha="center", va="bottom", fontsize=7, rotation=90)
        ax.set_ylim(0, 125)

    return _bar_chart(share, 1, "% of the measured peak", "Memory at the peak, by owner (bar labels: measured peak)",
                      path, label_peaks)


def time_bars(bd: Breakdown, path: Path) -> Path:
    return _bar_chart(views.time_per_step(bd), 1e-3, "ms per profiled step",
                      "Step time by operator category (profiled steps)", path)


def memory_timelines(bd: Breakdown, path: Path) -> Path | None:
    runs = [r for r in bd.runs.itertuples() if r.run in bd.timelines]
    if not runs:
        return None
    cols = 4
    rows = -(-len(runs) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, r in zip(axes.flat, runs):
        tl = bd.timelines[r.run]
        start = tl.t_ns[tl.t_ns > 0].min()
        t_ms = (np.clip(tl.t_ns, start, None) - start) / 1e6
        series = [tl.live[:, [TIMELINE_CATEGORIES.index(c) for c in group]].sum(axis=1) / MIB
                  for group in TIMELINE_GROUPS.values()]
        ax.stackplot(t_ms, *series, colors=list(TIMELINE_COLORS.values()), step="post")
        top = ax.get_ylim()[1]
        for phase, (a, b) in bd.phase_windows.get(r.run, {}).items():
            a_ms = (a - start) / 1e6
            ax.axvline(a_ms, color="black", lw=0.6, ls="--")
            ax.text(a_ms, top, f" {phase}", ha="left", va="top", fontsize=6, rotation=90)
        ax.set_title(r.run, fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(runs):]:
        ax.axis("off")
    fig.supxlabel("ms into the memory cycle (dashed: phase starts)", fontsize=9, y=0.035)
    fig.supylabel("MiB live (profiler categories)", fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in TIMELINE_COLORS.values()]
    fig.legend(handles, list(TIMELINE_COLORS), loc="lower center", ncol=len(TIMELINE_COLORS), fontsize=8)
    fig.tight_layout(rect=(0.02, 0.06, 1, 1))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def trace_memory_over_time(bd: Breakdown, path: Path) -> Path | None:
    """Traces profkit did not record: allocated and reserved memory of each accelerator over the trace,
    from its [memory] events."""
    m = bd.memory_over_time
    if m.empty:
        return None
    m = m[m.device != "cpu"]
    series = list(m.groupby(["run", "device"], sort=False))
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(9, 2.4 * len(series)), squeeze=False)
    for ax, ((run, device), g) in zip(axes.flat, series):
        ax.plot(g.t_s * 1e3, g.allocated_bytes / MIB, lw=0.9, label="allocated")
        if g.reserved_bytes.notna().any():
            ax.plot(g.t_s * 1e3, g.reserved_bytes / MIB, lw=0.9, label="reserved")
        ax.set_title(f"{run} ({device})", fontsize=9)
        ax.set_ylabel("MiB", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7, loc="upper left")
    axes.flat[-1].set_xlabel("ms from the trace's first event", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def pareto(bd: Breakdown, path: Path) -> Path | None:
    r = bd.runs[(bd.runs.status == "ok") & bd.runs.measured_peak_bytes.notna() & bd.runs.clean_step_time_s.notna()]
    r = r[r.method.map(lambda m: not str(m).startswith("infer"))] if "method" in r else r
    if r.empty:
        return None
    x, y = r.measured_peak_bytes.to_numpy() / MIB, r.clean_step_time_s.to_numpy() * 1e3
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.scatter(x, y, color="#1f77b4", zorder=3)
    for xi, yi, name in zip(x, y, r.run):
        ax.annotate(name, (xi, yi), fontsize=7, xytext=(3, 3), textcoords="offset points")
    order = np.argsort(x)
    front, best = [], np.inf
    for i in order:  # fastest method at or under each memory level
        if y[i] < best:
            best = y[i]
            front.append(i)
    ax.step(x[front], y[front], where="post", color="#d62728", label="Pareto front (fastest under a memory budget)")
    ax.set_xscale("log")
    ax.set_xlabel("measured peak memory (MiB, log)")
    ax.set_ylabel("clean step time (ms)")
    ax.set_title("Training methods: peak memory against step time")
    ax.legend(fontsize=8)
    return _save(fig, path)


def estimate_bars(at_peak: pd.DataFrame, path: Path, reference: dict[str, float] | None = None,
                  reference_label: str = "reference") -> Path:
    """Predicted memory at each method's peak, stacked by category (GB); ``reference`` peaks (bytes) as marks."""
    frame = at_peak.drop(index="peak").T

    def mark(ax):
        if reference:
            names = [m for m in frame.index if m in reference]
            ax.scatter(names, [reference[m] / 1e9 for m in names], color="black", marker="_", s=400,
                       linewidths=3, zorder=3, label=reference_label)
    return _bar_chart(frame, 1e9, "GB", "Predicted memory at each method's peak", path, annotate=mark)


def ranks_chart(bd: Breakdown, path: Path) -> Path | None:
    """Each job of several ranks: time per step by category for every rank (the slowest stands out), and each
    rank's communication, exposed and hidden under compute."""
    found = ranks.groups(bd)
    if not found:
        return None
    summary = ranks.rank_summary(bd)
    fig, axes = plt.subplots(len(found), 2, figsize=(12, 4 * len(found)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (group, runs), (left, right) in zip(found.items(), axes):
        s = summary[summary.group == group].set_index("run").loc[runs]
        per_rank = views.time_per_step(bd).reindex(runs).fillna(0.0)
        per_rank.index = [str(int(r)) for r in s["rank"]]
        _stacked(left, per_rank, 1e-3, "ms per profiled step")
        left.set_xlabel("rank")
        left.tick_params(axis="x", rotation=0)
        left.set_title(f"{group}: time per step by category")
        left.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1, 1))
        x = np.arange(len(s))
        right.bar(x, s.communication_s * 1e3, label="exposed", color=COLORS["communication"])
        right.bar(x, s.communication_overlapped_s * 1e3, bottom=s.communication_s * 1e3,
                  label="overlapped with compute", color="#cccccc")
        right.set_xticks(x, [str(int(r)) for r in s["rank"]])
        right.set_xlabel("rank")
        right.set_ylabel("ms per profiled step")
        right.set_title("communication per rank")
        right.legend(fontsize=7)
    return _save(fig, path)


def snapshot_timeline(analysis, path: Path) -> Path | None:
    """An allocator snapshot's history: allocated stacked by owner, reserved as a line, the OOMs marked."""
    frame = analysis.timeline
    if frame.empty:
        return None
    devices = sorted(frame.device.unique())
    fig, axes = plt.subplots(len(devices), 1, figsize=(11, 4 * len(devices)), squeeze=False)
    for dev, (ax,) in zip(devices, axes):
        f = frame[frame.device == dev]
        owners = [c for c in f.columns if c.startswith("allocated_bytes.")]
        ax.stackplot(f.t_s, *[f[c].clip(lower=0) / MIB for c in owners],
                     labels=[c.removeprefix("allocated_bytes.") for c in owners], alpha=0.85)
        ax.plot(f.t_s, f.reserved_bytes / MIB, color="black", lw=1.2, label="reserved")
        ax.plot(f.t_s, f.allocated_bytes / MIB, color="#444444", lw=0.8, ls="--", label="allocated")
        for t in analysis.oom[analysis.oom.device == dev].t_s:
            ax.axvline(t, color="red", lw=1)
        ax.set_xlabel("seconds into the recorded history")
        ax.set_ylabel("MiB")
        ax.set_title(f"{analysis.path.name}, device {dev}: allocated by owner, and reserved")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    return _save(fig, path)
