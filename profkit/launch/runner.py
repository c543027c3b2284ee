"""Record a list of methods, each in a ``profkit.launch.worker`` process of its own, and commit each run.

The parent never imports torch: it spawns, relays progress, and decides what is committed. A worker
that dies without writing its manifest (killed, crashed interpreter) still leaves a run marked with
that status, and an incomplete run never replaces a complete one (``store.commit``).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from profkit import store
from profkit.core.methods import Method
from profkit.core.settings import RunSettings
from profkit.launch import forking
from profkit.store.manifest import RunRecord, combine, now, record_for

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


# torchrun, not DeepSpeed's launcher: it ships with torch, runs on CPU (gloo) as on GPUs (NCCL), needs no hostfile
# or pdsh, stops every rank when one fails and says which; DeepSpeed's engine reads the environment it sets.
LAUNCHER = ("-m", "torch.distributed.run", "--standalone", "--nnodes=1")
POLL_S = 0.1


def worker_arguments(settings: RunSettings, partial: store.RunDir, events: Path) -> list[str]:
    return ["--run-dir", str(partial.path), "--settings", json.dumps(settings.to_json()), "--events", str(events)]


def worker_command(settings: RunSettings, partial: store.RunDir, events: Path) -> list[str]:
    args = ["-m", "profkit.launch.worker", *worker_arguments(settings, partial, events)]
    if settings.nproc == 1:
        return [sys.executable, *args]
    return [sys.executable, *LAUNCHER, f"--nproc-per-node={settings.nproc}", *args]


def start_worker(settings: RunSettings, partial: store.RunDir, events: Path):
    """The run's worker: forked from the preloaded server where that is safe (``forking``), else a fresh
    interpreter (torchrun's ranks, a machine with a GPU driver). Its output goes to the run's log."""
    if forking.can_fork(settings):
        return forking.start(worker_arguments(settings, partial, events), partial.log)
    with open(partial.log, "ab") as log:
        return subprocess.Popen(worker_command(settings, partial, events), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def record_one(method: Method, settings: RunSettings, root: Path, observer: Observer) -> Outcome:
    partial = store.new_partial(root, settings.run)
    if settings.repeats > 1:
        return _record_repetitions(method, settings, root, partial, observer)
    record = _record_into(method, settings, partial, observer)
    final = store.commit(partial, root, settings.run)
    return Outcome(method.label, record.status, record.reason, final.path, record)


def _record_repetitions(method: Method, settings: RunSettings, root: Path, partial: store.RunDir,
                        observer: Observer) -> Outcome:
    """The run ``repeats`` times, each in fresh processes, into ``rep<k>/``: one run whose record lists every
    repetition, ``ok`` only if each is. Stops at the first repetition that is interrupted."""
    once = replace(settings, repeats=1)
    for k in range(settings.repeats):
        rep = partial.repetition(k)
        rep.path.mkdir()
        done = _record_into(method, once, rep, observer)
        if done.status == "interrupted":
            break
    record = record_for(settings)
    combine(record, settings.repeats, partial.read_rank_records(settings.repeats, unit="repetition"),
            "not recorded (an earlier repetition was interrupted)", unit="repetition")
    record.finished_at = now()
    record.files = partial.files()
    partial.write_manifest(record.to_json())
    final = store.commit(partial, root, settings.run)
    return Outcome(method.label, record.status, record.reason, final.path, record)


def _record_into(method: Method, settings: RunSettings, partial: store.RunDir, observer: Observer) -> RunRecord:
    """One recording of the run (one process, or one per rank under torchrun) into ``partial``; its record."""
    events = partial.path / ".events"
    events.touch()
    partial.log.write_bytes(b"")
    proc, interrupted, ended = None, False, {}
    try:
        proc = start_worker(settings, partial, events)
        for event in _follow(events, proc):
            if event.get("event") == "start":
                observer.method_started(method, event["total_steps"])
            elif event.get("event") == "step":
                observer.step_done(method, event["phase"])
            elif event.get("event") == "end":
                ended = event
    except KeyboardInterrupt:
        # The worker (or torchrun) shares our terminal's process group and usually got the same Ctrl-C; make sure.
        interrupted = True
        if proc is not None:  # None: stopped while the preloaded server was still importing
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    events.unlink(missing_ok=True)
    returncode = None if proc is None else proc.returncode

    if settings.nproc > 1:
        record = _record_of_ranks(settings, partial, returncode, interrupted)
        partial.write_manifest(record.to_json())
    else:
        try:
            record = partial.read_record()
        except store.ManifestError:  # the worker died before writing it, or while writing it
            cause = ended.get("reason") or _last_exception(partial.log)
            record = _record_for_dead_worker(settings, returncode, interrupted, partial, cause)
            partial.write_manifest(record.to_json())
    return record


def _follow(path: Path, proc: subprocess.Popen):
    """The JSON events the worker appends to ``path``, as they come, until the process ends. A file rather than
    a pipe, because torchrun does not pass inherited descriptors on to the ranks it starts."""
    with open(path) as fh:
        pending = ""
        while True:
            ended = proc.poll() is not None
            chunk = fh.read()
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                try:
                    yield json.loads(line)
                except ValueError:
                    continue
            if ended:
                return
            if not chunk:
                time.sleep(POLL_S)


def _record_of_ranks(settings: RunSettings, partial: store.RunDir, returncode: int | None,
                     interrupted: bool) -> RunRecord:
    """The run's record from each rank's own: every rank must be ok for the run to be."""
    record = record_for(settings)
    cause = None if interrupted else _root_cause(partial.log)
    if interrupted:
        missing = "stopped before it could write its manifest"
    else:
        missing = f"it ended without writing its manifest (killed, or the launcher could not start it); see {store.LOG}"
        if cause:
            missing = f"{missing}; torchrun: {cause[1]}"
    combine(record, settings.nproc, partial.read_rank_records(settings.nproc), missing,
            cause=cause[0] if cause else None)
    if interrupted and record.status != "interrupted" and record.status not in ("oom", "failed"):
        record.status = "interrupted"
    if record.status == "ok" and returncode:
        record.status, record.reason = "failed", f"every rank finished, but torchrun exited with {returncode}; see {store.LOG}"
    record.finished_at = now()
    record.files = partial.files()
    return record


# The worker's fault handler (faulthandler) writes the Python stack of a crash in native code to its log.
CRASHES = frozenset({"SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL"})
CRASH = "a crash in native code; the Python stack that led to it is in"
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)


def _root_cause(log: Path) -> tuple[int, str] | None:
    """The rank torchrun names as the root cause of a failed job ("first observed failure") and its exit code."""
    try:
        found = ROOT_CAUSE.search(log.read_text(errors="replace"))
    except OSError:
        return None
    if not found:
        return None
    rank, code = int(found[1]), int(found[2])
    name = signal.Signals(-code).name if code < 0 and -code in signal.valid_signals() else None
    if name in CRASHES:
        return rank, f"exited with code {code} ({name}: {CRASH} rank{rank}/{store.LOG})"
    return rank, f"exited with code {code}" + (f" ({name})" if name else "")


def _last_exception(log: Path) -> str | None:
    """The exception line of the last Python traceback in ``log`` (the first unindented line after its header)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    _, header, rest = text.rpartition("Traceback (most recent call last):")
    if not header:
        return None
    return next((line for line in rest.splitlines() if line.strip() and not line[0].isspace()), None)


def _record_for_dead_worker(settings: RunSettings, returncode: int, interrupted: bool,
                            partial: store.RunDir, cause: str | None) -> RunRecord:
    """``cause``: the worker's own reason (its last event, or the last exception in its log), if it left one."""
    if interrupted:
        status, reason = "interrupted", "stopped before the worker could write its manifest"
    elif returncode is not None and returncode < 0:
        sig = signal.Signals(-returncode).name
        hint = (" (on Linux usually the kernel's out-of-memory killer)" if sig == "SIGKILL"
                else f" ({CRASH} the log)" if sig in CRASHES else "")
        status, reason = "failed", f"worker killed by {sig}{hint}; see {store.LOG}"
    else:
        said = f": {cause}" if cause else ""
        status, reason = "failed", f"worker exited with code {returncode} without a manifest{said}; see {store.LOG}"
    record = record_for(settings, status=status, reason=reason)
    record.files = partial.files()
    return record
