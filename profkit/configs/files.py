"""Reading one or several config files together: each recognised by its keys and read by its framework's reader
(``configs.formats``), the files they name read beside them, the parts merged (two files that set one thing
differently exit naming both) and the method assembled from what they say."""

from __future__ import annotations

from pathlib import Path

from profkit.configs.formats import read_part
from profkit.configs.reading import ConfigError, ConfigReading, Part, load


def read_configs(paths: list[Path]) -> ConfigReading:
    """Read every file (and the DeepSpeed or accelerate files they name, when found beside them), merge what they
    say and assemble the method. ``ConfigError`` for a file that cannot be read or two that contradict."""
    parts: list[Part] = []
    queue = [Path(p) for p in paths]
    seen: set[Path] = set()
    while queue:
        path = queue.pop(0)
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        part = read_part(path, load(path))
        parts.append(part)
        for name in part.refers_to:
            found = _referred(path, name, [Path(p) for p in paths])
            if found is None:
                part.notes.append(f"{path.name}: names {name}, not found beside it; give it with another --config "
                                  "for its settings (its stage, offload and precision)")
            else:
                queue.append(found)
    return _merge(parts)


def _referred(path: Path, name: str, given: list[Path]) -> Path | None:
    """A file another names: given on the command line already (by its name), or relative to the naming file's
    folder or the current one, or found by its own name beside it."""
    target = Path(name)
    if any(g.name == target.name for g in given):
        return next(g for g in given if g.name == target.name)  # read once: the reader skips what it has seen
    for candidate in (path.parent / target, Path.cwd() / target, path.parent / target.name):
        if candidate.is_file():
            return candidate
    return None


SCALARS = ("adapter", "checkpointing", "sharding", "model", "batch_size", "seq_len", "world_size", "half",
           "loaded_in")


def _merge(parts: list[Part]) -> ConfigReading:
    merged: dict = {}
    settings: dict = {}
    stack: dict = {}
    where: dict = {}
    for part in parts:
        for name in SCALARS:
            if getattr(part, name) is not None:
                _agree(merged, where, name, getattr(part, name), part, part.origin.get(name, name))
        for name, value in part.settings.items():
            _agree(settings, where, name, value, part, part.origin.get(f"settings.{name}", name), "settings.")
        for name, value in part.stack.items():
            _agree(stack, where, name, value, part, part.origin.get(f"stack.{name}", name), "stack.")
    notes = [n for p in parts for n in p.notes]
    method = _method(merged, settings, notes)
    return ConfigReading(files=[p.path for p in parts], frameworks=[p.framework for p in parts], method=method,
                         settings=settings, model=merged.get("model"), batch_size=merged.get("batch_size"),
                         seq_len=merged.get("seq_len"), world_size=merged.get("world_size"), stack=stack,
                         notes=notes, unknown=[f"{Path(p.path).name}: {k}" for p in parts for k in p.unknown])


def _agree(values: dict, where: dict, name: str, value, part: Part, key: str, kind: str = "") -> None:
    """Two files that set one thing must agree; the second names the first."""
    if name in values and values[name] != value:
        first_path, first_key = where[kind + name]
        raise ConfigError(f"{part.path}: {key} = {value!r} contradicts {first_path}: {first_key} = "
                          f"{values[name]!r}")
    if name not in values:
        values[name] = value
        where[kind + name] = (part.path, key)


def _method(merged: dict, settings: dict, notes: list[str]) -> str | None:
    """The registry's method for what the files say, and its precision."""
    adapter = merged.get("adapter") or "none"
    name = {"none": "full", "lora": "lora", "qlora": "qlora"}[adapter]
    sharding = merged.get("sharding") or "none"
    if sharding in ("zero2", "zero3"):
        name += "_" + sharding
    elif sharding == "zero1":
        name += "_zero2"
        notes.append("ZeRO-1 estimated as ZeRO-2: ZeRO-1 partitions the optimizer state only, so on several ranks "
                     "its gradients are each rank's whole, more than this estimate holds")
    elif sharding == "fsdp":
        name += "_fsdp"
    if merged.get("checkpointing"):
        name += "_gc"
    if "precision" not in settings:
        settings["precision"] = _precision(adapter, sharding, merged.get("half"), merged.get("loaded_in"))
    return name


def _precision(adapter: str, sharding: str, half: str | None, loaded_in: str | None) -> str:
    """profkit's precision for a mixed precision asked for (``half``) over weights loaded in ``loaded_in``.
    Adapters: a half-precision frozen base, the adapters in fp32 (peft's autocast_adapter_dtype), autocast (mixed).
    Full training: weights loaded in half precision and no engine keeping fp32 masters train in it (pure); loaded
    in fp32, autocast over them (amp); DeepSpeed's and FSDP's mixed precision keep fp32 masters (mixed)."""
    dtype = half or (loaded_in if loaded_in in ("bf16", "fp16") else None)
    if dtype is None:
        return "fp32" if loaded_in == "fp32" else "auto"
    if adapter != "none" or sharding in ("zero1", "zero2", "zero3", "fsdp"):
        return f"{dtype}-mixed"
    if loaded_in == dtype:
        return "bf16-pure"  # pure fp16 holds the same bytes: every tensor 2 bytes (only bf16 is modelled)
    return f"{dtype}-amp"
