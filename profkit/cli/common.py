"""Helpers shared by the CLI commands: usage errors and human units."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

EXIT_USAGE = 2


def fail_usage(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {message}", highlight=False)
    raise typer.Exit(EXIT_USAGE)


def human_bytes(n: float) -> str:
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
