"""Shared fixtures: the whole method matrix recorded once per session on the ``micro`` preset, on CPU,
through the real CLI (each method in its own subprocess), exactly as a user would run it."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
GPU_TRACES = DATA / "gpu-traces"
# Few steps: the tests check what was written, not how fast.
FAST = ["--preset", "micro", "--device", "cpu", "--warmup-steps", "1", "--steps", "2", "--profiled-steps", "1"]


# The fast tier (`make test-fast`) is every test that runs in this process and records nothing: the pure layers on
# stored fixtures. A test is end-to-end (marked ``e2e``) when it depends on a recording fixture, or records,
# trains, installs or runs the command line in a subprocess itself.
RECORDING_FIXTURES = {"matrix", "tiny_training", "engines", "repeated", "rank16", "two_ranks", "zero_on_tiny"}
RECORDS = re.compile(r'run_cli\(|"record",|Session\(|Trainer\(|TrainerCallback\(|gpu_check\.main\(|'
                     r'"install"|runner\.record|subprocess\.(run|Popen)\(')


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        function = getattr(item, "function", None)
        source = inspect.getsource(function) if function is not None else ""
        if RECORDING_FIXTURES & set(getattr(item, "fixturenames", ())) or RECORDS.search(source):
            item.add_marker(pytest.mark.e2e)


def terminal_session() -> None:
    """``preexec_fn`` for a CLI the tests stop with Ctrl-C: a session of its own, like a terminal's, and
    SIGINT at its default. A shell that starts a job in the background (``make test &``) ignores SIGINT, and
    an ignored SIGINT is inherited across exec, so Python would never raise KeyboardInterrupt."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profkit", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def recorded(result: subprocess.CompletedProcess, out: Path) -> str:
    """What a failed ``profkit record`` said, with the end of each log it left (a crash's Python stack is there)."""
    logs = [f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            for log in sorted(out.rglob("record.log"))]
    return "\n".join([result.stdout + result.stderr, *logs])


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory):
    """Model checkpoints materialized for presets go to a per-session cache."""
    os.environ["PROFKIT_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def matrix(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("matrix") / "traces"
    result = run_cli("record", "--all", *FAST, "-o", str(out))
    assert result.returncode == 0, recorded(result, out)
    return out


@pytest.fixture(scope="session")
def engines(matrix, tmp_path_factory) -> Path:
    """``lora_zero2`` and ``qlora_gc`` through profkit's loop (the matrix's runs) and through the Trainer (DeepSpeed
    via accelerate), on micro."""
    out = tmp_path_factory.mktemp("engines") / "traces"
    for run in ("lora_zero2", "qlora_gc"):
        shutil.copytree(matrix / run, out / run)
    result = run_cli("record", "lora_zero2", "qlora_gc", *FAST, "--engine", "trainer", "-o", str(out))
    assert result.returncode == 0, recorded(result, out)
    return out


def _tiny_training() -> list[str]:
    """Every training method, less ZeRO with checkpointing (its static memory is the variant without it, to the
    byte, and checkpointing's activations are held by full_gc, lora_gc and qlora_gc) and less the LoRA and QLoRA
    ZeRO methods, which the two-rank fixture records on tiny and holds to the same targets per rank (full_zero2 and
    full_zero3 keep the one-rank ZeRO path here; the micro matrix still records every method). Keeps the suite
    under its time budget."""
    from profkit.core.methods import METHODS

    return [n for n, m in METHODS.items() if m.kind == "train" and not (m.zero_stage and m.gradient_checkpointing)
            and not (m.zero_stage and m.adapter == "lora")]


TINY_TRAINING = _tiny_training()


@pytest.fixture(scope="session")
def tiny_training(tmp_path_factory) -> Path:
    """Every training method on the default ``tiny`` preset: the estimator's accuracy targets are set there."""
    out = tmp_path_factory.mktemp("tiny") / "traces"
    training = TINY_TRAINING
    result = run_cli("record", *training, "--preset", "tiny", "--device", "cpu", "--warmup-steps", "1",
                     "--steps", "1", "--profiled-steps", "1", "-o", str(out), timeout=1800)
    assert result.returncode == 0, recorded(result, out)
    return out
