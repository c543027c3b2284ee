"""Where profkit's bundled data lies and where it caches what it builds (preset checkpoints). No torch."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path


def bundled(name: str) -> Path:
    return Path(str(resources.files("profkit") / "data" / name))


def cache_dir() -> Path:
    return Path(os.environ.get("PROFKIT_CACHE", Path.home() / ".cache" / "profkit"))
