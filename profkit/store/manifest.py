"""The run record: one typed description of a recorded run, written as ``manifest.json``.

Every writer (``profkit.Session``, the ``profkit record`` worker, the runner for a worker that died) builds
a ``RunRecord``; every reader goes through ``read`` and so through the schema check. No torch import.

Schema history: 1 -- the first layout (a dict assembled in several places); 2 -- adds ``engine``, ``kind``
is always set, ``engine_config``, ``settings`` describes the method as found on the live objects for runs profkit did not
launch; 3 -- several ranks: ``world_size``, each rank's own record carries its ``rank``, and the run's record lists
``ranks`` (each rank's status and reason). Older files read as version 3 (every field kept its meaning; one rank).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from profkit.core.settings import RunSettings

SCHEMA_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
STATUSES = ("ok", "incomplete", "oom", "failed", "unsupported", "interrupted")
ENGINES = ("loop", "trainer", "session")
LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "datasets", "accelerate", "profkit")


class ManifestError(ValueError):
    """A manifest that cannot be read: unreadable JSON, or a schema this profkit does not know."""


@dataclass
class RunRecord:
    run: str
    method: str  # a registry name, or "custom" for a user's setup that matches none
    kind: str  # train | infer
    settings: dict  # the method's settings (registry fields: adapter, quantization, lora_r, zero_stage...)
    status: str = "interrupted"  # until the run says otherwise, it did not finish
    reason: str | None = None
    engine: str = "loop"  # loop: profkit's own loop; trainer: transformers.Trainer; session: a user's loop
    engine_config: dict = field(default_factory=dict)  # e.g. the Trainer's arguments and its DeepSpeed config
    schema_version: int = SCHEMA_VERSION
    run_settings: dict | None = None  # profkit record's RunSettings (None for a user's own training)
    started_at: str | None = None
    finished_at: str | None = None
    wall_s: float | None = None
    versions: dict = field(default_factory=dict)
    git_commit: str | None = None
    pid: int | None = None
    device: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    estimate: dict | None = None
    timings: dict = field(default_factory=dict)
    peaks: dict = field(default_factory=dict)
    inventory: dict | None = None
    phases_done: list = field(default_factory=list)
    files: list = field(default_factory=list)
    world_size: int = 1
    rank: int | None = None  # set on one rank's record (in the run's rank<k>/ directory)
    ranks: list = field(default_factory=list)  # on a multi-rank run's record: {rank, status, reason} per rank
    repeats: int = 1  # a run recorded several times: each repetition is a run of its own in rep<k>/
    repetition: int | None = None  # set on one repetition's record
    repetitions: list = field(default_factory=list)  # on the run's record: {repetition, status, reason} each

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, source: str = "manifest") -> "RunRecord":
        if not isinstance(data, dict):
            raise ManifestError(f"{source}: not a JSON object")
        version = data.get("schema_version", 1)
        if version not in READABLE_VERSIONS:
            raise ManifestError(f"{source}: schema version {version!r}; this profkit reads versions "
                                f"{', '.join(map(str, READABLE_VERSIONS))} (a newer profkit wrote it?)")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        for required in ("method",):
            if required not in values:
                raise ManifestError(f"{source}: no {required!r} field")
        if values.get("status", "interrupted") not in STATUSES:
            raise ManifestError(f"{source}: unknown status {values['status']!r}; valid: {', '.join(STATUSES)}")
        if values.get("engine", "loop") not in ENGINES:
            raise ManifestError(f"{source}: unknown engine {values['engine']!r}; valid: {', '.join(ENGINES)}")
        values.setdefault("run", values["method"])
        values.setdefault("kind", "train")
        values.setdefault("settings", {})
        values["schema_version"] = SCHEMA_VERSION
        for key in ("versions", "device", "model", "timings", "peaks"):
            if values.get(key) is None:
                values[key] = {}
        return cls(**values)

    @property
    def complete(self) -> bool:
        return self.status == "ok"


def combine(run: RunRecord, world_size: int, rank_records: dict[int, RunRecord | None],
            missing_reason: str = "it ended without writing its manifest", cause: int | None = None,
            unit: str = "rank") -> RunRecord:
    """The record of a run of ``world_size`` ranks from each rank's own (None: that rank wrote none). The run is
    ``ok`` only if every rank is, so no partial multi-rank run can look complete. Otherwise it names one rank and
    takes its status: ``cause`` (the launcher's first observed failure) if given, else a rank that died without a
    record, then one that ran out of memory, failed, ... -- the others usually failed because it did (a
    collective's peer vanished) or were stopped by the launcher."""
    parts = []
    for k in range(world_size):
        rec = rank_records.get(k)
        status, reason = (rec.status, rec.reason) if rec is not None else ("failed", missing_reason)
        parts.append({unit: k, "status": status, "reason": reason})
    if unit == "rank":
        run.world_size, run.ranks = world_size, parts
    else:  # repetitions of one run, one after another
        run.repeats, run.repetitions = world_size, parts
    severity = {"oom": 1, "failed": 2, "unsupported": 3, "interrupted": 4, "incomplete": 5, "ok": 6}
    worst = min(parts, key=lambda r: (r[unit] != cause or r["status"] == "ok",
                                      0 if rank_records.get(r[unit]) is None else severity[r["status"]],
                                      r[unit]))
    if worst["status"] == "ok":
        run.status, run.reason = "ok", None
    else:
        others = [r[unit] for r in parts if r["status"] != "ok" and r is not worst]
        run.status = worst["status"]
        run.reason = (f"{unit} {worst[unit]} of {world_size}: {worst['reason'] or worst['status']}"
                      + (f" ({unit}{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} also did not "
                         "finish)" if others else ""))
    first = rank_records.get(0)
    if first is not None:  # rank 0 speaks for what is the same on every rank
        for name in ("device", "model", "estimate", "timings", "engine_config"):
            setattr(run, name, getattr(first, name))
        run.settings = run.settings or first.settings
    for rec in rank_records.values():  # the highest peak of any rank
        for key, value in (rec.peaks if rec is not None else {}).items():
            if isinstance(value, (int, float)):
                run.peaks[key] = max(run.peaks.get(key, value), value)
    return run


def read(path: Path) -> RunRecord:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable ({exc})") from None
    return RunRecord.from_json(data, str(path))


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def versions() -> dict:
    out = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def git_commit() -> str | None:
    """profkit's own commit, when it runs from a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def new_record(run: str, method: str, kind: str, settings: dict, engine: str, **extra) -> RunRecord:
    """A record for a run that is starting: environment filled in, status 'interrupted' until it ends."""
    return RunRecord(run=run, method=method, kind=kind, settings=settings, engine=engine, started_at=now(),
                     versions=versions(), git_commit=git_commit(), pid=os.getpid(), **extra)


def record_for(settings: RunSettings, **extra) -> RunRecord:
    """A record for a run ``profkit record`` starts: its method with the command line's settings, and the run's
    settings themselves (from which the report's reproduction command is made)."""
    method = settings.method_spec()
    return new_record(settings.run, method.name, method.kind, method.settings(), settings.engine,
                      run_settings=settings.to_json(), **extra)
