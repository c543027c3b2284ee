from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from profkit.configs.models import catalogue
from profkit.core import gpus
from profkit.core.methods import METHODS
from profkit.core.stack import presets


def methods(as_json: bool = typer.Option(False, "--json", help="Print the registry as JSON."),
            stacks: bool = typer.Option(False, "--stacks", help="The named stacks --stack takes instead."),
            models: bool = typer.Option(False, "--models", help="The bundled model configurations --config's "
                                        "model names are found in instead."),
            gpu_table: bool = typer.Option(False, "--gpus", help="The GPUs --gpu takes instead.")) -> None:
    """List the methods profkit can record, with their settings."""
    if stacks or models or gpu_table:
        rows = _stacks() if stacks else _models() if models else _gpus()
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        table = Table(title="named stacks (--stack NAME)" if stacks else "model configurations (catalogue)"
                      if models else "GPUs (--gpu NAME)")
        for column in rows[0] if rows else []:
            table.add_column(column, no_wrap=column in ("name", "id"))
        for row in rows:
            table.add_row(*(str(v) for v in row.values()))
        Console().print(table)
        return
    if as_json:
        typer.echo(json.dumps([m.settings() for m in METHODS.values()], indent=2))
        return
    # A method's name is what the user types: never cut, whatever the terminal's width. The descriptions follow
    # the table in a grid of their own, where they wrap at any width.
    width = max(len(name) for name in METHODS)
    table = Table(title="profkit methods")
    table.add_column("method", no_wrap=True, min_width=width)
    for col in ("kind", "adapter", "weights", "GC", "sharding", "lr"):
        table.add_column(col, no_wrap=True)
    described = Table.grid(padding=(0, 2))
    described.add_column(no_wrap=True, min_width=width)
    described.add_column(ratio=1)
    for m in METHODS.values():
        train = m.kind == "train"
        table.add_row(m.name, m.kind, f"LoRA r={m.lora_r}" if m.adapter == "lora" else "-",
                      m.quantization or "model dtype", ("yes" if m.gradient_checkpointing else "no") if train else "-",
                      _sharding(m) if train else "-", f"{m.learning_rate:g}" if train else "-")
        described.add_row(m.name, m.description)
    console = Console()
    console.print(table)
    console.print(described)


def _sharding(m) -> str:
    return f"ZeRO-{m.zero_stage}" if m.zero_stage else "FSDP2" if m.fsdp else "-"


def _stacks() -> list[dict]:
    return [{"name": name, "parts": ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("what", "source")),
             "what": e["what"]} for name, e in presets().items()]


def _gpus() -> list[dict]:
    return [{"name": g.key, "memory_gib": f"{g.memory_bytes / 2**30:g}", "bf16_tflops": g.tflops.get("bf16", "-"),
             "bandwidth_gb_s": f"{g.bytes_per_s / 1e9:g}"} for g in gpus.GPUS.values()]


def _models() -> list[dict]:
    return [{"id": key, "model_type": e["config"].get("model_type", "?"),
             "layers": e["config"].get("num_hidden_layers", "?"), "licence": e.get("licence", "?")}
            for key, e in catalogue().items()]
