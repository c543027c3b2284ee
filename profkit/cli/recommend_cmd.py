from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit import store
from profkit.analyze import breakdown
from profkit.cli import options
from profkit.cli.common import TableOrJson as Format, fail_usage, model_label, parse_budget
from profkit.cli.estimate_cmd import (STACK_HELP, find_gpu, from_configs, read_stack, run_step_times,
                                      stacked_methods, workload_settings)
from profkit.core.exitcodes import Exit
from profkit.core.methods import METHODS
from profkit.core.settings import RunSettings
from profkit.core.stack import Stack
from profkit.core.units import human_bytes, human_seconds
from profkit.predict import recommend as ranking

EPILOG = (f"Exit codes: 0 at least one method fits; {Exit.FAILED.value} nothing fits the budget (the closest are "
          "shown); 2 bad arguments.")


@options.run_options("preset", "model_path", "batch_size", "seq_len", help_prefix="Without runs: ")
def recommend(
    path: Optional[Path] = typer.Argument(None, help="Recorded runs (traces/): rank by measured peak and step time."),
    budget: str = typer.Option(..., help="Memory budget, e.g. 8GiB, 7.5GB, 512MiB."),
    device: str = typer.Option("cuda", help="Without runs: the target, cuda or cpu."),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="Rank methods without a run at the largest batch each fits, "
                                                         "by tokens/s predicted on this GPU (`profkit methods --gpus` "
                                                         "lists them)."),
    stack_text: Optional[str] = typer.Option(None, "--stack", help="Without runs: " + STACK_HELP),
    configs: list[Path] = typer.Option(None, "--config", help="Without runs: your training config (see `profkit "
                                       "estimate --help`): its model, sizes, settings and stack; every method is "
                                       "ranked with the settings that apply to it.", show_default=False),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    run_settings: dict = None,
) -> None:
    """Rank the training methods that fit a memory budget: by measured speed where runs were recorded, otherwise
    by the estimate (with --gpu, each at the largest batch it fits, by the tokens/s predicted there, as `profkit
    fit` searches). Methods without a run are estimated with the runs' own model and sizes."""
    budget_bytes = parse_budget(budget)

    measured = ranking.from_breakdown(_training_runs(path) if path is not None else pd.DataFrame())
    training = [m.name for m in METHODS.values() if m.kind == "train"]
    candidates, given, first = [METHODS[n] for n in training], {}, None
    if configs and measured.empty:
        candidates, given, run_settings, _, first, _ = from_configs(configs, training, {}, run_settings, 1)
    settings, target, recorded = (_settings_of_runs(path) if not measured.empty
                                  else (workload_settings(run_settings).resolved(), device, first))
    stack = read_stack(stack_text, recorded)  # the runs' own stack first, or the config's
    missing = [m for m in candidates if m.name not in set(measured.method)]
    target_gpu = find_gpu(gpu, target)
    estimates, skipped = _estimable(missing, settings, target, stack, given)
    kept = [m for m in missing if m.label in {e.method for e in estimates}]
    searched = target_gpu is not None and measured.empty and bool(kept)
    if searched:  # fit's engine: each method at the largest batch that fits, timed there
        estimated = _fitted(kept, settings, target, budget_bytes, stack, given, target_gpu)
    else:
        times = (run_step_times(stacked_methods(kept, given, stack, settings), settings, target_gpu, 1)
                 if target_gpu is not None and kept else {})
        estimated = ranking.from_estimates(estimates, times)
    ranked = ranking.rank(pd.concat([f for f in (measured, estimated) if not f.empty], ignore_index=True), budget_bytes)
    by_reason: dict[str, list[str]] = {}
    for refusal in skipped:  # "method: reason" (EstimateError's form), one line per reason
        method, _, reason = refusal.partition(": ")
        by_reason.setdefault(reason or method, []).append(method.split(" on ")[0])
    if fmt is Format.json:
        typer.echo(json.dumps({"budget_bytes": budget_bytes, "model": model_label(settings),
                               "seq_len": settings.seq_len, "batch_size": None if searched else settings.batch_size,
                               "batch": "largest that fits" if searched else "given", "target": target,
                               "gpu": target_gpu.key if target_gpu else None,
                               "stack": stack.to_json() if missing else None,
                               "ranked": _records(ranked),
                               "not_ranked": [{"reason": r, "methods": m} for r, m in by_reason.items()]}, indent=2))
    else:
        if missing:  # what the estimates assumed; measured runs ran what they ran
            Console().print(f"stack: {stack.describe()}", highlight=False)
        _print(ranked, budget_bytes, settings, target, target_gpu.key if target_gpu else None, searched)
        for reason, methods in by_reason.items():
            Console().print(f"[dim]not ranked ({escape(reason)}): {', '.join(methods)}[/]", highlight=False)
    if not ranked.fits.any():
        raise typer.Exit(Exit.FAILED)


def _fitted(methods, settings: RunSettings, target: str, budget_bytes: int, stack, given: dict, gpu) -> pd.DataFrame:
    """Each method at the largest batch that fits the budget (``fit``'s search, the budget whole: no margin), with
    the step time predicted there."""
    from profkit.predict.fit import BATCH, Device, fit_methods  # heavy: torch

    with Console(stderr=True).status("") as status:
        rows = fit_methods(methods, settings, Device(budget_bytes, 0.0, human_bytes(budget_bytes)), target, 1,
                           stack, given, gpu, dimensions=(BATCH,), progress=lambda text: status.update(escape(text)))
    return ranking.from_fit(rows, methods)


def _records(ranked: pd.DataFrame) -> list[dict]:
    """The ranked rows as JSON values (NaN as null, numpy numbers as Python's)."""
    return [{k: (None if v is None or (isinstance(v, float) and v != v) else
                 v.item() if hasattr(v, "item") else v) for k, v in row.items()}
            for row in ranked.astype(object).to_dict("records")]


def _estimable(methods, settings: RunSettings, target: str, stack, given: dict):
    """The estimates of the methods the estimator models with these settings, and why each other one is not."""
    from profkit.predict.estimate import EstimateError, estimate_methods  # heavy: torch

    if target not in ("cpu", "cuda"):
        fail_usage(f"unknown device {target!r}; valid: cpu, cuda")
    estimates, skipped = [], []
    for method in methods:
        try:
            estimates += estimate_methods([method], settings, target, 1, stack, given)
        except EstimateError as exc:
            skipped.append(str(exc))
    return estimates, skipped


def _training_runs(path: Path):
    if not path.exists():
        fail_usage(f"{path}: no such file or directory")
    bd = breakdown([path])
    for problem in bd.problems:
        Console(stderr=True).print(f"[yellow]warning:[/] {escape(str(problem))}", highlight=False)
    runs = bd.runs
    if runs.empty:
        return runs
    return runs[runs.get("kind", pd.Series(index=runs.index, dtype=object)) == "train"]


def _settings_of_runs(path: Path) -> tuple[RunSettings, str, Stack]:
    """The model, sizes, device and stack the recorded runs used, so that estimates compare with them."""
    for run in store.find_runs(path):
        try:
            record = run.read_record()
        except store.ManifestError:
            continue
        if record.complete and record.run_settings:
            return (RunSettings.from_json(record.run_settings), record.device.get("type", "cpu"),
                    Stack.from_manifest(record.versions, record.engine))
    fail_usage(f"{path}: no completed run to take the model and sizes from")


def _print(ranked, budget_bytes: int, settings: RunSettings, target: str, gpu: str | None, searched: bool) -> None:
    out = Console()
    fits = ranked[ranked.fits]
    batch = "each at the largest batch it fits" if searched else f"batch {settings.batch_size}"
    table = Table(title=f"Training methods within {human_bytes(budget_bytes)}: "
                        f"{model_label(settings)}, {batch} x {settings.seq_len}, {gpu or target}")
    # Searched, every row is predicted (the note under the table says so): the batch takes the source's place.
    for col in ("rank", "method", *(["batch", "peak"] if searched else ["peak memory"]), "step time", "tokens/s",
                *([] if searched else ["source"])):
        table.add_column(col, justify="right" if col not in ("method", "source") else "left",
                         no_wrap=col == "method")
    shown = fits if not fits.empty else ranked.head(3)
    for i, r in enumerate(shown.itertuples(), 1):
        source = ("measured" if r.source == "measured" else "predicted" if r.source == "predicted" else
                  "estimated: " + (", ".join(c.replace("_", " ") for c in r.time_costs) or "no time cost"))
        table.add_row(str(i) if r.fits else "-", r.method, *([f"{r.batch_size:,}"] if searched else []),
                      human_bytes(r.peak_bytes), human_seconds(r.step_time_s),
                      f"{r.tokens_per_s:,.0f}" if r.tokens_per_s == r.tokens_per_s and r.tokens_per_s is not None else "-",
                      *([] if searched else [source]))
    if fits.empty:
        out.print(f"[red]Nothing fits {human_bytes(budget_bytes)}.[/] The closest:", highlight=False)
    out.print(table)
    if (shown.source == "estimated").any():
        out.print("[dim]estimated: predicted peak from `profkit estimate` (on CUDA its reserved estimate: the "
                  "allocated peak plus what the caching allocator reserves beyond it). Without a run "
                  "there is no step time: "
                  "these are ordered by what their memory-saving measures are known to cost (fewer first; "
                  "ZeRO-Offload, ZeRO-3's gathers, 4-bit dequantization and checkpointing's recompute before "
                  "ZeRO-2's bookkeeping and 8-bit optimizer state), which is not a measurement; record them to "
                  "rank by speed[/]", highlight=False)
    if (shown.source == "predicted").any():
        out.print(f"[dim]predicted on {gpu}: peak from `profkit estimate`"
                  + (" at the largest batch that fits (`profkit fit`'s search: nvidia-smi's view where the step is "
                     "replayed)" if searched else "")
                  + ", step time predicted from the step's work at efficiencies measured on real GPU traces "
                  "(`profkit estimate --gpu`); not measured[/]", highlight=False)
    if (shown.source == "measured").any():
        out.print("[dim]measured: peak from `profkit breakdown`, clean step time from the recording[/]", highlight=False)
