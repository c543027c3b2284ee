from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from profkit.cli.common import parse_budget
from profkit.core.exitcodes import Exit


def report(
    paths: list[Path] = typer.Argument(..., help="Run directories or directories of runs (traces/)."),
    output: Path = typer.Option(Path("reports/latest"), "--output", "-o", help="Directory for report.md, report.html and PNGs."),
    budget: Optional[str] = typer.Option(None, help="Memory budget, e.g. 8GiB: the at-a-glance table and the answers "
                                                    "put the runs within it first, fastest first."),
) -> None:
    """Write a Markdown + HTML report with plots comparing the runs: the answers first, then the evidence."""
    budget_bytes = parse_budget(budget)
    # matplotlib only here: every other command starts half a second sooner.
    from profkit.report.document import command_line, write_report

    console = Console(stderr=True)
    with console.status("analysing runs and drawing plots"):
        rep = write_report(paths, output, command_line(paths, output, budget), budget_bytes)
    for problem in rep.breakdown.problems:
        console.print(f"[{'red' if problem.fatal else 'yellow'}]{'error' if problem.fatal else 'warning'}:[/] {escape(str(problem))}",
                      highlight=False)
    console.print(f"wrote {rep.markdown_path}, {rep.html_path} and {len(rep.images)} plots", highlight=False)
    if rep.breakdown.failed:
        raise typer.Exit(Exit.FAILED)
