"""The browser check of ``profkit view`` (analyses/screenshot_tensorboard.py) in real headless Chromium."""

import importlib.util
import shutil
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[3] / "analyses" / "screenshot_tensorboard.py"


def _missing() -> str | None:
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed"
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        return "Chromium/chromedriver are not installed (Debian packages chromium, chromium-driver)"
    return None


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_headless_chromium_screenshots_profkit_view(matrix, tmp_path):
    spec = importlib.util.spec_from_file_location("screenshot_tensorboard", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    runs = tmp_path / "traces"
    for run in ("lora", "lora_gc"):
        shutil.copytree(matrix / run, runs / run)
    profiler, scalars = module.screenshot(runs, tmp_path / "tensorboard_profiler.png", run="lora_gc", settle_s=5)
    for png in (profiler, scalars):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000


@pytest.mark.skipif(_missing() is not None, reason=str(_missing()))
def test_headless_chromium_renders_the_offline_perfetto_view(matrix, tmp_path):
    """analyses/screenshot_perfetto.py waits until the Perfetto UI lists profkit's memory track: the trace was
    loaded by the in-browser trace processor, from 127.0.0.1 only."""
    script = Path(__file__).parents[3] / "analyses" / "screenshot_perfetto.py"
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location("screenshot_perfetto", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    runs = tmp_path / "traces"
    shutil.copytree(matrix / "lora_gc", runs / "lora_gc")
    png = module.screenshot(runs, tmp_path / "perfetto.png", run="lora_gc")
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
