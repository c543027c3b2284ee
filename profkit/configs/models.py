"""A model named as users name it, resolved without the network: a local directory with a ``config.json``, a
Hugging Face id found in the local Hugging Face cache, or one in profkit's bundled catalogue of the configurations
of models people fine-tune (``data/models/catalogue.json``, each with its source and licence). What is found is a
directory holding its ``config.json``, which is all an estimate reads."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from profkit.configs.reading import ConfigError
from profkit.core.bundled import bundled, cache_dir


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads (HF_HUB_CACHE, HF_HOME/hub, or ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    return home / "hub"


def catalogue() -> dict[str, dict]:
    path = bundled("models/catalogue.json")
    return json.loads(path.read_text()) if path.is_file() else {}


# Words a re-upload or a variant adds to a name without changing a tensor's shape (an instruct or chat tune, a
# base, a dated refresh, a dtype, a format).
VARIANT_WORDS = {"instruct", "base", "chat", "it", "hf", "sft", "fp16", "bf16", "2507", "2506", "2407", "2410",
                 "2501", "checkpoints", "full"}


def _shape_name(model_id: str) -> str:
    """The name after the organisation, without the words of ``VARIANT_WORDS``: the shapes' name."""
    words = model_id.strip().lower().rsplit("/", 1)[-1].split("-")
    return "-".join(w for w in words if w not in VARIANT_WORDS)


def _in_catalogue(name: str) -> tuple[str, dict, str] | None:
    """The entry for ``name``: by its id or an alias; else by its name alone, or its name without the words of a
    variant, where exactly one entry has it (re-uploads keep the name: NousResearch/Llama-3.2-1B is
    meta-llama/Llama-3.2-1B; an instruct tune keeps its base's shapes), said as such."""
    wanted = name.strip().lower()
    by_name, by_shape = [], []
    for key, entry in catalogue().items():
        ids = [n.lower() for n in (key, *entry.get("aliases", []))]
        if wanted in ids:
            return key, entry, ""
        if wanted.rsplit("/", 1)[-1] in (i.rsplit("/", 1)[-1] for i in ids):
            by_name.append((key, entry))
        if _shape_name(wanted) in (_shape_name(i) for i in ids):
            by_shape.append((key, entry))
    if len(by_name) == 1:
        return (*by_name[0], f"{name} matched by its name alone; ")
    if len(by_shape) == 1:
        return (*by_shape[0], f"{name} matched by its name without its variant's words; ")
    return None


def _in_hub_cache(name: str) -> Path | None:
    repo = hub_cache() / ("models--" + name.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip() / "config.json").is_file():
        return snapshots / ref.read_text().strip()
    found = sorted((p for p in snapshots.iterdir() if (p / "config.json").is_file()), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def resolve_model(name: str, beside: Path | None = None) -> tuple[Path, str]:
    """The directory holding ``name``'s config.json and where it was found ("local directory", "Hugging Face cache",
    "profkit's catalogue: <source>"); ``ConfigError`` naming every place looked in."""
    for candidate in (Path(name).expanduser(), *([beside / name] if beside else [])):
        if (candidate / "config.json").is_file():
            return candidate, "local directory"
    if re.fullmatch(r"[\w.-]+/[\w.-]+", name.strip()):
        if (cached := _in_hub_cache(name.strip())) is not None:
            return cached, "Hugging Face cache"
    if (entry := _in_catalogue(name)) is not None:
        key, found, how = entry
        directory = cache_dir() / "models" / key.replace("/", "--")
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "config.json"
        text = json.dumps(found["config"], indent=1, sort_keys=True)
        if not config.is_file() or config.read_text() != text:
            config.write_text(text)
        return directory, f"profkit's catalogue ({how}{key}: {found.get('source', 'source not recorded')})"
    raise ConfigError(f"model {name!r} not found: not a local directory with a config.json, not in the Hugging Face "
                      f"cache ({hub_cache()}), not in profkit's catalogue ({len(catalogue())} models; "
                      "`profkit methods --models` lists them). Give its config.json's directory with --model DIR "
                      "(profkit reads only the configuration, never the weights)")


def find_config(name: str) -> dict | None:
    """The configuration (config.json's contents) of the model ``name`` names, found as ``resolve_model`` finds it;
    None where it is nowhere."""
    try:
        directory, _ = resolve_model(name)
    except ConfigError:
        return None
    return json.loads((directory / "config.json").read_text())
