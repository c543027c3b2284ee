"""Finding what to analyse: profkit run directories (a run, a run of several ranks or repetitions, one rank's
own directory), directories of them, and plain Kineto traces that profkit did not record."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from profkit import store
from profkit.store.manifest import ManifestError, RunRecord

TRACE_SUFFIXES = (".json", ".json.gz")


@dataclass(frozen=True)
class Source:
    """One thing to analyse: a profkit run directory, or a foreign trace file."""

    run: str
    path: Path
    recorded: bool  # True: a profkit run directory with a manifest
    record: RunRecord | None = None  # its manifest, read once by discovery (None: unreadable, reported later)


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str
    fatal: bool = True  # False: a warning; the input was still analysed

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def discover(paths: list[Path]) -> tuple[list[Source], list[Problem]]:
    sources: list[Source] = []
    problems: list[Problem] = []
    for path in paths:
        if not path.exists():
            problems.append(Problem(path, "no such file or directory"))
        elif path.is_file():
            if path.name.endswith(TRACE_SUFFIXES):
                sources.append(Source(_trace_run_name(path), path, False))
            else:
                problems.append(Problem(path, "not a trace (.json or .json.gz) or a run directory"))
        elif store.is_run_dir(path):
            sources += _run_sources(path)
        else:
            found = _discover_dir(path, problems)
            if not found:
                problems.append(Problem(path, "no profkit runs or Kineto traces found in this directory"))
            sources += found
    return _unique_names(sources), problems


def _run_sources(path: Path) -> list[Source]:
    """A run directory: itself, or for a complete run of several ranks each rank's directory, analysed as a run
    of its own named ``<run>/rank<k>`` (the cross-rank view groups them again). A multi-rank run that did not
    complete is one row, with the status and the rank that caused it. A rank's own directory is that rank alone:
    its record carries the run's world size, but the ranks are its siblings, not its children."""
    try:
        record = store.RunDir(path).read_record()
    except ManifestError:
        return [Source(path.name, path, True)]  # reported as unreadable by the analysis
    if record.rank is not None:  # one rank's own directory (``<run>/rank<k>``), named as its run names it
        return [Source(f"{path.parent.name}/{path.name}", path, True, record)]
    if not record.complete or (record.world_size <= 1 and record.repeats <= 1):
        return [Source(path.name, path, True, record)]
    if record.repeats > 1:  # each repetition, itself perhaps a run of several ranks
        return [replace(src, run=f"{path.name}/{src.run}") for k in range(record.repeats)
                for src in _run_sources(store.RunDir(path).repetition(k).path)]
    return [_rank_source(f"{path.name}/{rank.path.name}", rank) for rank in
            (store.RunDir(path).rank(k) for k in range(record.world_size))]


def _rank_source(run: str, rank: store.RunDir) -> Source:
    try:
        return Source(run, rank.path, True, rank.read_record())
    except ManifestError:
        return Source(run, rank.path, True)  # reported as unreadable by the analysis


def _unique_names(sources: list[Source]) -> list[Source]:
    """Runs of the same name from different directories (two recordings of ``lora``) are told apart by their
    parent directory's name, and by a counter if that is not enough: a run name is a table column."""
    counts = Counter(s.run for s in sources)
    renamed = [replace(s, run=f"{s.path.parent.name}/{s.run}") if counts[s.run] > 1 else s for s in sources]
    seen: Counter = Counter()
    out = []
    for s in renamed:
        seen[s.run] += 1
        out.append(s if seen[s.run] == 1 else replace(s, run=f"{s.run}#{seen[s.run]}"))
    return out


def _discover_dir(path: Path, problems: list[Problem], depth: int = 0) -> list[Source]:
    found: list[Source] = []
    for child in sorted(path.iterdir()):
        if child.name.startswith("."):
            continue  # partial recordings and earlier attempts are never analysed as runs
        if child.is_dir():
            if store.is_run_dir(child):
                found += _run_sources(child)
            elif depth < 1:
                found += _discover_dir(child, problems, depth + 1)  # TensorBoard logdir/run/worker.pt.trace.json
        elif child.name.endswith(".raw.json.gz"):
            problems.append(Problem(child, "a memory timeline without a profkit manifest: skipped (the memory "
                                           "breakdown needs the run's inventory)", fatal=False))
        elif child.name.endswith(TRACE_SUFFIXES):
            found.append(Source(_trace_run_name(child) if depth == 0 else f"{path.name}/{_trace_run_name(child)}",
                                child, False))
        else:
            problems.append(Problem(child, "skipped: not a trace (.json or .json.gz)", fatal=False))
    return found


def _trace_run_name(path: Path) -> str:
    name = path.name
    for suffix in (".gz", ".json", ".pt.trace"):
        name = name.removesuffix(suffix)
    return name
