"""The profiler lifecycle for one run: the only place that drives torch.profiler and the CUDA allocator
history. Training code only provides ``step()``.

Phases, in order (memory instrumentation distorts timing, so time and memory get separate cycles):

1. warm-up steps (caches, lazy allocations, DeepSpeed buckets);
2. timed steps without any profiler: clean step time, tokens/s, loss;
3. the time cycle: CPU (+CUDA) activities, shapes and FLOPs, one warm-up then N active steps;
4. the memory cycle: ``profile_memory`` with shapes and stacks (which the memory timeline needs), the
   CUDA allocator history where there is a GPU, and the exact inventory taken after backward.
"""

from __future__ import annotations

import json
import resource
import statistics
import time
from typing import Callable

import psutil
import torch
from torch.profiler import ProfilerActivity, profile, schedule

from profkit.inventory import take_inventory
from profkit.settings import RunSettings
from profkit.store import RunDir
from profkit.workload import Workload

Progress = Callable[[str], None]  # called with the phase name after every step

# Enough allocator events for several steps of a 3B model; older events are dropped first.
CUDA_HISTORY_MAX_ENTRIES = 200_000


class Recorder:
    def __init__(self, run_dir: RunDir, settings: RunSettings, progress: Progress, trace_metadata: dict):
        self.run_dir = run_dir
        self.settings = settings
        self.progress = progress
        self.trace_metadata = trace_metadata
        self.cuda = False
        self.results: dict = {"timings": {}, "peaks": {}, "inventory": None, "phases_done": []}

    # ------------------------------------------------------------------ lifecycle

    def record(self, workload: Workload) -> dict:
        """Run every phase; partial results stay in ``self.results`` if a phase raises."""
        self.cuda = workload.device == "cuda"
        if self.cuda:
            self._attach_oom_observer()
        s = self.settings
        self._run_steps(workload, "warmup", s.warmup_steps)
        self._timed(workload)
        self._time_cycle(workload)
        self._memory_cycle(workload)
        return self.results

    def _run_steps(self, workload: Workload, phase: str, n: int, prof=None) -> list[dict]:
        out = []
        for _ in range(n):
            out.append(workload.step())
            if prof is not None:
                prof.step()
            self.progress(phase)
        self.results["phases_done"].append(phase)
        return out

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _timed(self, workload: Workload) -> None:
        times, losses = [], []
        for _ in range(self.settings.timed_steps):
            self._sync()
            t0 = time.perf_counter()
            info = workload.step()
            self._sync()
            times.append(time.perf_counter() - t0)
            if "loss" in info:
                losses.append(info["loss"])
            self.progress("timed")
        median = statistics.median(times)
        self.results["timings"] = {
            "step_times_s": times, "step_time_s": median,
            "tokens_per_step": workload.tokens_per_step, "tokens_per_s": workload.tokens_per_step / median,
            "losses": losses,
        }
        self.results["phases_done"].append("timed")

    def _activities(self) -> list[ProfilerActivity]:
        return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])

    def _profile(self, active: int, trace_path, **kwargs) -> profile:
        prof = profile(
            activities=self._activities(),
            # repeat=1: one cycle; with the default (0) a new, empty cycle starts after the trace is saved.
            schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
            **kwargs,
        )
        for key, value in self.trace_metadata.items():
            prof.preset_metadata_json(key, json.dumps(value))
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized()):
            # Kineto writes distributedInfo only under torch.distributed; HTA needs a rank to load a trace.
            prof.preset_metadata_json("distributedInfo", json.dumps({"backend": "none", "rank": 0, "world_size": 1}))
        return prof

    def _time_cycle(self, workload: Workload) -> None:
        n = self.settings.profiled_steps
        with self._profile(n, self.run_dir.time_trace, record_shapes=True, with_flops=True) as prof:
            self._run_steps(workload, "time_profile", 1 + n, prof)

    def _memory_cycle(self, workload: Workload) -> None:
        n = self.settings.memory_steps
        peaks = self.results["peaks"]
        if self.cuda:
            peaks["cuda_max_allocated_before_memory_cycle"] = torch.cuda.max_memory_allocated()
            peaks["cuda_max_reserved_before_memory_cycle"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.memory._record_memory_history(max_entries=CUDA_HISTORY_MAX_ENTRIES)

        def inventory_after_backward() -> None:
            if self.results["inventory"] is None:
                self.results["inventory"] = take_inventory(workload.model, workload.optimizer, workload.inner_optimizer)

        def on_ready(p: profile) -> None:
            p.export_chrome_trace(str(self.run_dir.memory_trace))
            # Categorized memory timeline (parameters, activations, gradients...); deprecated upstream in
            # favour of the CUDA snapshot, which has no categories, so both are kept.
            p.export_memory_timeline(str(self.run_dir.memory_timeline), device=f"{workload.device}:0" if self.cuda else "cpu")

        prof = self._profile(n, self.run_dir.memory_trace, profile_memory=True, record_shapes=True, with_stack=True)
        prof.on_trace_ready = on_ready
        try:
            with prof:
                for i in range(1 + n):
                    # The inventory is taken in the last active step, when gradients and optimizer state exist.
                    workload.step(inventory_after_backward if i == n else None)
                    prof.step()
                    self.progress("memory_profile")
            self.results["phases_done"].append("memory_profile")
        finally:
            if self.cuda:
                torch.cuda.memory._dump_snapshot(str(self.run_dir.cuda_snapshot))
                torch.cuda.memory._record_memory_history(enabled=None)
                peaks["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
                peaks["cuda_max_reserved"] = torch.cuda.max_memory_reserved()
            peaks["process_rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            peaks["process_rss"] = psutil.Process().memory_info().rss

    def _attach_oom_observer(self) -> None:
        """Dump the allocator state at the moment of an out-of-memory error, before tensors are freed."""
        path = str(self.run_dir.oom_snapshot)

        def observer(device, alloc, device_alloc, device_free):  # signature fixed by torch
            torch.cuda.memory._dump_snapshot(path)

        torch._C._cuda_attach_out_of_memory_observer(observer)
