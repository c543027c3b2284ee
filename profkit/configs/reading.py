"""What a config file says (``Part``) and what several say together (``ConfigReading``); parsing a file (a syntax
error names the file and line) and checking a value's type (a wrong one names the key and the type expected).

Every key is accounted for: read into a setting, named in a note with what was assumed instead (a key that
changes memory or time but that profkit does not model), known not to matter (paths, logging, schedules), or listed
as unknown."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config that cannot be read, or two that contradict each other: the message names the file, the key and
    what is wrong."""


@dataclass
class Part:
    """What one file says. ``None``: it does not say."""

    path: str
    framework: str
    adapter: str | None = None  # none, lora, qlora
    checkpointing: bool | None = None
    sharding: str | None = None  # none, ddp, zero0, zero1, zero2, zero3, fsdp
    settings: dict = field(default_factory=dict)  # with_overrides' names
    model: str | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    world_size: int | None = None
    stack: dict = field(default_factory=dict)  # core.stack parts: loop, fsdp, package versions
    half: str | None = None  # bf16, fp16 or None: the mixed precision it asks for
    loaded_in: str | None = None  # the dtype the model is loaded in: bf16, fp16, fp32
    refers_to: list[str] = field(default_factory=list)  # other config files it names (a DeepSpeed JSON)
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    origin: dict = field(default_factory=dict)  # what it set -> the key that set it

    def set(self, what: str, value, key: str) -> None:
        """Record ``what`` (an attribute, or ``settings.<name>``, ``stack.<part>``) from ``key``."""
        if value is None:
            return
        if what.startswith("settings."):
            self.settings[what[9:]] = value
        elif what.startswith("stack."):
            self.stack[what[6:]] = value
        else:
            setattr(self, what, value)
        self.origin[what] = key

    def note(self, key: str, text: str) -> None:
        self.notes.append(f"{Path(self.path).name}: {key}: {text}")


@dataclass
class ConfigReading:
    """What the files say together, and the registry method it comes to."""

    files: list[str]
    frameworks: list[str]
    method: str | None
    settings: dict
    model: str | None
    batch_size: int | None
    seq_len: int | None
    world_size: int | None
    stack: dict
    notes: list[str]
    unknown: list[str]

    def to_json(self) -> dict:
        return dict(self.__dict__)


# ----------------------------------------------------------------------------------------------- parsing
def load(path: Path) -> dict:
    """The file as a mapping; a syntax error names the file and the line."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (YAML or JSON expected)") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}, line {exc.lineno}, column {exc.colno}: malformed JSON: {exc.msg}") from None
    else:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise ConfigError(f"{path}{where}: malformed YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a mapping of keys expected at the top, found {type(data).__name__}")
    return data


def expect(path: str, key: str, value, kind):
    """``value`` as ``kind`` (int, bool, str, float, list, dict); a value of another type names the key and the type
    expected. None stays None (a key left empty says nothing). YAML's "true"/"false" strings and "auto" are kept
    where a framework allows them: callers check for them before."""
    if value is None:
        return None
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and value.strip().isdigit():
            return int(value)
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, kind):
        return value
    names = {int: "an integer", bool: "true or false", str: "a string", float: "a number", list: "a list",
             dict: "a mapping"}
    raise ConfigError(f"{path}: {key}: expected {names[kind]}, got {value!r}")
