"""Where a worker is forked from the preloaded server and where it is a fresh interpreter (``profkit.launch.forking``):
only one process, on a machine with no GPU driver, and not asked for CUDA."""

from __future__ import annotations

import sys

import pytest

from profkit.core.settings import RunSettings
from profkit.launch import forking


@pytest.mark.parametrize("settings, driver, forks", [
    (RunSettings(method="lora", device="cpu"), False, True),
    (RunSettings(method="lora", device="auto"), False, True),
    (RunSettings(method="lora", device="cuda"), False, False),  # unsupported here: a fresh process says why
    (RunSettings(method="lora_zero2", device="cpu", nproc=2), False, False),  # ranks under torchrun
    (RunSettings(method="lora", device="cpu"), True, False),  # a CUDA context does not survive fork
    (RunSettings(method="lora", device="auto"), True, False),
], ids=["cpu", "auto", "cuda", "two ranks", "cpu beside a GPU driver", "auto beside a GPU driver"])
def test_a_worker_is_forked_only_where_that_is_safe(settings, driver, forks, monkeypatch, tmp_path):
    node = tmp_path / "nvidiactl"
    if driver:
        node.touch()
    monkeypatch.setattr(forking, "GPU_DRIVER_NODES", (str(node),))
    assert forking.can_fork(settings) is (forks and sys.platform == "linux")


@pytest.mark.skipif(sys.platform != "linux", reason="multiprocessing's forkserver is Linux's here")
def test_the_forkserver_preloads_what_every_caller_asked_for():
    """record's workers and the analysis's share one server: whichever asks first, it imports both lists."""
    from multiprocessing import forkserver as server

    from profkit.core import forkserver

    assert forkserver.context(["csv"]) is forking._CONTEXT
    forkserver.context(["json"])
    preloaded = server._forkserver._preload_modules  # what the server will import when it starts
    assert {"profkit.launch.preload", "csv", "json"} <= set(preloaded)
