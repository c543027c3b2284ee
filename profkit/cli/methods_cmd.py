from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from profkit.core.methods import METHODS


def methods(as_json: bool = typer.Option(False, "--json", help="Print the registry as JSON.")) -> None:
    """List the methods profkit can record, with their settings."""
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
