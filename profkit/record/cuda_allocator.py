"""The CUDA allocator's own record of a run: its history of allocations (through the warm-up steps and the memory
cycle) and its state at the moment of an out-of-memory error."""

from __future__ import annotations

import weakref
from pathlib import Path

import torch

from profkit.record.phase_schedule import PhaseWork

# Enough allocator events for several steps of a 3B model; older events are dropped first.
CUDA_HISTORY_MAX_ENTRIES = 200_000


def limit_allocator(device: str, limit_bytes: int) -> float:
    """Hold the caching allocator on ``device`` to ``limit_bytes`` (its share of the device's memory, as
    ``torch.cuda.set_per_process_memory_fraction`` takes it): a request beyond it fails as on a GPU that small.
    Returns the fraction set; ValueError where the device has no caching allocator or is smaller than the limit."""
    if not str(device).startswith("cuda"):
        raise ValueError(f"a memory limit holds the CUDA caching allocator; the {device} has none (on the CPU, "
                         "compare the recorded peak with the budget instead)")
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    if limit_bytes > total:
        raise ValueError(f"a memory limit of {limit_bytes} bytes is more than the device's {total}")
    fraction = limit_bytes / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    return fraction


class AllocatorHistory:
    def start(self) -> None:
        torch.cuda.memory._record_memory_history(max_entries=CUDA_HISTORY_MAX_ENTRIES)

    def stop(self) -> None:
        torch.cuda.memory._record_memory_history(enabled=None)  # and cleared: a later start begins afresh

    def dump(self, path: Path) -> None:
        """Write the history and the allocator's state to ``path``, then stop."""
        try:
            torch.cuda.memory._dump_snapshot(str(path))
        finally:
            self.stop()


class WarmupHistory(PhaseWork):
    """The allocator's history through the warm-up steps (not timed), so that an OOM in the first steps, where a batch
    too large fails, dumps a snapshot holding the failed request and the allocations that led to it (on an H100 the
    GPU check's OOM snapshot had neither: it failed before the memory cycle)."""

    def __init__(self) -> None:
        self.history = AllocatorHistory()

    def start(self) -> None:
        self.history.start()

    def stop(self) -> None:
        self.history.stop()


class OomSnapshot:
    """Dump the allocator state at the moment of an out-of-memory error, before tensors are freed, while started."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.active = False

    def start(self) -> None:
        self.active = True
        ref = weakref.ref(self)  # torch keeps the observer for the process's life; this object goes with its session

        def observer(device, alloc, device_alloc, device_free):  # signature fixed by torch
            snapshot = ref()
            if snapshot is not None and snapshot.active:
                torch.cuda.memory._dump_snapshot(str(snapshot.path))

        torch._C._cuda_attach_out_of_memory_observer(observer)

    def stop(self) -> None:
        self.active = False
