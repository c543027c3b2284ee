"""The fast tier's promise (`make test-fast`: nothing recorded, no other program run), held by the guard in
``tests/conftest.py``: each way a test could record or run a program fails, and the refusal names where the test
belongs. Forking for parallel analysis stays allowed (HTA's parser forks its own workers)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from subprocess import Popen  # bound at import, as a module under test may hold it

import pytest

import profkit
from tests.conftest import REFUSAL, FastTestRecorded, _recorded_in_background, invoke, run_cli


@pytest.mark.parametrize("start", [
    lambda out: run_cli("--help"),
    lambda out: subprocess.run([sys.executable, "-c", "pass"]),
    lambda out: Popen(["true"]),
    lambda out: os.system("true"),
    lambda out: os.posix_spawn("/bin/true", ["true"], os.environ),
    lambda out: invoke("record", "full", "--preset", "micro", "--device", "cpu", "-o", str(out)),
    lambda out: profkit.Session(out, model=None),
], ids=["run_cli", "subprocess.run", "bound Popen", "os.system", "os.posix_spawn", "record in process", "Session"])
def test_a_fast_test_that_records_or_runs_a_program_fails_loudly(start, tmp_path):
    with pytest.raises(FastTestRecorded, match=REFUSAL):
        start(tmp_path)


def test_a_thread_the_test_starts_is_refused_too():
    raised = []

    def start() -> None:
        try:
            subprocess.run(["true"])
        except FastTestRecorded as exc:
            raised.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert raised


def test_a_background_recording_is_refused():
    """Called as the recording fixtures call it: through the fixture, pytest would keep the refusal for the
    session's e2e tests."""
    with pytest.raises(FastTestRecorded, match="the matrix recording"):
        _recorded_in_background("matrix")


def test_a_librarys_own_probe_is_not_refused():
    """A library that runs a program to probe its environment (triton and ctypes ask ``ldconfig``) records nothing:
    what decides is the first caller outside the standard library, here a library's module, not the project's."""
    library = {}
    exec(compile("import subprocess\ndef probe():\n    return subprocess.run(['true']).returncode\n",
                 "/opt/site-packages/some_library/probe.py", "exec"), library)
    assert library["probe"]() == 0
