"""Which source attributes a run's memory: the storage lifetimes, the profiler's export, with the CUDA
allocator's history laid beside, for every combination of what became of each (read, absent, damaged)."""

import gzip
import shutil

import pytest

from profkit.analyze import breakdown
from profkit.analyze.run_memory import (ABSENT, ALLOCATOR, DAMAGED, EXPORT, LIFETIMES, READ,
                                        choose_memory_source)
from tests.conftest import DATA

FULL = DATA / "gpu-runs" / "h100" / "full"

# lifetimes, export, allocator, cuda, fsdp -> used, compared
TABLE = [
    (READ, READ, READ, True, False, LIFETIMES, (EXPORT, LIFETIMES, ALLOCATOR)),
    (READ, READ, ABSENT, True, False, LIFETIMES, (EXPORT, LIFETIMES)),
    (READ, READ, ABSENT, False, False, EXPORT, (EXPORT, LIFETIMES)),
    (READ, READ, ABSENT, False, True, LIFETIMES, (EXPORT, LIFETIMES)),
    (READ, ABSENT, READ, True, False, LIFETIMES, (LIFETIMES, ALLOCATOR)),
    (READ, ABSENT, ABSENT, True, False, LIFETIMES, ()),
    (READ, ABSENT, ABSENT, False, False, LIFETIMES, ()),
    (READ, DAMAGED, ABSENT, False, False, LIFETIMES, ()),
    (READ, DAMAGED, READ, True, False, LIFETIMES, (LIFETIMES, ALLOCATOR)),
    (ABSENT, READ, ABSENT, True, False, EXPORT, ()),
    (ABSENT, READ, ABSENT, False, False, EXPORT, ()),
    (DAMAGED, READ, ABSENT, False, True, EXPORT, ()),
    (DAMAGED, READ, ABSENT, True, False, EXPORT, ()),
    (ABSENT, ABSENT, ABSENT, False, False, None, ()),
    (ABSENT, DAMAGED, ABSENT, True, False, None, ()),
    (DAMAGED, ABSENT, ABSENT, False, False, None, ()),
    (DAMAGED, DAMAGED, ABSENT, True, False, None, ()),
]


@pytest.mark.parametrize("lifetimes, export, allocator, cuda, fsdp, used, compared", TABLE)
def test_the_source_used_and_why(lifetimes, export, allocator, cuda, fsdp, used, compared):
    source = choose_memory_source(lifetimes, export, allocator, cuda, fsdp)
    assert (source.used, source.compared) == (used, compared)
    unusable = [state for state in (lifetimes, export) if state != READ]
    assert all(state in source.why for state in unusable) if used is None or used == LIFETIMES and export != READ \
        or used == EXPORT and lifetimes != READ else source.why


FILES = {"lifetimes": "storage_lifetimes.json.gz", "trace": "memory.pt.trace.json.gz",
         "timeline": "memory_timeline.raw.json.gz"}


def _run(tmp_path, states: dict):
    """The recorded H100 run (every source present) with some of its files removed or damaged."""
    run = tmp_path / "full"
    shutil.copytree(FULL, run)
    for name, state in states.items():
        if state == ABSENT:
            (run / FILES[name]).unlink()
        elif state == DAMAGED:
            with gzip.open(run / FILES[name], "wb") as fh:
                fh.write(b'{"columns": [1, 2')
    return run


@pytest.fixture(scope="module")
def attributed(tmp_path_factory):
    """The memory rows each source gives alone."""
    return {source: breakdown([_run(tmp_path_factory.mktemp(source), {other: ABSENT})], jobs=1).memory
            for source, other in ((LIFETIMES, "timeline"), (EXPORT, "lifetimes"))}


@pytest.mark.parametrize("states, used", [
    ({}, LIFETIMES),  # on CUDA the lifetimes stand; the export is compared
    ({"timeline": ABSENT}, LIFETIMES),
    ({"timeline": DAMAGED}, LIFETIMES),
    ({"trace": DAMAGED}, LIFETIMES),
    ({"lifetimes": ABSENT}, EXPORT),
    ({"lifetimes": DAMAGED}, EXPORT),
    ({"lifetimes": ABSENT, "timeline": ABSENT}, None),
    ({"lifetimes": DAMAGED, "timeline": DAMAGED}, None),
    ({"lifetimes": DAMAGED, "trace": ABSENT}, None),
])
def test_a_recorded_run_with_each_source_present_absent_or_damaged(tmp_path, attributed, states, used):
    bd = breakdown([_run(tmp_path, states)], jobs=1)
    assert not any("could not be analysed" in p.message for p in bd.problems), bd.problems
    named = {p.path.name for p in bd.problems}
    assert {FILES[n] for n, s in states.items() if s == DAMAGED} <= named  # each damaged file is named
    if used is None:
        assert bd.memory.empty and bd.failed
    else:
        assert bd.memory.equals(attributed[used])
