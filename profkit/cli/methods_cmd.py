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
    table = Table(title="profkit methods")
    for col in ("method", "kind", "adapter", "base weights", "grad. ckpt", "sharding", "lr", "description"):
        table.add_column(col)
    for m in METHODS.values():
        train = m.kind == "train"
        table.add_row(m.name, m.kind, f"LoRA r={m.lora_r}" if m.adapter == "lora" else "-",
                      m.quantization or "model dtype", ("yes" if m.gradient_checkpointing else "no") if train else "-",
                      _sharding(m) if train else "-", f"{m.learning_rate:g}" if train else "-",
                      m.description)
    Console().print(table)


def _sharding(m) -> str:
    return f"ZeRO-{m.zero_stage}" if m.zero_stage else "FSDP2" if m.fsdp else "-"
