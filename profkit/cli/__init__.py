"""The ``profkit`` command line. Commands only parse arguments and call library functions."""

from __future__ import annotations

import inspect
import os

import typer

from profkit.cli import (breakdown_cmd, estimate_cmd, fit_cmd, methods_cmd, recommend_cmd, record_cmd, report_cmd,
                         snapshot_cmd, view_cmd)

app = typer.Typer(
    name="profkit",
    help="Measure where the memory and the time of LLM fine-tuning and serving methods go.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # click's own help: it wraps every option name and line at the terminal's width, where rich's tables cut long
    # option names (--keeps-previous-logits, --no-reshard-after-forward) to an ellipsis at 80 columns.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def summary_line(doc: str | None) -> str:
    """A command's line in ``profkit --help``, whole: click would cut it at 45 characters."""
    text = " ".join(inspect.cleandoc(doc or "").split("\n\n")[0].split())
    return text.split(". ")[0].rstrip(".") + "."


COMMANDS = (("methods", methods_cmd.methods, None), ("record", record_cmd.record, record_cmd.EPILOG),
            ("breakdown", breakdown_cmd.breakdown, breakdown_cmd.EPILOG),
            ("estimate", estimate_cmd.estimate, estimate_cmd.EPILOG), ("fit", fit_cmd.fit, fit_cmd.EPILOG),
            ("recommend", recommend_cmd.recommend, recommend_cmd.EPILOG),
            ("snapshot", snapshot_cmd.snapshot, snapshot_cmd.EPILOG),
            ("report", report_cmd.report, None), ("view", view_cmd.view, None))
for name, function, epilog in COMMANDS:
    app.command(name, epilog=epilog, short_help=summary_line(function.__doc__))(function)


def main() -> None:
    # transformers' warnings about a config's own quirks (a token id outside the vocabulary) are not the user's
    # business at the terminal; a user who wants them sets the variable.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    app()
