from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from profkit.cli import options
from profkit.cli.common import fail_usage
from profkit.core.exitcodes import Exit
from profkit.core.methods import METHODS, Method, UnknownMethodError, resolve
from profkit.core.presets import UnknownPresetError, get_preset
from profkit.core.settings import RunSettings
from profkit.core.units import human_bytes
from profkit.launch import runner
from profkit.store import DEFAULT_ROOT

EPILOG = (f"Exit codes: {Exit.OK.value} every run ok; {Exit.FAILED.value} a run failed or ran out of memory; "
          f"{Exit.USAGE.value} bad arguments (e.g. an unknown method); {Exit.UNSUPPORTED.value} a method is "
          f"unsupported on this device (the others were recorded); {Exit.INTERRUPTED.value} interrupted.")
STATUS_STYLE = {"ok": "green", "unsupported": "yellow", "interrupted": "yellow", "oom": "red", "failed": "red"}


class _ProgressObserver:
    def __init__(self, progress: Progress, n_methods: int):
        self.progress = progress
        self.overall = progress.add_task("matrix", total=n_methods)
        self.current = None

    def method_started(self, method: Method, total_steps: int) -> None:
        self.current = self.progress.add_task(f"  {method.name}", total=total_steps)

    def step_done(self, method: Method, phase: str) -> None:
        if self.current is not None:
            self.progress.update(self.current, advance=1, description=f"  {method.name} [dim]{phase}[/]")

    def method_finished(self, outcome: runner.Outcome) -> None:
        if self.current is not None:
            self.progress.remove_task(self.current)
            self.current = None
        self.progress.advance(self.overall)
        self.progress.console.print(summary_line(outcome))


def summary_line(outcome: runner.Outcome) -> str:
    m = outcome.record
    style = STATUS_STYLE.get(outcome.status, "red")
    head = f"[{style}]{outcome.status:<11}[/] {outcome.method:<15}"
    if outcome.status != "ok":
        return f"{head} {escape(outcome.reason or '')} [dim](see {escape(str(outcome.path))})[/]"
    t = m.timings
    unit = "tok/s"
    peaks = m.peaks
    peak = (f"peak allocated {human_bytes(peaks['cuda_max_allocated'])}" if "cuda_max_allocated" in peaks
            else f"peak RSS {human_bytes(peaks.get('process_rss_peak', 0))}")
    return f"{head} step {t['step_time_s'] * 1e3:8.1f} ms {t['tokens_per_s']:9,.0f} {unit}  {peak}"


@options.run_options()
@options.method_options
def record(
    methods: list[str] = typer.Argument(None, help=f"Methods to record ({', '.join(METHODS)}).", show_default=False),
    all_methods: bool = typer.Option(False, "--all", help="Record every method (the whole matrix)."),
    output: Path = typer.Option(DEFAULT_ROOT, "--output", "-o", help="Directory that receives one run per method."),
    run_settings: dict = None, method_settings: dict = None,
) -> None:
    """Record methods under torch.profiler, each in a fresh process, into OUTPUT/<method>/."""
    try:
        chosen = resolve(methods or [], all_methods)
        get_preset(run_settings["preset"])
    except (UnknownMethodError, UnknownPresetError) as exc:
        fail_usage(str(exc))
    if not chosen:
        fail_usage(f"name at least one method, or --all; valid methods: {', '.join(METHODS)}")
    engine, nproc = run_settings["engine"], run_settings["nproc"]
    model, dataset = run_settings["model_path"], run_settings["dataset_path"]
    if model is not None and not (model / "config.json").is_file():
        fail_usage(f"--model {model}: not a Hugging Face checkpoint directory (no config.json)")
    if engine == "trainer" and any(m.kind != "train" for m in chosen):
        inference = [m.name for m in chosen if m.kind != "train"]
        fail_usage(f"--engine trainer records training methods only; {', '.join(inference)} "
                   + ("is an inference method" if len(inference) == 1 else "are inference methods"))
    if nproc > 1 and any(not m.sharded for m in chosen):
        single = [m.name for m in chosen if not m.sharded]
        fail_usage(f"--nproc {nproc} needs methods that share work across ranks (the ZeRO and FSDP methods: "
                   f"{', '.join(n for n, m in METHODS.items() if m.sharded)}); {', '.join(single)} would run "
                   f"{nproc} independent copies (DDP, a replica per rank, is estimated, not recorded: profkit estimate "
                   f"{single[0]} --world-size {nproc})")
    if dataset is not None and not dataset.is_file():
        fail_usage(f"--dataset {dataset}: no such file")
    chosen, overrides = options.apply(chosen, method_settings)
    base = RunSettings.from_options(run_settings, method="", overrides=overrides)
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            outcomes = runner.record(chosen, base, output, _ProgressObserver(progress, len(chosen)))
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: the run in progress is marked 'interrupted'; complete runs are kept")
        raise typer.Exit(Exit.INTERRUPTED)
    statuses = {o.status for o in outcomes}
    if statuses & {"failed", "oom"}:
        raise typer.Exit(Exit.FAILED)
    if "unsupported" in statuses:
        raise typer.Exit(Exit.UNSUPPORTED)
