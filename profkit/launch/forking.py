"""Single-process workers forked from a server that has already imported what every worker imports.

A worker spends most of its life importing torch, transformers, peft and bitsandbytes: on a 2-core machine
that was 35 of the 44 seconds a one-method ``record --preset micro --device cpu`` took, for every method of a
matrix. multiprocessing's forkserver imports them once (``profkit.launch.preload``) and forks each worker
from there: each is still a process of its own, with its own allocator, peaks and exit code.

Only where no GPU driver is present: a CUDA context does not survive ``fork``, and a library's import may create
one (bitsandbytes asks the device's capability when it loads). Elsewhere, and for ranks under torchrun, the
runner starts a fresh interpreter as before.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
from pathlib import Path

from profkit.core import forkserver
from profkit.core.settings import RunSettings

# A device node of NVIDIA's or AMD's (ROCm) driver: a library imported in the server could open a context there.
GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/kfd")
_CONTEXT = forkserver.context(["profkit.launch.preload"])
_ready = False


def can_fork(settings: RunSettings) -> bool:
    """Whether this run's worker may be forked from the preloaded server: one process, on Linux, on a machine
    without a GPU driver, and not asked for CUDA (such a run is then unsupported, which a fresh process says)."""
    return (_CONTEXT is not None and settings.nproc == 1 and settings.device != "cuda"
            and not any(os.path.exists(node) for node in GPU_DRIVER_NODES))


def _nothing() -> None:
    pass


def wait_until_ready() -> None:
    """Start the server and wait for its imports, through a process that does nothing: a Ctrl-C while it
    imports then leaves no request behind it, so no worker is forked after its run was given up."""
    global _ready
    if not _ready:
        first = _CONTEXT.Process(target=_nothing, name="profkit-preload")
        first.start()
        first.join()
        _ready = True


def start(argv: list[str], log: Path) -> "ForkedWorker":
    """``python -m profkit.launch.worker *argv`` as a fork of the server, its output appended to ``log``, with
    this process's environment and working directory as they are now (a fresh process would inherit them)."""
    from profkit.launch import worker  # light: the heavy imports are inside its run()

    wait_until_ready()
    process = _CONTEXT.Process(target=worker.forked_main, args=(argv, str(log), dict(os.environ), os.getcwd()),
                               name="profkit-worker")
    process.start()
    return ForkedWorker(process)


class ForkedWorker:
    """A forked worker, behind the part of ``subprocess.Popen`` the runner uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process
        self.pid = process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:  # ended in between
                pass

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
        return self._process.exitcode

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
