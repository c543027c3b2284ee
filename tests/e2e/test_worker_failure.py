"""A worker that cannot write its manifest (a full disk) leaves a failed run whose reason is the worker's own, on the
terminal and in the manifest, not only in its log."""

from __future__ import annotations

import json
import sys

from profkit import store
from profkit.launch import forking, runner
from tests.conftest import FAST, invoke

FILE_LIMIT = 1024  # bytes: under any manifest, over the worker's progress events
# The worker with every file it writes limited as a full disk would (Python ignores SIGXFSZ: writes past the
# limit fail with EFBIG instead of killing the process); its parent, this process, writes freely.
SMALL_FILES_WORKER = ("import resource, runpy; resource.setrlimit(resource.RLIMIT_FSIZE, ({0}, {0})); "
                      "runpy.run_module('profkit.launch.worker', run_name='__main__', alter_sys=True)")


def test_a_worker_that_cannot_write_its_manifest_says_why(tmp_path, monkeypatch):
    unlimited = runner.worker_command

    def with_small_files(settings, partial, events):
        command = unlimited(settings, partial, events)
        assert command[1:3] == ["-m", "profkit.launch.worker"]
        return [sys.executable, "-c", SMALL_FILES_WORKER.format(FILE_LIMIT), *command[3:]]

    monkeypatch.setattr(runner, "worker_command", with_small_files)
    monkeypatch.setattr(forking, "can_fork", lambda settings: False)  # the limit is set in a fresh interpreter
    result = invoke("record", "lora", *FAST, "-o", str(tmp_path))
    assert result.returncode == 1, result.stderr
    manifest = json.loads((tmp_path / "lora" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    assert "without a manifest: " in manifest["reason"] and "[Errno 27] File too large" in manifest["reason"]
    terminal = " ".join(result.stderr.split())
    assert "[Errno 27] File too large" in terminal and "Traceback" not in terminal
    assert not store.is_complete(tmp_path / "lora")


def test_the_last_exception_in_a_workers_log(tmp_path):
    log = tmp_path / store.LOG
    log.write_text("Traceback (most recent call last):\n  File \"a.py\", line 1\nValueError: first\n\n"
                   "During handling of the above exception, another exception occurred:\n\n"
                   "Traceback (most recent call last):\n  File \"b.py\", line 2, in <module>\n    write()\n"
                   "    ^^^^^^^\nOSError: [Errno 28] No space left on device\n")
    assert runner._last_exception(log) == "OSError: [Errno 28] No space left on device"
    log.write_text("a library's chatter, no traceback\n")
    assert runner._last_exception(log) is None
    assert runner._last_exception(tmp_path / "missing.log") is None
