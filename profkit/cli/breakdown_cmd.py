from __future__ import annotations

from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.analyze import Breakdown, ranks, views
from profkit.analyze import breakdown as analyse
from profkit.analyze.categories import TIME_CATEGORIES
from profkit.analyze.glance import at_a_glance
from profkit.cli.common import Format, fail_usage, labelled_chunks, numbered_if_long, parse_budget
from profkit.core.exitcodes import Exit
from profkit.core.units import human_bytes, human_seconds
from profkit.report import findings, formats, tables

EPILOG = ("Exit codes: 0 every input analysed; 1 an input could not be analysed (each is named, the others "
          "are still shown); 2 bad arguments.")
CATEGORY_WIDTH = 21
RUN_COLUMN_WIDTH = 12


def breakdown(
    paths: list[Path] = typer.Argument(..., help="Run directories, directories of runs (traces/), or Kineto trace files."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    baseline: Optional[str] = typer.Option(None, help="Run to compare against (default: full if present, else the first)."),
    phase: str = typer.Option("peak", help="Memory at the peak of: peak (the run), forward, backward, optimizer."),
    explain: Optional[str] = typer.Option(None, help="List the op and kernel names in a time category, trace by trace "
                                                       "(e.g. other: what no rule or context named)."),
    jobs: Optional[int] = typer.Option(None, min=1, help="Worker processes for many inputs (default: by CPU count "
                                                         "and available memory)."),
    budget: Optional[str] = typer.Option(None, help="Memory budget, e.g. 8GiB: the at-a-glance table lists the runs "
                                                    "within it first, fastest first."),
) -> None:
    """Decompose memory by owner and time by operator category, side by side across runs."""
    if explain is not None and explain not in TIME_CATEGORIES:
        fail_usage(f"unknown time category {explain!r}; valid: {', '.join(TIME_CATEGORIES)}")
    if explain is not None and fmt is Format.csv:
        fail_usage("--explain adds a second table, which CSV cannot hold: use --format json or markdown")
    budget_bytes = parse_budget(budget)
    bd = analyse(paths, jobs)
    if baseline is not None and baseline not in set(bd.runs.get("run", [])):
        fail_usage(f"--baseline {baseline!r} is not among the runs: {', '.join(bd.runs.get('run', []))}")
    out = Console()
    err = Console(stderr=True)
    if fmt is Format.json:
        typer.echo(formats.to_json(bd, explain, budget_bytes, baseline))
    elif fmt is Format.csv:
        typer.echo(formats.to_csv(bd), nl=False)
    elif fmt is Format.markdown:
        typer.echo(formats.to_markdown(bd, baseline, explain, budget_bytes))
    else:
        _print_glance(out, bd, budget_bytes)
        _print_tables(out, bd, baseline, phase)
        if explain:
            _print_explain(out, bd, explain)
    for problem in bd.problems:
        err.print(f"[{'red' if problem.fatal else 'yellow'}]{'error' if problem.fatal else 'warning'}:[/] {escape(str(problem))}",
                  highlight=False)
    if bd.failed:
        raise typer.Exit(Exit.FAILED)


def _print_glance(out: Console, bd: Breakdown, budget_bytes: int | None) -> None:
    """The at-a-glance table first: one row per run, sorted as the reader asks (``analyze.glance``)."""
    glance = at_a_glance(bd, budget_bytes)
    if glance.empty:
        return
    cells = tables.glance_cells(glance, narrow=True).rename(columns={"memory at the peak": "memory\nat the peak",
                                                         "time (profiled step)": "time\n(profiled step)"})
    t = Table(title="At a glance", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False,
              show_edge=False)
    for col in cells.columns:
        # A long run name folds; the figures and the owners' lines never wrap.
        widest = max(len(line) for v in cells[col] for line in str(v).splitlines())
        t.add_column(col, justify="right" if col in ("peak", "reserved", "clean step") else "left",
                     overflow="fold", no_wrap=col != "run", min_width=None if col == "run" else widest)
    for _, row in cells.iterrows():
        t.add_row(*[escape(str(v)) for v in row])
    out.print(t)
    for note in tables.glance_notes(glance, budget_bytes):
        out.print(f"  {escape(note)}", highlight=False)


def _print_tables(out: Console, bd: Breakdown, baseline: str | None, phase: str) -> None:
    if bd.runs.empty:
        return
    label = _print_runs(out, bd)
    _print_step_times(out, bd, label)
    _print_generation(out, bd, label)
    _print_memory(out, bd, phase, label)
    _print_trace_memory(out, bd)

    _print_errors(out, "Memory predicted by `profkit estimate`: error against measured",
                  "training: static categories and activations at the forward phase's peak, gradients at the "
                  "optimizer step's; generation: weights and activations at the prefill's peak, the KV cache at the "
                  "last decode pass's; `--format json|markdown` gives the bytes", tables.predicted_errors(bd), label)
    _print_predicted_time(out, bd, label)

    tim = views.time_per_step(bd)
    _category_tables(out, "Time per profiled step (CPU runs: op self time; GPU runs: exposed kernel time and idle)",
                     tim, [r for r in bd.runs.run if r in tim.index], label)
    gpu_runs = [r for r in tim.index if views.primary_resource(bd, r) == "gpu"]
    host = views.time_per_step(bd, "cpu").reindex(gpu_runs).dropna(how="all", axis=1)
    _category_tables(out, "Host time per profiled step of the GPU runs (op self time on the profiled thread)",
                     host, gpu_runs, label)
    _print_efficiency(out, bd, label)
    _print_ranks(out, bd)
    _print_findings(out, bd, baseline)


def _print_runs(out: Console, bd: Breakdown) -> dict[str, str]:
    """The Runs table, each run's reason below it; returns each run's label, numbered where a name would not fit."""
    # Short two-line headers and no box: a full run name and the columns that hold values fit 80 columns.
    columns = {
        "run": lambda r: str(r["run"]),
        "status": lambda r: str(r.get("status")),
        "clean\nstep": lambda r: human_seconds(r.get("clean_step_time_s")),
        "tokens/s": lambda r: f"{r['tokens_per_s']:,.0f}" if pd.notna(r.get("tokens_per_s")) else "-",
        "profiled\nstep": lambda r: human_seconds(r.get("profiled_step_time_s")),
        "measured\npeak": lambda r: human_bytes(r.get("measured_peak_bytes")),
        "time\ncov.": lambda r: (lambda c: f"{c:.1%}" if pd.notna(c) else "-")(
            r.get("coverage_gpu") if pd.notna(r.get("coverage_gpu")) else r.get("coverage_cpu")),
    }
    cells = {col: [fmt(r) for _, r in bd.runs.iterrows()] for col, fmt in columns.items()}
    shown = [col for col in columns if col in ("run", "status") or any(v != "-" for v in cells[col])]
    # A column is as wide as its widest value or header line: a header is never cut to "sta…" either.
    widths = {col: max(len(v) for v in [*cells[col], *col.split("\n")]) for col in shown}
    # Each column beyond the first costs its width, its padding and the box's divider between columns.
    label = _run_labels(list(bd.runs.run), out.width, sum(widths[c] + 2 for c in shown[1:]))
    if any(label[r] != r for r in label):
        out.print("Runs are shown by number: a name would not fit the tables at this width.", highlight=False)
        for run, short in label.items():
            out.print(f"  {short}  {escape(run)}", highlight=False)
    cells["run"] = [label[r] for r in bd.runs.run]
    widths["run"] = max(len(v) for v in [*cells["run"], "run"])
    runs = Table(title="Runs", box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True)
    for col in shown:
        runs.add_column(col, justify="left" if col in ("run", "status") else "right", no_wrap=True,
                        min_width=widths[col])
    for i in range(len(bd.runs)):
        runs.add_row(*[cells[col][i] for col in shown])
    reasons = [f"{r['run']}: {r['reason']}" for _, r in bd.runs.iterrows() if isinstance(r.get("reason"), str)]
    out.print(runs)
    for line in reasons:  # below the table, where a long reason can wrap without squeezing the columns
        out.print(f"  {escape(line)}", highlight=False)
    return label


def _print_step_times(out: Console, bd: Breakdown, label: dict[str, str]) -> None:
    """The clean and profiled steps' spread, per run that has them."""
    spread = bd.runs[bd.runs.clean_step_min_s.notna() | bd.runs.profiled_step_min_s.notna()]
    if len(spread):
        t = Table(title="Step times", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption="clean: the timed steps, no profiler; profiled: the time cycle's steps")
        # A long run name folds onto a second line; the figures never shrink into an ellipsis.
        t.add_column("run", overflow="fold")
        t.add_column("steps", no_wrap=True, min_width=len("profiled"))
        for col in ("min", "median", "max"):
            t.add_column(col, justify="right", no_wrap=True, min_width=len("999.99 ms"))
        for _, r in spread.iterrows():
            # A trace recorded by others has no clean steps: no row of dashes for them.
            kinds = [(kind, prefix, median) for kind, prefix, median in (
                ("clean", "clean_step", "clean_step_time_s"), ("profiled", "profiled_step", "profiled_step_time_s"))
                if pd.notna(r.get(f"{prefix}_min_s"))]
            for i, (kind, prefix, median) in enumerate(kinds):
                t.add_row(label[r["run"]] if i == 0 else "", kind, human_seconds(r.get(f"{prefix}_min_s")),
                          human_seconds(r.get(median)), human_seconds(r.get(f"{prefix}_max_s")))
        out.print(t)


def _print_generation(out: Console, bd: Breakdown, label: dict[str, str]) -> None:
    """Generation runs: their latencies and KV cache."""
    serving = bd.runs[bd.runs.ttft_median_s.notna()]
    if len(serving):
        t = Table(title="Generation: latency of the unprofiled steps, KV cache", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption="TTFT: time to first token (prefill); TPOT: time per output token (each decode pass); "
                          "the KV cache at the end of generation and the tokens it holds")
        for col in ("run", "TTFT", "TPOT", "TPOT p90", "KV cache", "tokens"):
            t.add_column(col, justify="left" if col == "run" else "right", no_wrap=True)
        for _, r in serving.iterrows():
            t.add_row(label[r["run"]], human_seconds(r.ttft_median_s), human_seconds(r.tpot_median_s),
                      human_seconds(r.tpot_p90_s), human_bytes(r.kv_cache_bytes),
                      f"{int(r.kv_cache_tokens)}" if pd.notna(r.kv_cache_tokens) else "-")
        out.print(t)


def _print_memory(out: Console, bd: Breakdown, phase: str, label: dict[str, str]) -> None:
    """Memory by category at the peak of ``phase``, beside the measured peak, in tables that fit the terminal."""
    mem = views.memory_at(bd, phase)
    measured = bd.measured[bd.measured.phase == phase].set_index("run")["measured_peak_bytes"] if len(bd.measured) else {}
    for chunk in labelled_chunks([r for r in bd.runs.run if r in mem.index], label, out.width) if not mem.empty else []:
        t = Table(title="Memory at the run's peak" if phase == "peak" else f"Memory at the {phase} phase's peak")
        t.add_column("category", no_wrap=True, min_width=CATEGORY_WIDTH)
        for run in chunk:
            t.add_column(label[run], justify="right", no_wrap=True, min_width=max(RUN_COLUMN_WIDTH, len(label[run])))
        for cat in mem.columns:
            t.add_row(cat, *[human_bytes(mem.loc[run, cat]) for run in chunk])
        t.add_row("[bold]measured peak[/]", *[human_bytes(measured.get(run)) for run in chunk])
        out.print(t)


def _print_findings(out: Console, bd: Breakdown, baseline: str | None) -> None:
    """The sentences on idle time, exposure, the differences from the baseline and between engines; the notes."""
    for sentence in findings.idle_sentences(bd):
        out.print(escape(sentence), highlight=False)
    for sentence in findings.exposure_sentences(bd):
        out.print(escape(sentence), highlight=False)
    baseline = baseline or tables.default_baseline(bd)
    if baseline:
        for sentence in findings.delta_sentences(bd, baseline):
            out.print(escape(sentence), highlight=False)
    for sentence in findings.engine_differences(bd):
        out.print(escape(sentence), highlight=False)
    for note in bd.common_notes():
        out.print(f"[dim]note: {escape(note)}[/]", highlight=False)
    for run, notes in bd.notes.items():
        for note in notes:
            if note not in bd.common_notes():
                out.print(f"[dim]{escape(run)}: {escape(note)}[/]", highlight=False)


def _print_predicted_time(out: Console, bd: Breakdown, label: dict[str, str]) -> None:
    """GPU runs: the step time predicted before the run against the measured, per category (errors)."""
    p = bd.predicted_time
    if not p.empty:
        _print_errors(out, "Step time predicted by `profkit estimate --gpu`: error against measured",
                      "each category's kernel time per profiled step; step: the clean step; `--format json` gives "
                      "the seconds", p.pivot(index="run", columns="category", values="error"), label)


def _print_errors(out: Console, title: str, caption: str, errors: pd.DataFrame, label: dict[str, str]) -> None:
    """Predicted / measured - 1, a row per category and a column per run, in tables that fit the terminal."""
    for chunk in labelled_chunks(list(errors.index), label, out.width) if not errors.empty else []:
        # The title above the table, not in it: rich wraps a title to the table's width, narrow for one run.
        out.print(title, style="italic", highlight=False)
        t = Table(caption=caption)
        t.add_column("category", no_wrap=True, min_width=CATEGORY_WIDTH)
        for run in chunk:
            t.add_column(label[run], justify="right", no_wrap=True, min_width=max(RUN_COLUMN_WIDTH, len(label[run])))
        for cat in errors.columns:
            if errors.loc[chunk, cat].notna().any():  # kv_cache only where a generation run is in the chunk
                t.add_row(cat, *[tables.format_error(errors.loc[run, cat]) for run in chunk])
        out.print(t)


TIME_CAPTION = ("share of the profiled step, then its time as profiled: the profiler's own cost inflates "
                "absolute times unevenly, so a share x the clean step time is only an estimate of a category's "
                "unprofiled time")


def _category_tables(out: Console, title: str, frame: pd.DataFrame, runs: list[str], label: dict[str, str]) -> None:
    """Each category's share of the step and its seconds per step, one column per run, split into tables that fit
    the terminal."""
    for chunk in labelled_chunks(runs, label, out.width, RUN_COLUMN_WIDTH + 4) if runs else []:
        t = Table(title=title, caption=TIME_CAPTION)
        t.add_column("category", no_wrap=True, min_width=CATEGORY_WIDTH)
        for run in chunk:
            t.add_column(label[run], justify="right", no_wrap=True,
                         min_width=max(RUN_COLUMN_WIDTH + 4, len(label[run])))
        share, total = views.time_shares(frame.loc[chunk])
        for cat in frame.columns:
            t.add_row(cat, *[_share(frame.loc[run, cat], share.loc[run, cat]) for run in chunk])
        t.add_row("[bold]profiled step[/]", *[_share(total[run], 1.0 if total[run] else None) for run in chunk])
        out.print(t)


def _run_labels(runs: list[str], width: int, runs_table_values: int) -> dict[str, str]:
    """Each run as the tables name it: its name where every name fits (a table of one run beside the category
    column, and the Runs table beside its figures); otherwise ``#1``, ``#2``... for all, so a long name (ranks of
    a job, a user's run directory) never pushes a figure past the terminal's edge or is cut."""
    return numbered_if_long(runs, min(width - CATEGORY_WIDTH - 6, width - runs_table_values - 4))


def _share(seconds, share) -> str:
    if pd.isna(seconds):
        return "-"
    return human_seconds(seconds) if share is None or pd.isna(share) else f"{share:4.0%} {human_seconds(seconds):>9}"


DETAILED_EFFICIENCY_RUNS = 3  # more runs than this: the summary only (the details are in --format json)


def _print_efficiency(out: Console, bd: Breakdown, label: dict[str, str]) -> None:
    summary = tables.utilisation(bd)
    if summary.empty:
        return
    t = Table(title="Work per profiled step (from the recorded shapes)", box=box.SIMPLE_HEAD, padding=(0, 1),
              caption="MFU: model FLOPs (no recompute) over the clean step (a trace: its profiled step) and the "
                      "device's dense peak; HFU "
                      "with recompute; GPU runs on a known GPU only")
    t.add_column("run", overflow="fold")
    t.add_column("device", no_wrap=True)
    for col in ("GFLOP\nper step", "GEMM\nTFLOP/s", "MFU", "HFU"):
        t.add_column(col, justify="right", no_wrap=True, min_width=6)
    for _, r in summary.iterrows():
        t.add_row(escape(label.get(r.run, r.run)), escape(str(r.device)), _number(r.model_gflop_per_step, "{:,.1f}"),
                  _number(r.gemm_tflop_per_s, "{:.3g}"), _number(r.mfu, "{:.1%}"), _number(r.hfu, "{:.1%}"))
    out.print(t)
    if len(summary) > DETAILED_EFFICIENCY_RUNS:
        out.print("[dim]each category's rates and roofs: --format json (efficiency)[/]", highlight=False)
        return
    for run in summary.run:
        detail = tables.efficiency(bd, run)
        t = Table(title=f"{label.get(run, run)}: how each category used the device", box=box.SIMPLE_HEAD,
                  padding=(0, 1), collapse_padding=True, pad_edge=False, caption="roof: the share reached of the roof that bounds the work (compute or "
                                              "memory bandwidth); uncounted: ops without a formula, shapes or a "
                                              "launch in the trace")
        headers = {"category": "category", "work": "work", "seconds": "time", "tflop_per_s": "TFLOP/s",
                   "gbyte_per_s": "GB/s", "flop_per_byte": "FLOP/B", "bound": "bound", "roof_fraction": "roof"}
        for col, header in headers.items():
            left = col in ("category", "work", "bound")
            t.add_column(header, justify="left" if left else "right", no_wrap=True,
                         min_width=max(len(header), detail[col].astype(str).str.len().max() if left else 0))
        for _, r in detail.iterrows():
            t.add_row(r.category, r.work, _number(r.seconds * 1e3, "{:.3g} ms"), _number(r.tflop_per_s, "{:.3g}"),
                      _number(r.gbyte_per_s, "{:,.0f}"), _number(r.flop_per_byte, "{:.3g}"), r.bound or "-",
                      _number(r.roof_fraction, "{:.0%}"))
        out.print(t)


def _number(value, fmt: str) -> str:
    return fmt.format(value) if value is not None and pd.notna(value) and value != 0 else "-"


def _print_ranks(out: Console, bd: Breakdown) -> None:
    """Ranks of one job (traces with distributedInfo): each category across ranks, and each rank."""
    across, per_rank, memory = ranks.across_ranks(bd), ranks.rank_summary(bd), ranks.rank_memory(bd)
    for group, g in across.groupby("group", sort=False):
        t = Table(title=f"{group}: time per step across ranks", box=box.SIMPLE_HEAD, padding=(0, 1))
        for col in ("category", "min", "median", "max", "most on rank"):
            t.add_column(col, justify="left" if col == "category" else "right", no_wrap=True)
        for _, r in g.iterrows():
            t.add_row(r.category, human_seconds(r.min_s), human_seconds(r.median_s), human_seconds(r.max_s),
                      str(r.rank_with_most))
        out.print(t)
        t = Table(title=f"{group}: each rank, per step", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption="on the GPU where there is one: compute; waiting in collectives (communication not "
                          "hidden under compute; on CPU: the profiled thread ran no operator while a collective "
                          "ran); idle; communication hidden under compute. start skew: how much later than the "
                          "earliest rank its first profiled step began")
        for col in ("rank", "step", "compute", "waiting", "idle", "hidden\ncomm.", "start\nskew"):
            t.add_column(col, justify="right", no_wrap=True)
        for _, r in per_rank[per_rank.group == group].iterrows():
            t.add_row(str(r["rank"]), human_seconds(r.step_s), human_seconds(r.compute_s),
                      human_seconds(r.communication_s), human_seconds(r.idle_s),
                      human_seconds(r.communication_overlapped_s), f"{r.start_skew_ms:.2f} ms")
        out.print(t)
        mem = memory[memory.group == group]
        if mem.parameters_bytes.notna().any():
            t = Table(title=f"{group}: memory on each rank", box=box.SIMPLE_HEAD, padding=(0, 1),
                      caption="from each rank's inventory; share: parameter bytes held against the whole model's")
            for col in ("rank", "parameters", "share", "gradients", "optimizer\nstate", "measured\npeak"):
                t.add_column(col, justify="right", no_wrap=True)
            for _, r in mem.iterrows():
                t.add_row(str(r["rank"]), human_bytes(r.parameters_bytes), f"{r.parameters_fraction:.1%}",
                          human_bytes(r.gradients_bytes), human_bytes(r.optimizer_state_bytes),
                          human_bytes(r.measured_peak_bytes))
            out.print(t)
    for sentence in findings.rank_sentences(bd):
        out.print(escape(sentence), highlight=False)


def _print_trace_memory(out: Console, bd: Breakdown) -> None:
    """Traces profkit did not record: bytes live at each device's allocated peak, by what allocated them."""
    for (run, device), g in bd.trace_memory.groupby(["run", "device"], sort=False):
        peak = bd.trace_memory_peaks[(bd.trace_memory_peaks.run == run) & (bd.trace_memory_peaks.device == device)]
        p = peak.iloc[0]
        if p.peak_allocated_bytes < 1 << 20:
            continue  # a few bytes of host memory: nothing to decompose
        reserved = (f"; reserved peak {human_bytes(p.peak_reserved_bytes)} at {p.reserved_peak_s:.3f} s"
                    if pd.notna(p.peak_reserved_bytes) else "")
        t = Table(title=f"{run}, {device}: live at the allocated peak", box=box.SIMPLE_HEAD, padding=(0, 1),
                  caption=f"allocated peak {human_bytes(p.peak_allocated_bytes)} at {p.allocated_peak_s:.3f} s{reserved}"
                          "; from the trace's \\[memory] events")
        for col in ("phase", "category", "bytes", "allocations"):
            t.add_column(col, justify="right" if col in ("bytes", "allocations") else "left", no_wrap=True)
        for _, r in g.iterrows():
            t.add_row(r.phase, r.category, human_bytes(r["bytes"]), f"{r.allocations:,}" if r.allocations else "-")
        out.print(t)


def _print_explain(out: Console, bd: Breakdown, category: str, top: int = 12) -> None:
    """Trace by trace: the names in the category, largest first, with their share of the step."""
    names = views.explain(bd, category)
    if names.empty:
        out.print(f"No time in '{category}' in any run.")
        return
    for (run, resource), g in names.groupby(["run", "resource"], sort=False):
        total = g.seconds.sum()
        t = Table(title=f"{run}: '{category}' on the {resource.upper() if resource == 'gpu' else 'host'}, "
                        f"{human_seconds(total)} per step ({g.share_of_step.sum():.1%} of the step)",
                  box=box.SIMPLE_HEAD, padding=(0, 1), expand=True)
        t.add_column("name (whole in --format json)", overflow="ellipsis", no_wrap=True, ratio=1)
        t.add_column("time/step", justify="right", no_wrap=True)
        t.add_column("step", justify="right", no_wrap=True)
        for _, r in g.head(top).iterrows():
            t.add_row(escape(r["name"][:200]), human_seconds(r.seconds), f"{r.share_of_step:.1%}")
        if len(g) > top:
            rest = g.iloc[top:]
            t.add_row(f"[dim]{len(rest)} more names[/]", human_seconds(rest.seconds.sum()),
                      f"{rest.share_of_step.sum():.1%}")
        out.print(t)