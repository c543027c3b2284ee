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
    configs: list[Path] = typer.Option(None, "--config", help="Your training config (as `profkit estimate` reads "
                                       "it): its method, settings and sizes are recorded, on its model where that "
                                       "is a local checkpoint, else on --model or --preset.", show_default=False),
    run_settings: dict = None, method_settings: dict = None,
) -> None:
    """Record methods under torch.profiler, each in a fresh process, into OUTPUT/<method>/."""
    try:
        chosen = [] if configs else resolve(methods or [], all_methods)
        get_preset(run_settings["preset"])
    except (UnknownMethodError, UnknownPresetError) as exc:
        fail_usage(str(exc))
    per_method = None  # from a config: each method with the settings that apply to it
    if configs:
        chosen, per_method, run_settings = _from_configs(configs, methods or [], method_settings, run_settings)
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
    if per_method is None:
        chosen, overrides = options.apply(chosen, method_settings)
        per_method = [(m, overrides) for m in chosen]
    console = Console(stderr=True)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            observer = _ProgressObserver(progress, len(chosen))
            outcomes = [o for m, overrides in _batched(per_method)
                        for o in runner.record(m, RunSettings.from_options(run_settings, method="",
                                                                           overrides=overrides), output, observer)]
    except KeyboardInterrupt:
        console.print("[yellow]interrupted[/]: the run in progress is marked 'interrupted'; complete runs are kept")
        raise typer.Exit(Exit.INTERRUPTED)
    statuses = {o.status for o in outcomes}
    if statuses & {"failed", "oom"}:
        raise typer.Exit(Exit.FAILED)
    if "unsupported" in statuses:
        raise typer.Exit(Exit.UNSUPPORTED)


def _batched(per_method: list) -> list[tuple[list[Method], dict]]:
    """Methods that share their settings recorded in one call (the matrix runs as one), the others apart."""
    groups: list[tuple[list[Method], dict]] = []
    for method, overrides in per_method:
        if groups and groups[-1][1] == overrides:
            groups[-1][0].append(method)
        else:
            groups.append(([method], overrides))
    return groups


def _has_weights(directory: Path) -> bool:
    return any(directory.glob("*.safetensors")) or any(directory.glob("pytorch_model*.bin"))


def _from_configs(configs: list[Path], named: list[str], method_settings: dict, run_settings: dict):
    """What the config files say, as a recording takes it: the methods, each with the settings that apply to it,
    and the run settings (the config's sizes; its model where its weights are here, else --model or the preset)."""
    # only with --config: the config readers (YAML) stay out of a plain record's start
    from profkit.cli.estimate_cmd import from_configs
    from profkit.configs.plan import applicable

    chosen, given, found, _, _, notes = from_configs(configs, named, method_settings, run_settings,
                                                     run_settings["nproc"])
    model = found["model_path"]
    err = Console(stderr=True)
    if model is not None and not _has_weights(Path(model)):
        instead = run_settings["model_path"] or f"preset {run_settings['preset']}"
        err.print(f"[yellow]note:[/] the config's model is a configuration only here, without weights: recorded on "
                  f"{escape(str(instead))}, with the config's method, settings and sizes (--model DIR records a "
                  "checkpoint of your own)", highlight=False)
        model = run_settings["model_path"]
    for note in notes:
        err.print(f"[dim]{escape(note)}[/]", highlight=False)
    run_settings = {**run_settings, "model_path": model, "batch_size": found["batch_size"], "seq_len": found["seq_len"]}
    return chosen, [(m, applicable(METHODS[m.name], given)[0]) for m in chosen], run_settings
