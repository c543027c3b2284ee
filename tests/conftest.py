"""Shared fixtures: the whole method matrix recorded once per session on the ``micro`` preset, on CPU,
through the real CLI (each method in its own subprocess), exactly as a user would run it.

The two largest recordings (the micro matrix, the training methods on tiny) start in the background as soon as
the session knows it needs them, and the tests that record nothing run first, meanwhile: a recording spends most
of its time importing libraries on one core, so on two cores the in-process tests take the other."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

import pytest

from profkit.core.methods import METHODS

DATA = Path(__file__).parent / "data"
GPU_TRACES = DATA / "gpu-traces"
# Few steps: the tests check what was written, not how fast.
FAST = ["--preset", "micro", "--device", "cpu", "--warmup-steps", "1", "--steps", "2", "--profiled-steps", "1"]


# The fast tier (`make test-fast`, ``-m "not e2e"``) is every test that records nothing and runs no other program:
# the pure layers on stored fixtures (an analysis may still fork its own workers, as HTA's parser does). What
# records, trains, installs or runs a program (the CLI in a subprocess, torchrun, pip) lives under tests/e2e and is
# marked ``e2e`` by where it is; the guard below fails a fast test that records or runs a program all the same.
E2E = Path(__file__).parent / "e2e"


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if E2E in Path(item.path).parents:
            item.add_marker(pytest.mark.e2e)
    # In-process tests first, then the recording tests that record their own runs, then those waiting on the
    # background recordings (stable): the session waits on those as late as it can.
    items.sort(key=lambda item: (item.get_closest_marker("e2e") is not None,
                                 bool(BACKGROUND.keys() & set(getattr(item, "fixturenames", ())))))


class FastTestRecorded(RuntimeError):
    pass


REFUSAL = "a fast test must not record or run a program: move it under tests/e2e"
# Programs started, as Python audits them, whatever name a module bound the function under.
PROGRAM_EVENTS = {"subprocess.Popen", "os.posix_spawn", "os.system", "os.exec", "os.spawn"}
_guarding = threading.Event()  # set while a fast test is set up, run and torn down


STDLIB = sysconfig.get_paths()["stdlib"]
PROJECT = tuple(str(Path(__file__).resolve().parents[1] / part) + os.sep for part in ("profkit", "tests", "analyses"))


def _in_stdlib(filename: str) -> bool:
    return filename.startswith((STDLIB, "<")) and "site-packages" not in filename


def _refused_here() -> bool:
    """A fast test's thread (or one it started) is refused; the background recordings are the e2e tests'. What
    decides is the first caller outside the standard library: the project's code (a test, profkit) running a
    program is refused; a library probing its environment (triton or ctypes asking ldconfig) records nothing."""
    if not _guarding.is_set() or isinstance(threading.current_thread(), _Recordings):
        return False
    frame = sys._getframe(2)
    while frame is not None and _in_stdlib(frame.f_code.co_filename):
        frame = frame.f_back
    return frame is None or frame.f_code.co_filename.startswith(PROJECT)


def _refuse_programs(event: str, _args) -> None:
    if event in PROGRAM_EVENTS and _refused_here():
        raise FastTestRecorded(f"{REFUSAL} ({event})")


def _refusing(owner, name: str, what: str) -> None:
    """``owner.name`` refused in a fast test: every recording goes through ``Session`` (profkit's worker, the
    Trainer's callback, a user's loop) or through the runner (``profkit record``, whose worker is another process)."""
    original = getattr(owner, name)

    def refused(*args, **kwargs):
        if _refused_here():
            raise FastTestRecorded(f"{REFUSAL} ({what})")
        return original(*args, **kwargs)

    setattr(owner, name, refused)


def _install_guard() -> None:
    sys.addaudithook(_refuse_programs)
    from profkit.launch import runner
    from profkit.record.session import Session

    _refusing(Session, "__init__", "profkit.Session")
    _refusing(runner, "record_one", "profkit record")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The guard covers a fast test's fixtures of every scope, which an autouse fixture would not (a session
    fixture is set up before it)."""
    fast = item.get_closest_marker("e2e") is None
    if fast and not getattr(item.config, "_fast_guard", False):
        _install_guard()
        item.config._fast_guard = True
    if fast:
        _guarding.set()
    try:
        return (yield)
    finally:
        _guarding.clear()


def pytest_configure(config) -> None:
    """Model checkpoints materialized for presets go to a per-session cache (the background recordings' too)."""
    cache = tempfile.mkdtemp(prefix="profkit-test-cache-")
    os.environ["PROFKIT_CACHE"] = cache
    config.add_cleanup(lambda: shutil.rmtree(cache, ignore_errors=True))


class _Recordings(threading.Thread):
    """Records what the selected tests need, one recording after another, while the session goes on."""

    def __init__(self, wanted: list[str]) -> None:
        super().__init__(daemon=True)
        self.root = Path(tempfile.mkdtemp(prefix="profkit-test-recordings-"))
        self.wanted = wanted
        self.done = {name: threading.Event() for name in wanted}
        self.results: dict[str, tuple[subprocess.CompletedProcess, Path]] = {}

    def run(self) -> None:
        # A developer iterating on the analysis may point PROFKIT_TEST_RECORDINGS at an earlier session's
        # recordings (a profkit-test-recordings-* directory kept aside) instead of recording again.
        reuse = os.environ.get("PROFKIT_TEST_RECORDINGS")
        for name in self.wanted:
            out = self.root / name / "traces"
            if reuse and (Path(reuse) / name / "traces").is_dir():
                out = Path(reuse) / name / "traces"
                self.results[name] = (subprocess.CompletedProcess([], 0, "", ""), out)
                self.done[name].set()
                continue
            try:
                self.results[name] = (run_cli("record", *BACKGROUND[name], "-o", str(out), timeout=3600), out)
            finally:
                self.done[name].set()

    def get(self, name: str) -> Path:
        self.done[name].wait()
        assert name in self.results, f"the background recording of {name} did not finish"
        result, out = self.results[name]
        assert result.returncode == 0, recorded(result, out)
        return out


_RECORDINGS: list[_Recordings] = []


def pytest_collection_finish(session) -> None:
    """Once the tests to run are known (after -m and -k), start the recordings they need."""
    e2e = [item for item in session.items if item.get_closest_marker("e2e")]
    needed = set().union(*(getattr(item, "fixturenames", ()) for item in e2e))
    wanted = [name for name in BACKGROUND if name in needed]
    if wanted and not session.config.option.collectonly:
        recordings = _Recordings(wanted)
        session.config.add_cleanup(lambda: shutil.rmtree(recordings.root, ignore_errors=True))
        recordings.start()
        _RECORDINGS.append(recordings)


def _recorded_in_background(name: str) -> Path:
    if _guarding.is_set():
        raise FastTestRecorded(f"{REFUSAL} (the {name} recording)")
    assert _RECORDINGS, f"{name} was not started: the session did not select a test that needs it"
    return _RECORDINGS[0].get(name)


def terminal_session() -> None:
    """``preexec_fn`` for a CLI the tests stop with Ctrl-C: a session of its own, like a terminal's, and
    SIGINT at its default. A shell that starts a job in the background (``make test &``) ignores SIGINT, and
    an ignored SIGINT is inherited across exec, so Python would never raise KeyboardInterrupt."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "profkit", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def invoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in this process (typer's runner), for commands whose subprocess would only add the imports' time:
    the same exit code, standard output and standard error as ``run_cli``."""
    from typer.testing import CliRunner  # the tests' own dependency, here only for the commands run in-process

    from profkit.cli import app  # after the session's environment (PROFKIT_CACHE) is set

    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def users_distributed_script(run: str, imports: str, wrap: str) -> str:
    """A user's script: a two-layer Llama trained in their own loop under torchrun (gloo), recorded into
    ``traces/<run>`` by a Session; ``wrap`` (after ``imports``) turns ``model`` into what they train."""
    return f'''
import torch, torch.distributed as dist, profkit
from transformers import AutoConfig, AutoModelForCausalLM
{imports}

dist.init_process_group("gloo")
torch.manual_seed(0)
config = AutoConfig.for_model("llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, vocab_size=1000)
model = AutoModelForCausalLM.from_config(config)
{wrap}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
with profkit.Session("traces/{run}", model=model, optimizer=optimizer, warmup_steps=1, timed_steps=1,
                     profiled_steps=1, memory_steps=1) as session:
    for _ in range(20):
        ids = torch.randint(0, 1000, (2, 64))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        session.step()
'''


def torchrun(script: str, cwd: Path, nproc: int = 2) -> None:
    """A user's training script run as they would run it: under torchrun, ``nproc`` ranks, in ``cwd``."""
    path = cwd / "train.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
                           str(path)], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def recorded(result: subprocess.CompletedProcess, out: Path) -> str:
    """What a failed ``profkit record`` said, with the end of each log it left (a crash's Python stack is there)."""
    logs = [f"--- {log}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:])
            for log in sorted(out.rglob("record.log"))]
    return "\n".join([result.stdout + result.stderr, *logs])


@pytest.fixture(scope="session")
def family_checkpoints(tmp_path_factory) -> dict[str, Path]:
    from tests.families import save_family_checkpoints  # transformers, loaded only where a test needs the models

    return save_family_checkpoints(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="session")
def matrix() -> Path:
    return _recorded_in_background("matrix")


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
    """The training methods without ZeRO or FSDP: the estimate against measurement on a model larger than micro.
    ZeRO and FSDP are held elsewhere: every ZeRO and FSDP method at one rank in the micro matrix
    (``tests/test_estimate.py``, ``tests/test_fsdp.py``), the LoRA and QLoRA ZeRO methods at two ranks
    (``tests/test_ranks_record.py``), FSDP at two ranks (``tests/test_fsdp.py``). Keeps the suite under its time
    budget: DeepSpeed's start-up is most of a ZeRO run's time, whatever the model."""
    return [n for n, m in METHODS.items() if m.kind == "train" and not m.zero_stage and not m.fsdp]


TINY_TRAINING = _tiny_training()


FSDP_METHODS = [n for n, m in METHODS.items() if m.fsdp]
# At two ranks: full, LoRA and QLoRA each, checkpointing once (the matrix records every FSDP method on one rank).
FSDP_ON_TWO_RANKS = ["full_fsdp", "lora_fsdp", "qlora_fsdp_gc"]


@pytest.fixture(scope="session")
def fsdp_ranks() -> Path:
    """FSDP at two ranks (torchrun, gloo) on micro."""
    return _recorded_in_background("fsdp_ranks")


# Gradient accumulation through profkit's loop: ZeRO-2, ZeRO-3 and FSDP2, each beside its matrix run (unsharded,
# a user's loop: tests/test_session.py).
ACCUMULATED = ["full_zero2", "full_zero3", "full_fsdp"]


@pytest.fixture(scope="session")
def accumulated() -> Path:
    """``ACCUMULATED`` on micro with two micro-batches per optimizer step (``--grad-accum 2``)."""
    return _recorded_in_background("accumulated")


@pytest.fixture(scope="session")
def accumulated_unsynced() -> Path:
    """``full_fsdp`` at two ranks, two micro-batches a step, the first's gradients held unsharded (no_sync)."""
    return _recorded_in_background("accumulated_unsynced")


@pytest.fixture(scope="session")
def tiny_training() -> Path:
    """The training methods on the default ``tiny`` preset: the estimator's accuracy targets are set there."""
    return _recorded_in_background("tiny_training")


# What the background records for each fixture, in this order.
BACKGROUND = {
    "matrix": ["--all", *FAST],
    "fsdp_ranks": [*FSDP_ON_TWO_RANKS, "--nproc", "2", "--preset", "micro", "--device", "cpu", "--warmup-steps", "1",
                   "--steps", "1", "--profiled-steps", "1"],
    "accumulated": [*ACCUMULATED, "--grad-accum", "2", *FAST],
    "accumulated_unsynced": ["full_fsdp", "--grad-accum", "2", "--grad-sync", "last", "--nproc", "2", "--preset",
                             "micro", "--device", "cpu", "--warmup-steps", "1", "--steps", "1",
                             "--profiled-steps", "1"],
    "tiny_training": [*TINY_TRAINING, "--preset", "tiny", "--device", "cpu", "--warmup-steps", "1", "--steps", "1",
                      "--profiled-steps", "1"],
}
