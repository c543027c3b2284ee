from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from profkit.cli import options
from profkit.cli.common import Format, fail_usage, labelled_chunks, model_label, numbered_if_long
from profkit.configs import ConfigError
from profkit.configs.plan import plan
from profkit.core import gpus
from profkit.core.methods import METHODS, Method, UnknownMethodError, resolve
from profkit.core.presets import UnknownPresetError, get_preset
from profkit.core.settings import RunSettings
from profkit.core.stack import Stack, StackError
from profkit.core.units import human_bytes

STACK_HELP = ("The software the run uses, where it is not what is installed here: a named stack (trainer, axolotl, "
              "litgpt, torchtune, llama-recipes, ...; `profkit methods --stacks`) or part=value pairs "
              "(transformers=4.48.1,bitsandbytes=0.43.3,loop=litgpt). Its library versions and loop decide the "
              "mechanisms they imply (the loss's form, kept logits, caches, legacy buffers).")
EPILOG = "Exit codes: 0 estimated; 2 bad arguments (unknown method or preset, unreadable model, a method not modelled)."
TRAINING = [m.name for m in METHODS.values() if m.kind == "train"]
INFERENCE = [m.name for m in METHODS.values() if m.kind == "infer"]


def workload_settings(run_settings: dict) -> RunSettings:
    """Validated settings for an estimate (shared with ``recommend``); exits 2 on bad input. Sizes left unset are
    the preset's for each method's kind (a generation's batch is 1)."""
    try:
        get_preset(run_settings["preset"])
    except UnknownPresetError as exc:
        fail_usage(str(exc))
    model = run_settings.get("model_path")
    if model is not None and not (model / "config.json").is_file():
        fail_usage(f"--model {model}: not a readable Hugging Face checkpoint directory (no config.json)")
    return RunSettings.from_options(run_settings, method="")


CONFIG_HELP = ("Your training config (axolotl, torchtune, litgpt, LLaMA-Factory, TRL/Trainer YAML or JSON, peft's "
               "adapter_config.json, DeepSpeed JSON, accelerate YAML); again for another file of the same run. Its "
               "method, settings, model, sizes and stack are estimated; options given beside it win.")


def from_configs(paths: list[Path], named: list[str], method_settings: dict, run_settings: dict, world_size: int):
    """What the config files say, as an estimate takes it: the methods, the settings given, the run settings,
    the ranks, the stack they name and the notes on what they say; exits 2 with the file and reason."""
    given_cli = {k: v for k, v in method_settings.items() if v is not None}
    try:
        found = plan(paths, named, given_cli, run_settings.get("model_path"), run_settings.get("batch_size"),
                     run_settings.get("seq_len"), world_size if world_size != 1 else None)
    except ConfigError as exc:
        fail_usage(str(exc))
    if found.reading.unknown:
        Console(stderr=True).print(f"[yellow]warning:[/] keys profkit does not know, not read: "
                                   f"{', '.join(found.reading.unknown)}", highlight=False)
    if found.seq_len is None:
        fail_usage(f"{', '.join(str(p) for p in paths)}: no sequence length set (samples of any length); give "
                   "--seq-len, the longest batch's")
    run_settings = {**run_settings, "model_path": Path(found.model_path) if found.model_path else None,
                    "batch_size": found.batch_size, "seq_len": found.seq_len}
    notes = [f"from {', '.join(Path(p).name for p in found.reading.files)}", *found.notes]
    return found.methods, found.given, run_settings, found.world_size or 1, found.stack, notes


def read_stack(text: str | None, first=None):
    """The stack an estimate assumes: ``first`` (a recorded run's) where it states a part, then ``--stack``'s,
    then the packages installed here; exits 2 naming what ``--stack`` got wrong."""
    try:
        stack = Stack.installed().over(Stack.parse(text)) if text else Stack.installed()
    except StackError as exc:
        fail_usage(f"--stack: {exc}")
    return stack.over(first) if first is not None else stack


def stacked_methods(methods: list[Method], given: dict, stack, settings: RunSettings) -> list[Method]:
    """The methods with what ``stack`` calls for (see ``read_stack``); exits 2 where it is not modelled."""
    from profkit.predict.mechanisms import NotModelled, stacked_run  # heavy: transformers

    try:
        return [method for method, _ in stacked_run(methods, given, stack, settings)]
    except NotModelled as exc:
        fail_usage(str(exc))


def run_estimates(methods: list[Method], settings: RunSettings, device: str, world_size: int, stack=None,
                  given: dict | None = None):
    """The estimates, or exit 2 with the estimator's reason (a method or model it does not model)."""
    from profkit.predict.estimate import EstimateError, estimate_methods  # heavy: torch; other commands start without it

    if device not in ("cpu", "cuda"):
        fail_usage(f"unknown device {device!r}; valid: cpu, cuda")
    try:
        return estimate_methods(methods, settings, device, world_size, stack, given)
    except EstimateError as exc:
        fail_usage(str(exc))
    except (OSError, ValueError) as exc:  # transformers' errors for a config it cannot read or build
        fail_usage(f"cannot build {settings.model_path or settings.preset} on the meta device: {exc}")


@options.run_options("preset", "model_path", "batch_size", "seq_len", "max_new_tokens")
@options.method_options
def estimate(
    methods: list[str] = typer.Argument(None, help=f"Methods: training ({', '.join(TRAINING)}) or generation "
                                        f"({', '.join(INFERENCE)}).", show_default=False),
    all_methods: bool = typer.Option(False, "--all", help="Every training method."),
    world_size: int = typer.Option(1, min=1, help="Ranks: ZeRO and FSDP shard across them; an unsharded method "
                                   "runs as DDP, a replica per rank."),
    device: str = typer.Option("cuda", help="Target: cuda (bf16 autocast, bf16 frozen weights) or cpu (fp32)."),
    gpu: str = typer.Option(None, "--gpu", help=f"Also predict the step time on this GPU (training methods): "
                                               f"{', '.join(gpus.GPUS)}."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    stack_text: str = typer.Option(None, "--stack", help=STACK_HELP),
    configs: list[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    run_settings: dict = None, method_settings: dict = None,
) -> None:
    """Predict each memory category of a method without running it (the model is built on the meta device: no
    weights, no memory). Training: one step. Generation: weights, the KV cache and the peak of generate().
    With --gpu, the step time and tokens/s too (predicted from the step's work and efficiencies measured on
    real GPU traces)."""
    stack_first = None
    if configs:
        chosen, given, run_settings, world_size, stack_first, config_notes = from_configs(
            configs, methods or [], method_settings, run_settings, world_size)
    else:
        try:
            chosen = [m for m in resolve(methods or [], all_methods) if not all_methods or m.kind == "train"]
        except UnknownMethodError as exc:
            fail_usage(str(exc))
        if not chosen:
            fail_usage(f"name at least one method, or --all, or give --config; methods: "
                       f"{', '.join(TRAINING + INFERENCE)}")
        chosen, given = options.apply(chosen, method_settings)
        config_notes = []
    settings = workload_settings(run_settings)
    target = find_gpu(gpu, device)
    stack = read_stack(stack_text, stack_first)
    estimates = run_estimates(chosen, settings, device, world_size, stack, given)
    for e in estimates:
        e.notes[:0] = config_notes
    times = run_step_times(stacked_methods(chosen, given, stack, settings), settings, target, world_size) if target else {}
    from profkit.predict.estimate import at_peak, frame  # heavy: torch (see run_estimates)

    fitting = {e.method: e.on_gpu(target) for e in estimates} if target else {}
    if fmt is Format.json:
        typer.echo(json.dumps([{**e.to_json(), **({"step_time": times[e.method].to_json()} if e.method in times else {}),
                                **({"on_gpu": fitting[e.method]} if e.method in fitting else {})}
                               for e in estimates], indent=2))
    elif fmt is Format.csv:
        typer.echo(frame(estimates).to_csv(index=False), nl=False)
    elif fmt is Format.markdown:
        table = at_peak(estimates).map(lambda b: "-" if b != b else f"{b / 2**20:,.1f}")  # NaN: not given
        typer.echo("## Predicted memory at each method's peak (MiB)\n\n" + table.to_markdown() + "\n")
    else:
        Console().print(f"stack: {stack.describe()}", highlight=False, soft_wrap=False)
        _print(estimates, settings, device, world_size)
        if times:
            _print_times(times, target, estimates, fitting)


def find_gpu(name: str | None, device: str):
    """The GPU --gpu names (None where none is named), or exit 2 with the valid names (shared with ``recommend``)."""
    if name is None:
        return None
    try:
        gpu = gpus.find(name)
    except gpus.UnknownGpu as exc:
        fail_usage(str(exc))
    if device != "cuda":
        fail_usage("--gpu predicts CUDA steps; the runs (or --device) are on the CPU")
    return gpu


def run_step_times(methods: list[Method], settings: RunSettings, gpu, world_size: int) -> dict:
    """Method label (its name and command-line changes, as the estimates name it) -> its predicted StepTime on
    ``gpu`` (training methods); exits 2 with the reason where the meta-device step cannot be run."""
    # heavy: torch and transformers (see run_estimates)
    from profkit.predict.estimate import EstimateError
    from profkit.predict.step_time import predict_run

    out = {}
    for m in methods:
        if m.kind != "train":
            continue
        try:
            out[m.label] = predict_run(m, settings, gpu, world_size)
        except EstimateError as exc:
            fail_usage(str(exc))
    return out


LABEL_WIDTH = 21  # the row labels' column: the longest category name, parameters_quantized, and a space


def _method_labels(out: Console, methods: list[str]) -> dict[str, str]:
    """Each method as the tables' columns name it; where a name does not fit beside the row labels at this width,
    the methods are numbered and what each number stands for is printed first."""
    label = numbered_if_long(methods, out.width - LABEL_WIDTH - 7)
    for method, shown in label.items():
        if shown != method:
            out.print(f"{shown} = {method}", highlight=False)
    return label


def _print_times(times: dict, gpu, estimates, fitting: dict) -> None:
    """The step time on ``gpu``; ``fitting``: each method's ``Estimate.on_gpu`` there."""
    out = Console()
    categories = list(dict.fromkeys(c for st in times.values() for c in st.by_category))
    label = _method_labels(out, list(times))
    for names in labelled_chunks(list(times), label, out.width):
        # The title above the table, not in it: rich wraps a title to the table's width, narrow for one method.
        out.print(f"Predicted step time on {gpu.key} (not measured)", style="italic", highlight=False)
        t = Table(caption="from the step's FLOPs and bytes at efficiencies measured on real GPU traces "
                          "(reports/step-time/); each category's seconds per step")
        t.add_column("", no_wrap=True, min_width=LABEL_WIDTH)
        for n in names:
            t.add_column(label[n], justify="right", no_wrap=True)
        # A lower bound (the host's optimizer step under offload is not predicted) says so in its figures.
        at_least = {n: "≥ " if times[n].lower_bound else "" for n in names}
        t.add_row("[bold]step[/]", *[f"{at_least[n]}{times[n].seconds * 1e3:,.1f} ms" for n in names])
        t.add_row("tokens/s", *[f"{'≤ ' if at_least[n] else ''}{times[n].tokens_per_s:,.0f}" for n in names])
        for c in categories:
            t.add_row(f"  {c}", *[f"{times[n].by_category.get(c, 0.0) * 1e3:,.2f} ms" for n in names])
        t.add_row("GFLOP per step", *[f"{times[n].flop / 1e9:,.1f}" for n in names])
        t.add_row("fits in memory", *[("yes" if fitting[n]["fits"] else "[red]no[/]")
                                      + (f" ({fitting[n]['share']:.0%})" if fitting[n]["fits"]
                                         or fitting[n]["basis"] != "replay" else "") for n in names])
        out.print(t)
    for note in dict.fromkeys(n for st in times.values() for n in st.notes):
        out.print(f"[dim]note: {note}[/]", highlight=False)
    room = next((f["capacity_bytes"] for f in fitting.values() if f["basis"] == "replay"), None)
    if room is not None:
        failed = [f"{m} ({human_bytes(f['failed_request_bytes'])})" for m, f in fitting.items()
                  if f.get("failed_request_bytes") is not None]
        out.print(f"[dim]note: fits in memory: the step replayed through the caching allocator with the "
                  f"{human_bytes(room)} it has on {gpu.key} after the CUDA context; when full it releases its cache "
                  f"and tries again; the percentage is reserved memory's share of that room"
                  + (f"; the request that found no room: {', '.join(failed)}" if failed else "") + "[/]",
                  highlight=False)


def _workload(e) -> str:
    s = e.settings
    if "max_new_tokens" in s:
        return f"generation: batch {s['batch_size']}, prompt {s['seq_len']} + {s['max_new_tokens']} new tokens"
    return f"training: batch {s['batch_size']} x {s['seq_len']}"


def _print(estimates, settings: RunSettings, device: str, world_size: int) -> None:
    from profkit.predict.estimate import at_peak  # heavy: torch (see run_estimates)

    out = Console()
    table = at_peak(estimates)
    caption = (f"{model_label(settings)}, {device}" + (f", {world_size} ranks" if world_size > 1 else "")
               + "; " + "; ".join(dict.fromkeys(_workload(e) for e in estimates)))
    by_method = {e.method: e for e in estimates}
    label = _method_labels(out, list(by_method))
    for names in labelled_chunks(list(by_method), label, out.width):
        chunk = [by_method[n] for n in names]
        t = Table(title="Predicted memory at each method's peak", caption=caption)
        t.add_column("category", no_wrap=True, min_width=LABEL_WIDTH)
        for e in chunk:
            t.add_column(label[e.method], justify="right", no_wrap=True)
        for category, row in table.iterrows():
            row_label = {"peak": "[bold]peak[/] (allocated)", "reserved": "reserved (est.)",
                         "nvidia_smi": "nvidia-smi (est.)", "reserved_lengths_grow": "reserved, lengths grow",
                         "host_offloaded": "host (offloaded)"}.get(category, category)
            t.add_row(row_label, *[human_bytes(row[e.method]) for e in chunk])
        t.add_row("[dim]peak at[/]", *[f"[dim]{e.peak_instant}[/]" for e in chunk])
        out.print(t)
    for note in dict.fromkeys(n for e in estimates for n in e.notes):
        out.print(f"[dim]note: {note}[/]", highlight=False)
    bases: dict[str, list[str]] = {}
    for e in estimates:
        if e.reserved():
            bases.setdefault(e.reserved()["basis"], []).append(e.method)
    if bases:
        from profkit.predict.estimate import (  # heavy: torch (see run_estimates)
            DEVICE_BASIS, GROWING_BASIS, RESERVED_BASIS, reserved_ratios)

        ratios = ", ".join(f"{r:.2f}" for r in reserved_ratios())
        for basis, methods in bases.items():
            text = RESERVED_BASIS[basis].format(ratios=ratios)
            if len(bases) > 1:  # say which methods each basis is for
                text = text.replace("reserved:", f"reserved ({', '.join(methods)}):", 1)
            out.print(f"[dim]note: {text}[/]", highlight=False)
        out.print(f"[dim]note: {DEVICE_BASIS}[/]", highlight=False)
        growing = next((e.reserved_if_lengths_grow() for e in estimates if e.reserved_if_lengths_grow()), None)
        if growing:
            lengths = ", ".join(str(n) for n in growing["lengths"])
            out.print(f"[dim]note: {GROWING_BASIS.format(lengths=lengths)}[/]", highlight=False)
