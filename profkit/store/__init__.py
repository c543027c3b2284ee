"""Where recorded runs live. The only module that knows directory layout and file names.

Layout (one TensorBoard run per method; the two profiling cycles are its two workers)::

    traces/<run>/manifest.json
    traces/<run>/time.pt.trace.json.gz        time-profiling cycle (Kineto trace)
    traces/<run>/memory.pt.trace.json.gz      memory-profiling cycle (Kineto trace with memory events)
    traces/<run>/memory_timeline.raw.json.gz  the profiler's categorized memory timeline
    traces/<run>/storage_lifetimes.json.gz    every storage's lifetime in the memory cycle, and its owner
    traces/<run>/memory_snapshot.pickle       CUDA allocator history (open in pytorch.org/memory_viz)
    traces/<run>/oom_snapshot.pickle          CUDA allocator state at an out-of-memory error
    traces/<run>/record.log                   the run's own output (profkit record)
    traces/<run>/profiler.log                 what the profiler's native code printed
    traces/<run>/rank<k>/...                  a run of several ranks: each rank's own run directory (the
                                              files above); the run's manifest describes every rank
    traces/<run>/rep<k>/...                   a run recorded several times (--repeats): each repetition's own
                                              run directory (ranks inside it, if any)

A run is recorded into ``traces/.<run>.partial-<pid>/`` and renamed into place by ``commit``; a
directory without a manifest, or under a partial name, is never a complete run.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from profkit.store import manifest
from profkit.store.manifest import ManifestError, RunRecord

MANIFEST = "manifest.json"
TIME_TRACE = "time.pt.trace.json.gz"
MEMORY_TRACE = "memory.pt.trace.json.gz"
MEMORY_TIMELINE = "memory_timeline.raw.json.gz"
STORAGE_LIFETIMES = "storage_lifetimes.json.gz"
# Its event rows (record.storages writes them, analyze.lifetimes reads them). ``inputs``: for an ``alloc``, the
# storages the op read, so a forward op's result computed from the batch (an activation) is told from one
# computed from the weights alone (a temporary).
LIFETIME_EVENT_COLUMNS = ("t_ns", "action", "storage", "bytes", "device", "address", "op", "phase", "inputs")
CUDA_SNAPSHOT = "memory_snapshot.pickle"
OOM_SNAPSHOT = "oom_snapshot.pickle"
LOG = "record.log"
PROFILER_LOG = "profiler.log"
PARTIAL_MARK = ".partial-"
RANK_PREFIX = "rank"
REPETITION_PREFIX = "rep"
ATTEMPTS_DIR = ".attempts"
DEFAULT_ROOT = Path("traces")



@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def manifest(self) -> Path:
        return self.path / MANIFEST

    @property
    def time_trace(self) -> Path:
        return self.path / TIME_TRACE

    @property
    def memory_trace(self) -> Path:
        return self.path / MEMORY_TRACE

    @property
    def memory_timeline(self) -> Path:
        return self.path / MEMORY_TIMELINE

    @property
    def storage_lifetimes(self) -> Path:
        return self.path / STORAGE_LIFETIMES

    @property
    def cuda_snapshot(self) -> Path:
        return self._pickle(CUDA_SNAPSHOT)

    @property
    def oom_snapshot(self) -> Path:
        return self._pickle(OOM_SNAPSHOT)

    def _pickle(self, name: str) -> Path:
        """A snapshot as written, or gzip-compressed beside where it would be (``.pickle.gz``: a run kept or sent
        compressed; snapshots shrink 20-fold)."""
        plain = self.path / name
        packed = plain.with_name(name + ".gz")
        return packed if packed.is_file() and not plain.exists() else plain

    @property
    def log(self) -> Path:
        return self.path / LOG

    @property
    def profiler_log(self) -> Path:
        return self.path / PROFILER_LOG

    def files(self) -> list[str]:
        """The run's files, as its record lists them: everything but hidden working files."""
        return sorted(p.name for p in self.path.iterdir() if not p.name.startswith("."))

    def rank(self, k: int) -> "RunDir":
        return RunDir(self.path / f"{RANK_PREFIX}{k}")

    def repetition(self, k: int) -> "RunDir":
        return RunDir(self.path / f"{REPETITION_PREFIX}{k}")

    def read_rank_records(self, world_size: int, unit: str = "rank") -> dict[int, RunRecord | None]:
        """Each rank's (or repetition's) own record; None where the manifest is missing or unreadable."""
        out: dict[int, RunRecord | None] = {}
        for k in range(world_size):
            try:
                out[k] = (self.rank(k) if unit == "rank" else self.repetition(k)).read_record()
            except ManifestError:
                out[k] = None
        return out

    def read_record(self) -> RunRecord:
        """The run's typed manifest; raises ``ManifestError`` naming the file if it cannot be read."""
        return manifest.read(self.manifest)

    def write_manifest(self, data: dict) -> None:
        write_json_atomic(self.manifest, data)


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def new_partial(root: Path, run: str) -> RunDir:
    """A fresh directory to record ``run`` into; invisible to analysis until committed."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / f".{run}{PARTIAL_MARK}{os.getpid()}-{time.time_ns()}"
    path.mkdir()
    return RunDir(path)


def commit(partial: RunDir, root: Path, run: str) -> RunDir:
    """Move a finished recording into place.

    A complete (``ok``) run replaces the previous one. An incomplete one (oom, failed, unsupported,
    interrupted) takes the run's place only if there is no complete run there to lose; otherwise it is
    kept under ``.attempts/`` and the complete run stays.
    """
    status = partial.read_record().status
    target = root / run
    if target.exists() and not is_run_dir(target) and any(target.iterdir()):
        raise NotARunError(target)
    while True:  # another session may commit the same run at the same moment: retry until ours is in place
        if status != "ok" and is_complete(target):
            attempts = root / ATTEMPTS_DIR
            attempts.mkdir(exist_ok=True)
            dest = attempts / f"{run}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{status}"
            os.replace(partial.path, dest)
            return RunDir(dest)
        old = None
        if target.exists():
            old = root / f".{run}.old-{os.getpid()}-{time.time_ns()}"
            try:
                os.replace(target, old)
            except FileNotFoundError:
                old = None
        try:
            os.replace(partial.path, target)
        except OSError:  # the target reappeared between the two renames
            if old:
                shutil.rmtree(old, ignore_errors=True)
            continue
        if old:
            shutil.rmtree(old, ignore_errors=True)
        return RunDir(target)


def finish_rank(run: RunDir, rank: int, world_size: int, template: RunRecord, root: Path, name: str) -> RunDir | None:
    """A rank of a multi-rank run has written its own record into ``run/rank<k>/``. The last rank to get here
    (by marker files, so it needs a file system every rank shares) writes the run's record, combined from every
    rank's (``manifest.combine``), and commits the run; the others return None."""
    (run.path / f".done-{RANK_PREFIX}{rank}").touch()
    if len(list(run.path.glob(f".done-{RANK_PREFIX}*"))) < world_size:
        return None
    try:
        os.close(os.open(run.path / ".assembling", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return None  # another rank finished at the same moment and assembles it
    record = manifest.combine(template, world_size, run.read_rank_records(world_size))
    record.files = run.files()
    run.write_manifest(record.to_json())
    for marker in run.path.glob(".done-*"):
        marker.unlink(missing_ok=True)
    (run.path / ".assembling").unlink(missing_ok=True)
    return commit(run, root, name)


class NotARunError(OSError):
    def __init__(self, path: Path):
        super().__init__(f"{path} exists and is not a profkit run directory (no {MANIFEST}); choose another path "
                         "so that nothing in it is replaced")


def check_target(path: Path) -> None:
    """Raise ``NotARunError`` before recording if committing to ``path`` would have to replace a user's files."""
    if path.exists() and (not path.is_dir() or (not is_run_dir(path) and any(path.iterdir()))):
        raise NotARunError(path)


def is_complete(path: Path) -> bool:
    try:
        return RunDir(path).read_record().complete
    except ManifestError:
        return False


def is_run_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() and PARTIAL_MARK not in path.name


def find_runs(root: Path) -> list[RunDir]:
    """Committed runs under ``root`` (itself a run, or a directory of runs), in name order."""
    if is_run_dir(root):
        return [RunDir(root)]
    return [RunDir(p) for p in sorted(root.iterdir()) if not p.name.startswith(".") and is_run_dir(p)]
