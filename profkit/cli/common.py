"""Helpers shared by the CLI commands: usage errors and human units."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

EXIT_USAGE = 2


def fail_usage(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(EXIT_USAGE)
