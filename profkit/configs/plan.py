"""From what the config files say to what an estimate takes: the methods with their settings, the model's
directory, the batch and sequence, the ranks and the stack, each from the files unless the command line gives it
(the command line wins, and a note says so)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from profkit.configs.files import read_configs
from profkit.configs.models import resolve_model
from profkit.configs.reading import ConfigError, ConfigReading
from profkit.core.methods import OverrideError, get_method, with_overrides
from profkit.core.stack import Stack


@dataclass
class ConfigPlan:
    reading: ConfigReading
    methods: list  # core.methods.Method
    given: dict  # the settings the files and the command line give (with_overrides' names)
    model_path: str | None
    batch_size: int | None
    seq_len: int | None
    world_size: int | None
    stack: Stack
    notes: list[str] = field(default_factory=list)


def plan(paths: list[Path], named: list[str], cli_settings: dict, cli_model: Path | None, cli_batch: int | None,
         cli_seq: int | None, cli_world: int | None) -> ConfigPlan:
    """``named``: methods named on the command line instead of the files' own (the files' settings where they
    apply); ``cli_*``: what the command line gives, None where it gives nothing."""
    reading = read_configs(paths)
    notes = list(reading.notes)
    given = dict(reading.settings)
    for name, value in cli_settings.items():
        if name in given and given[name] != value:
            notes.append(f"--{name.replace('_', '-')} {value} given: over the config's {given[name]}")
        given[name] = value
    methods = [method_with_settings(name, given, notes) for name in (named or [reading.method])]
    model_path, model_from = None, ""
    if cli_model is not None:
        model_path = str(cli_model)
    elif reading.model:
        directory, model_from = resolve_model(reading.model, Path(paths[0]).parent)
        model_path = str(directory.resolve())
        notes.insert(0, f"model {reading.model}: from {model_from}")
    for flag, cli, said in (("--batch-size", cli_batch, reading.batch_size), ("--seq-len", cli_seq, reading.seq_len),
                            ("--world-size", cli_world, reading.world_size)):
        if cli is not None and said is not None and cli != said:
            notes.append(f"{flag} {cli} given: over the config's {said}")
    parts = {k: v for k, v in reading.stack.items()}
    stack = Stack.from_parts(parts, "config " + ", ".join(Path(p).name for p in reading.files)) if parts else None
    return ConfigPlan(reading, methods, given, model_path, cli_batch or reading.batch_size,
                      cli_seq or reading.seq_len, cli_world or reading.world_size, stack, notes)


def applicable(method, given: dict) -> tuple[dict, list[str]]:
    """The settings of ``given`` that apply to ``method`` (with_overrides' names), and each other one with why not."""
    applied, skipped = {}, []
    for key, value in given.items():
        try:
            with_overrides(method, **applied, **{key: value})
        except OverrideError as exc:
            skipped.append(f"{key} ({exc})")
            continue
        applied[key] = value
    return applied, skipped


def method_with_settings(name: str, given: dict, notes: list[str]):
    """The registry's method with every setting that applies to it; those that do not are named."""
    try:
        method = get_method(name)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    applied, skipped = applicable(method, given)
    if skipped:
        notes.append(f"{name}: not applied: " + "; ".join(skipped))
    # named by its method alone: the files it came from are named beside the estimate
    return replace(with_overrides(method, **applied), variant="")
