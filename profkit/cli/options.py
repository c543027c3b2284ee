"""Command-line options made from the settings dataclasses: each ``CommandOption`` that a ``RunSettings`` field or
a method setting (``core.methods.SETTINGS``) declares becomes a typer option of the commands that take it, so a
new setting is declared once, in ``core``, and every command, its help and ``RunSettings.to_argv`` follow."""

from __future__ import annotations

import functools
import inspect
from typing import Callable, Optional

import typer

from profkit.cli.common import fail_usage
from profkit.core.methods import SETTINGS, Method, OverrideError, with_overrides
from profkit.core.options import CommandOption
from profkit.core.settings import RunSettings


def _typer_option(option: CommandOption, default, help_prefix: str):
    declared = (f"{option.flag}/--no-{option.flag[2:]}",) if option.type is bool else (option.flag,)
    bounds = {k: v for k, v in (("min", option.minimum), ("max", option.maximum)) if v is not None}
    return typer.Option(default, *declared, help=help_prefix + option.help, rich_help_panel=option.panel,
                        show_default=default is not None, hidden=option.hidden, **bounds)


def with_options(options: dict[str, tuple[CommandOption, object]], into: str, help_prefix: str = "") -> Callable:
    """Add one option per entry (name -> (option, default)) to a typer command, which receives their values as
    the dict ``into`` instead of one parameter each."""
    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != into]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[option.type],
                                   default=_typer_option(option, default, help_prefix))
                 for name, (option, default) in options.items()]

        @functools.wraps(command)
        def command_with_options(**kwargs):
            values = {name: kwargs.pop(name) for name in options}
            for name, (option, _) in options.items():
                if option.choices and values[name] is not None and values[name] not in option.choices:
                    fail_usage(f"{option.flag} {values[name]!r}: valid values are {', '.join(option.choices)}")
            return command(**kwargs, **{into: values})

        command_with_options.__signature__ = signature.replace(parameters=own + added)
        return command_with_options
    return decorate


def run_options(*names: str, help_prefix: str = "") -> Callable:
    """``RunSettings``' options (all of them, or those named), handed to the command as ``run_settings``."""
    every = RunSettings.options()
    return with_options({n: every[n] for n in (names or every)}, "run_settings", help_prefix)


# Not given (None) means the registry's value, so each method keeps its own default.
method_options = with_options({name: (s.option, None) for name, s in SETTINGS.items()}, "method_settings")


def apply(methods: list[Method], method_settings: dict) -> tuple[list[Method], dict]:
    """The methods with the settings given, and those settings (for ``RunSettings.overrides``); exits 2 with the
    reason when a setting makes no sense for a method."""
    given = {k: v for k, v in method_settings.items() if v is not None}
    try:
        return [with_overrides(m, **given) for m in methods], given
    except OverrideError as exc:
        fail_usage(str(exc))
