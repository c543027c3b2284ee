"""Record a list of methods, each in a fresh ``profkit.worker`` process, and commit each run.

The parent never imports torch: it spawns, relays progress, and decides what is committed. A worker
that dies without writing its manifest (killed, crashed interpreter) still leaves a run marked with
that status, and an incomplete run never replaces a complete one (``store.commit``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from profkit import store
from profkit.manifest import RunRecord, new_record
from profkit.methods import Method
from profkit.settings import RunSettings

STOP_GRACE_S = 60


@dataclass(frozen=True)
class Outcome:
    method: str
    status: str
    reason: str | None
    path: Path
    record: RunRecord


class Observer(Protocol):
    def method_started(self, method: Method, total_steps: int) -> None: ...
    def step_done(self, method: Method, phase: str) -> None: ...
    def method_finished(self, outcome: Outcome) -> None: ...


class QuietObserver:
    def method_started(self, method: Method, total_steps: int) -> None:
        pass

    def step_done(self, method: Method, phase: str) -> None:
        pass

    def method_finished(self, outcome: Outcome) -> None:
        pass


def record(methods: list[Method], base: RunSettings, root: Path, observer: Observer | None = None) -> list[Outcome]:
    """Record ``methods`` one after another. Ctrl-C stops the matrix after committing the interrupted run."""
    observer = observer or QuietObserver()
    outcomes = []
    for method in methods:
        outcome = record_one(method, replace(base, method=method.name), root, observer)
        outcomes.append(outcome)
        observer.method_finished(outcome)
        if outcome.status == "interrupted":
            raise KeyboardInterrupt(outcomes)
    return outcomes


def record_one(method: Method, settings: RunSettings, root: Path, observer: Observer) -> Outcome:
    partial = store.new_partial(root, settings.run)
    read_fd, write_fd = os.pipe()
    cmd = [sys.executable, "-m", "profkit.worker", "--run-dir", str(partial.path),
           "--settings", json.dumps(settings.to_json()), "--events-fd", str(write_fd)]
    with open(partial.log, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                pass_fds=(write_fd,))
    os.close(write_fd)
    interrupted = False
    try:
        with os.fdopen(read_fd) as events:
            for line in events:
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                if event.get("event") == "start":
                    observer.method_started(method, event["total_steps"])
                elif event.get("event") == "step":
                    observer.step_done(method, event["phase"])
        proc.wait()
    except KeyboardInterrupt:
        # The worker shares our terminal's process group and usually got the same Ctrl-C; make sure.
        interrupted = True
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    try:
        record = partial.read_record()
    except store.ManifestError:  # the worker died before writing it, or while writing it
        record = _record_for_dead_worker(method, settings, proc.returncode, interrupted, partial)
        partial.write_manifest(record.to_json())
    final = store.commit(partial, root, settings.run)
    return Outcome(method.name, record.status, record.reason, final.path, record)


def _record_for_dead_worker(method: Method, settings: RunSettings, returncode: int, interrupted: bool,
                            partial: store.RunDir) -> RunRecord:
    if interrupted:
        status, reason = "interrupted", "stopped before the worker could write its manifest"
    elif returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name
        hint = " (on Linux usually the kernel's out-of-memory killer)" if sig == "SIGKILL" else ""
        status, reason = "failed", f"worker killed by {sig}{hint}; see {store.LOG}"
    else:
        status, reason = "failed", f"worker exited with code {returncode} without a manifest; see {store.LOG}"
    record = new_record(settings.run, method.name, method.kind, method.settings(), settings.engine,
                        run_settings=settings.to_json(), status=status, reason=reason)
    record.files = sorted(p.name for p in partial.path.iterdir())
    return record
