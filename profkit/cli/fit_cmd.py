from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.cli import options
from profkit.cli.common import TableOrJson as Format, fail_usage, model_label, parse_budget
from profkit.cli.estimate_cmd import CONFIG_HELP, STACK_HELP, find_gpu, from_configs, read_stack, workload_settings
from profkit.core.exitcodes import Exit
from profkit.core.methods import METHODS, UnknownMethodError, resolve
from profkit.core.units import human_bytes

EPILOG = (f"Exit codes: 0 at least one method fits; {Exit.FAILED.value} nothing fits (the smallest setting and its "
          "peak are named); 2 bad arguments (unknown method, GPU or preset, a malformed budget).")


@options.run_options("preset", "model_path", "batch_size", "seq_len")
def fit(
    methods: list[str] = typer.Argument(None, help="Training methods (default: each that applies: on one rank the "
                                        "unsharded ones, on several every one).", show_default=False),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="The GPU, e.g. RTX-4090, A100-SXM4-80GB (`profkit methods "
                                      "--gpus` lists them)."),
    budget: Optional[str] = typer.Option(None, help="Or the device's memory, e.g. 24GiB, 16GB."),
    margin: float = typer.Option(0.05, min=0.0, max=0.5, help="Left free: this share of the device."),
    world_size: int = typer.Option(1, min=1, help="Ranks: ZeRO and FSDP shard across them."),
    effective_batch: Optional[int] = typer.Option(None, min=1, help="Samples per optimizer step, every rank "
                                                  "together: kept with gradient accumulation."),
    vary: Optional[str] = typer.Option(None, help="Also search each method's variants in these, comma-separated: "
                                       "optimizer (AdamW, 8-bit, paged), loss (chunked), offload (sharded methods)."),
    device: str = typer.Option("cuda", help="Target: cuda or cpu (with --budget)."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    stack_text: Optional[str] = typer.Option(None, "--stack", help=STACK_HELP),
    configs: list[Path] = typer.Option(None, "--config", help=CONFIG_HELP, show_default=False),
    run_settings: dict = None,
) -> None:
    """The largest micro-batch and the longest sequence that fit a GPU or a memory budget, per method: each
    boundary is where the full estimate of a setting fits and one step past it does not (the allocations of a few
    estimated settings scaled exactly, not the model traced at every point). With --gpu, the step time predicted
    at the largest batch ranks the methods."""
    if (gpu is None) == (budget is None):
        fail_usage("give the device: --gpu NAME or --budget SIZE (one of them)")
    if device not in ("cpu", "cuda"):
        fail_usage(f"unknown device {device!r}; valid: cpu, cuda")
    if effective_batch and effective_batch % world_size:
        fail_usage(f"--effective-batch {effective_batch} is not a multiple of --world-size {world_size}: each rank "
                   "takes an equal share")
    target_gpu = find_gpu(gpu, device) if gpu else None
    device_bytes = target_gpu.memory_bytes if target_gpu else parse_budget(budget)
    stack_first, given = None, {}
    if configs:
        chosen, given, run_settings, world_size, stack_first, _ = from_configs(configs, methods or [], {},
                                                                               run_settings, world_size)
    else:
        try:
            chosen = resolve(methods or [], False) if methods else _applicable(world_size)
        except UnknownMethodError as exc:
            fail_usage(str(exc))
        if any(m.kind != "train" for m in chosen):
            fail_usage("fit searches training steps; generation methods: `profkit estimate`")
    settings = workload_settings(run_settings).resolved()
    stack = read_stack(stack_text, stack_first)
    from profkit.predict.fit import Device, fit_methods, variants  # heavy: torch; `--help` starts without it

    if vary:
        try:
            chosen = variants(chosen, [v.strip() for v in vary.split(",") if v.strip()])
        except ValueError as exc:
            fail_usage(str(exc))
    room = Device(device_bytes, margin, target_gpu.key if target_gpu else human_bytes(device_bytes))
    err = Console(stderr=True)
    with err.status("") as status:
        rows = fit_methods(chosen, settings, room, device, world_size, stack, given, target_gpu, effective_batch,
                           progress=lambda text: status.update(escape(text)))
    fitting = [r for r in rows if "refused" not in r and (r["accumulated"].micro if effective_batch
                                                          else r["batch"].largest)]
    if fmt is Format.json:
        typer.echo(json.dumps({"stack": stack.to_json(), "device": _device_json(room), "methods":
                               [_row_json(r) for r in rows]}, indent=2))
    else:
        Console().print(f"stack: {stack.describe()}", highlight=False, soft_wrap=False)
        _print(rows, room, settings, world_size, effective_batch)
    if not fitting:
        raise typer.Exit(Exit.FAILED)


def _applicable(world_size: int):
    """On one rank the methods that do not shard (sharding needs ranks to shard across); on several, every one."""
    return [m for m in METHODS.values() if m.kind == "train" and (world_size > 1 or not m.sharded)]


def _device_json(room) -> dict:
    return {"name": room.name, "device_bytes": room.device_bytes, "margin": room.margin,
            "usable_bytes": room.usable_bytes}


def _boundary_json(b) -> dict:
    return {"dimension": b.dimension, "fixed": b.fixed, "largest": b.largest, "at": b.at,
            "one_step_past": b.past, "searched": b.searched, "limit": b.limit,
            "settings_checked": b.points}


def _row_json(r: dict) -> dict:
    if "refused" in r:
        return {"method": r["method"], "refused": r["refused"]}
    out = {"method": r["method"], "largest_batch": _boundary_json(r["batch"]),
           "longest_sequence": _boundary_json(r["sequence"])}
    if "accumulated" in r:
        a = r["accumulated"]
        out["effective_batch"] = {"effective": a.effective, "micro_batch": a.micro, "accumulation": a.accumulation,
                                  "method": a.method.label, "check": a.check,
                                  "micro_batch_boundary": _boundary_json(a.boundary)}
    if "step_time" in r:
        key = "step_time_at_effective_batch" if "accumulated" in r else "step_time_at_largest_batch"
        out[key] = r["step_time"].to_json()
    return out


def _holder(check: dict | None) -> str:
    """The category holding most at a check's peak."""
    if not check or not check.get("at_peak"):
        return "-"
    name, nbytes = max(check["at_peak"].items(), key=lambda kv: kv[1])
    return f"{name} {human_bytes(nbytes)}"


def _print(rows: list[dict], room, settings, world_size: int, effective: int | None) -> None:
    out = Console()
    fitting = [r for r in rows if "refused" not in r and (r["accumulated"].micro if effective else r["batch"].largest)]
    timed = all("step_time" in r for r in fitting) and fitting
    if timed:
        fitting.sort(key=lambda r: -r["step_time"].tokens_per_s)
    t = Table(title=f"What fits {room.name} ({human_bytes(room.usable_bytes)} usable: {room.margin:.0%} left "
                    f"free)", caption=f"{model_label(settings)}"
                                      + (f", {world_size} ranks" if world_size > 1 else ""))
    t.add_column("method", no_wrap=True)
    t.add_column(f"batch at {settings.seq_len}", justify="right")
    t.add_column(f"seq at batch {settings.batch_size}", justify="right")
    t.add_column("memory", justify="right")  # a header narrower than the figures: never cut at 80 columns
    if effective:
        t.add_column(f"{effective} as", justify="right")
    if timed:
        t.add_column("tokens/s", justify="right")
    for r in fitting:
        b, s = r["batch"], r["sequence"]
        used = b.at["device_used_bytes"] if b.at["device_used_bytes"] is not None else b.at["peak_bytes"]
        cells = [r["method"], f"{b.largest:,}" + ("+" if b.past is None else ""),
                 "-" if s.largest is None else f"{s.largest:,}" + ("+" if s.past is None else ""), human_bytes(used)]
        if effective:
            a = r["accumulated"]
            cells.append(f"{a.micro} x {a.accumulation}" + (f" x {world_size}" if world_size > 1 else ""))
        if timed:
            cells.append(f"{r['step_time'].tokens_per_s:,.0f}")
        t.add_row(*cells)
    if fitting:
        out.print(t)
    for r in fitting:
        b = r["batch"]
        if b.past is not None:
            out.print(f"[dim]{r['method']}: batch {b.largest + 1} does not fit"
                      + (f" (a request of {human_bytes(b.past['failed_request_bytes'])} finds no room)"
                         if b.past.get("failed_request_bytes") else "")
                      + f"; most held by {_holder(b.past)}[/]", highlight=False)
    unfit = [r for r in rows if "refused" not in r and not r["batch"].largest]
    if unfit and not fitting:
        smallest = min(unfit, key=lambda r: r["batch"].past["peak_bytes"])
        out.print(f"[red]Nothing fits {escape(room.name)}.[/] The smallest setting, {smallest['method']} at batch 1 x "
                  f"{settings.seq_len}, peaks at {human_bytes(smallest['batch'].past['peak_bytes'])} allocated"
                  + (f" ({human_bytes(smallest['batch'].past['device_used_bytes'])} in nvidia-smi)"
                     if smallest["batch"].past["device_used_bytes"] else "")
                  + f"; most held by {_holder(smallest['batch'].past)}", highlight=False)
    elif unfit:
        out.print(f"[dim]not even batch 1 at {settings.seq_len} tokens: {', '.join(r['method'] for r in unfit)}[/]",
                  highlight=False)
    if effective:
        held = [r["method"] for r in rows if "refused" not in r and r["batch"].largest and not r["accumulated"].micro]
        if held:
            out.print(f"[dim]fit a batch at once but not one sample a micro-batch with the accumulated gradients held "
                      f"through the next forward: {', '.join(held)}[/]", highlight=False)
        out.print(f"[dim]{effective} as: micro-batch x accumulation steps"
                  + (" x ranks" if world_size > 1 else "") + ", the largest micro-batch that divides it and fits"
                  + (", ranked by tokens/s at it" if timed else "") + "[/]", highlight=False)
    for r in rows:
        if "refused" in r:
            out.print(f"[dim]not searched ({escape(r['refused'])})[/]", highlight=False)
    searched = {b.searched.split(" (")[0] for r in rows if "refused" not in r for b in (r["batch"], r["sequence"])}
    out.print("[dim]memory: what nvidia-smi would show at the largest batch (the allocated peak on the CPU)[/]",
              highlight=False)
    out.print("[dim]note: each boundary is a setting whose estimate fits and one step past it (a batch of one more, "
              "8 more tokens) that does not; + : still fits at the search's limit (the model's longest sequence)"
              + (f"; searched: {'; '.join(sorted(searched))}" if searched else "") + "[/]", highlight=False)
