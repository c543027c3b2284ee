"""Helpers shared by the CLI commands: usage errors and human units."""

from __future__ import annotations

from enum import Enum
from typing import NoReturn

import typer
from rich.console import Console

EXIT_USAGE = 2


def fail_usage(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(EXIT_USAGE)


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"
