"""The memory cycle: the profiler's ``profile_memory`` with shapes and stacks (which the memory timeline needs), the
storage lifetimes followed through its first (the profiler's warm-up) step, the CUDA allocator's history where there
is a GPU, the exact inventory taken between backward and the optimizer step of its last step, and the peaks."""

from __future__ import annotations

import resource
from pathlib import Path

import psutil
import torch
from torch.profiler import profile

from profkit.record.cuda_allocator import AllocatorHistory
from profkit.record.describe import Parts
from profkit.record.generation import Generation
from profkit.record.inventory import take_inventory
from profkit.record.profiler_cycles import ProfilerCycle
from profkit.record.storages import MemoryCycleFollower

# torch's memory-timeline export grows faster than the profiler events it analyses (micro generating on CPU,
# torch 2.15: 67k events 3.4 s, 254k 16.5 s, 504k 48 s); on an H100 an inference memory cycle of the gpu-check
# preset (128 tokens generated) ran it for over 6 minutes without an end. Training cycles of that preset hold
# ~100k. Past this many the export, a second opinion beside the storage lifetimes, is not run.
MEMORY_TIMELINE_MAX_EVENTS = 300_000


class MemoryCycle(ProfilerCycle):
    def __init__(self, *, parts: Parts, generation: Generation | None, **cycle) -> None:
        super().__init__(**cycle)
        self.parts, self.generation = parts, generation
        self.history = AllocatorHistory()
        self.follower: MemoryCycleFollower | None = None

    def start(self) -> None:
        peaks = self.record.peaks
        if self.cuda:
            peaks["cuda_max_allocated_before_memory_cycle"] = torch.cuda.max_memory_allocated()
            peaks["cuda_max_reserved_before_memory_cycle"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            self.history.start()
        device = f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu"
        self.start_profiler(lambda p: self._export(p, device), profile_memory=True, record_shapes=True,
                            with_stack=True)
        # Storages are followed in the profiler's warm-up step, the cycle's first: the profiler records nothing
        # then, so the tracker's Python calls stay out of the memory trace. Followed in the recorded step, they
        # made 90% of its events (micro, 3 methods: traces 3.9-7.4x larger, recording 54 s instead of 34 s).
        p = self.parts
        self.follower = MemoryCycleFollower(p.model, p.optimizer, p.inner_optimizer, lambda: self.labels.now)
        self.labels.open_data()

    def _export(self, p: profile, device: str) -> None:
        p.export_chrome_trace(str(self.run_dir.memory_trace))
        error = export_memory_timeline(p, self.run_dir.memory_timeline, device)
        if error:
            self.record.timings["memory_timeline_error"] = error

    def take_inventory(self) -> None:
        """The live objects' bytes, once a cycle; the session calls it at the last step's optimizer step."""
        if self.record.inventory is not None:
            return
        p = self.parts
        self.record.inventory = take_inventory(p.model, p.optimizer, p.inner_optimizer, p.ddp)
        if self.generation is not None:
            self.record.inventory.update(self.generation.inventory())

    def step(self, last: bool) -> None:
        self._stop_following()  # the profiler's warm-up step is done
        if last:
            self.take_inventory()  # no optimizer step was seen: take it now
        super().step(last)

    def stop(self) -> None:
        super().stop()
        peaks = self.record.peaks
        self._stop_following()  # a session closed inside the warm-up step
        if self.cuda:
            self.history.dump(self.run_dir.cuda_snapshot)
            peaks["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
            peaks["cuda_max_reserved"] = torch.cuda.max_memory_reserved()
        peaks["process_rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peaks["process_rss"] = psutil.Process().memory_info().rss

    def _stop_following(self) -> None:
        follower, self.follower = self.follower, None
        if follower is not None:
            follower.stop(self.run_dir.storage_lifetimes)


def export_memory_timeline(p: profile, path: Path, device: str,
                           max_events: int = MEMORY_TIMELINE_MAX_EVENTS) -> str | None:
    """Write the profiler's categorized memory timeline to ``path``; why it was not written, or None.

    Deprecated upstream, its data-flow analysis sometimes asserts ("duplicate outputs", pytorch/pytorch#167838) and
    its cost grows faster than the cycle's events (``MEMORY_TIMELINE_MAX_EVENTS``). The storage lifetimes are the
    run's own attribution; this export, while torch has it and it ends in reasonable time, is a second opinion."""
    results = getattr(p.profiler, "kineto_results", None)
    events = len(results.events()) if results is not None else 0
    if events > max_events:
        return (f"not exported: {events:,} profiler events in the memory cycle, over {max_events:,}; torch's "
                "export grows faster than its events (504k took 48 s on CPU; an H100 inference cycle over 6 min)")
    try:
        p.export_memory_timeline(str(path), device=device)
    except Exception as exc:
        path.unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None
