"""A command-line option as data. The settings dataclasses (``RunSettings``' fields, ``methods.SETTINGS``) carry
one each; ``profkit.cli.options`` turns them into typer options and ``RunSettings.to_argv`` back into words, so
a setting is declared once and the command line, its help and the report's reproduction command follow."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommandOption:
    flag: str  # "--lora-rank"; a bool becomes "--flag/--no-flag"
    help: str
    type: type  # int, float, str, bool or pathlib.Path (a path is stored resolved, as a string)
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()  # a value outside them is refused with the valid ones named
    panel: str | None = None  # the help's section
    # An expert's override of what the stack derives (profkit.predict.mechanisms): accepted, not in --help.
    hidden: bool = False

    def words(self, value) -> list[str]:
        """The command-line words that set ``value``."""
        if self.type is bool:
            return [self.flag if value else f"--no-{self.flag[2:]}"]
        return [self.flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
