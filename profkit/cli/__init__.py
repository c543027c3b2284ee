"""The ``profkit`` command line. Commands only parse arguments and call library functions."""

from __future__ import annotations

import os

import typer

from profkit.cli import (breakdown_cmd, estimate_cmd, methods_cmd, recommend_cmd, record_cmd, report_cmd,
                         snapshot_cmd, view_cmd)

app = typer.Typer(
    name="profkit",
    help="Measure where the memory and the time of LLM fine-tuning and serving methods go.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.command("methods")(methods_cmd.methods)
app.command("record", epilog=record_cmd.EPILOG)(record_cmd.record)
app.command("breakdown", epilog=breakdown_cmd.EPILOG)(breakdown_cmd.breakdown)
app.command("estimate", epilog=estimate_cmd.EPILOG)(estimate_cmd.estimate)
app.command("recommend", epilog=recommend_cmd.EPILOG)(recommend_cmd.recommend)
app.command("snapshot", epilog=snapshot_cmd.EPILOG)(snapshot_cmd.snapshot)
app.command("report")(report_cmd.report)
app.command("view")(view_cmd.view)


def main() -> None:
    # transformers' warnings about a config's own quirks (a token id outside the vocabulary) are not the user's
    # business at the terminal; a user who wants them sets the variable.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    app()
