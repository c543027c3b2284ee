"""Helpers shared by the CLI commands: usage errors and human units."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from profkit.core.bundled import cache_dir
from profkit.core.exitcodes import Exit
from profkit.core.units import parse_bytes


def fail_usage(message: str) -> NoReturn:
    Console(stderr=True).print(f"[red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(Exit.USAGE)


def model_label(settings) -> str:
    """The model as the user named it: a preset, a local directory, or a model id profkit's catalogue resolved
    (its config kept under profkit's cache as ``org--name``), never that cache's path."""
    if not settings.model_path:
        return settings.preset
    path = Path(settings.model_path)
    return path.name.replace("--", "/") if path.parent == cache_dir() / "models" else str(settings.model_path)


def parse_budget(budget: str | None) -> int | None:
    """``--budget`` in bytes (None: none given); a bad size is a usage error that says how to write one."""
    if budget is None:
        return None
    try:
        return parse_bytes(budget)
    except ValueError as exc:
        fail_usage(f"--budget: {exc}")


class Format(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"
    markdown = "markdown"


class TableOrJson(str, Enum):
    """The formats of a command whose one result has no flat table (fit, recommend)."""

    table = "table"
    json = "json"


def numbered_if_long(names: list[str], room: int) -> dict[str, str]:
    """Each name as a table's column names it: itself where every name fits in ``room`` characters, otherwise
    ``#1``, ``#2``... for all (the caller lists what each number stands for), so that a long name is never cut."""
    fits = max((len(n) for n in names), default=0) <= room
    return {n: n if fits else f"#{i}" for i, n in enumerate(names, 1)}


def chunks(names: list[str], width: int, label_width: int = 21, column_width: int = 12) -> list[list[str]]:
    """Split columns into tables that each fit the terminal: a column is as wide as its name (names are never
    truncated) or ``column_width``, whichever is wider, plus rich's borders and padding."""
    out: list[list[str]] = []
    used = label_width + 4
    for name in names:
        need = max(column_width, len(str(name))) + 3
        if out and out[-1] and used + need <= width:
            out[-1].append(name)
            used += need
        else:
            out.append([name])
            used = label_width + 4 + need
    return out or [[]]


def labelled_chunks(names: list[str], label: dict[str, str], width: int, column_width: int = 12) -> list[list[str]]:
    """``chunks`` over the names as their columns are labelled (``numbered_if_long``)."""
    by_label = {label[n]: n for n in names}
    return [[by_label[x] for x in c] for c in chunks(list(by_label), width, column_width=column_width)]
