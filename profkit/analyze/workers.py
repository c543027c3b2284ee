"""Analysing many inputs at once: the sources fanned out over worker processes, results in input order."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import psutil

from profkit import store
from profkit.analyze.discovery import Source
from profkit.analyze.parts import Part
from profkit.analyze.sources import analyse_source
from profkit.core import forkserver

# Many inputs (the ranks of a large job) are analysed in worker processes, one input at a time each, with as
# many workers as the memory of the largest input allows; a few small inputs are faster in this process.
# A worker costs time to start (measured with spawned workers: 64 ranks of 110 MB in all took 1.4 s in this process
# and 2.2 s with two workers on two cores), so only inputs that take several seconds are worth it.
PARALLEL_MIN_BYTES = 256 << 20  # uncompressed trace bytes, all inputs together
PEAK_PER_TRACE_BYTE = 2.5  # analysis peak over the uncompressed trace (measured: reports/benchmarks/)
MEMORY_SHARE = 0.5  # of the memory available when the analysis starts


def analyse_all(sources: list[Source], jobs: int | None) -> list[Part]:
    sizes = [_trace_bytes(src) for src in sources]
    workers = jobs if jobs is not None else _auto_workers(sizes)
    workers = max(1, min(workers, len(sources)))
    if workers == 1:
        return [analyse_source(src) for src in sources]
    # Not a fork of this process, which may hold threads (torch, a GUI). A spawned worker imports the analysis
    # anew: about 30 s on a slow 2-core machine, more than most analyses take. On Linux the workers are forked
    # from multiprocessing's forkserver, which imports it once and lives as long as this process.
    ctx = forkserver.context(["profkit.analyze.sources"]) or multiprocessing.get_context("spawn")
    # Largest first, so that a big input does not start last; results come back in input order.
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        order = sorted(range(len(sources)), key=lambda i: -sizes[i])
        futures = {i: pool.submit(analyse_source, sources[i]) for i in order}
        return [futures[i].result() for i in range(len(sources))]


def _auto_workers(sizes: list[int]) -> int:
    if len(sizes) < 2 or sum(sizes) < PARALLEL_MIN_BYTES:
        return 1
    try:
        available = psutil.virtual_memory().available
    except Exception:
        return 1
    per_worker = max(max(sizes) * PEAK_PER_TRACE_BYTE, 1)
    return max(1, min(os.cpu_count() or 1, int(available * MEMORY_SHARE // per_worker)))


def _trace_bytes(src: Source) -> int:
    """The uncompressed size of what ``src`` will parse (a gzip file's trailer holds it, modulo 4 GiB)."""
    paths = [src.path] if not src.recorded else [store.RunDir(src.path).time_trace, store.RunDir(src.path).memory_trace]
    total = 0
    for path in paths:
        try:
            size = path.stat().st_size
            if path.name.endswith(".gz") and size >= 4:
                with open(path, "rb") as fh:
                    fh.seek(-4, 2)
                    size = max(size, int.from_bytes(fh.read(4), "little"))
            total += size
        except OSError:
            continue
    return total
