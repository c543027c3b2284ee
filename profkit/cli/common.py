"""Helpers shared by the CLI commands: usage errors and human units."""

from __future__ import annotations

from enum import Enum
from typing import NoReturn

import typer

from profkit.exitcodes import Exit
from rich.console import Console



def fail_usage(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(Exit.USAGE)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


def chunks(items: list, width: int, label_width: int = 21, column_width: int = 12) -> list[list]:
    """Columns per table so that each table fits the terminal."""
    per = max(2, (width - label_width - 4) // (column_width + 3))
    return [items[i:i + per] for i in range(0, len(items), per)] or [[]]
