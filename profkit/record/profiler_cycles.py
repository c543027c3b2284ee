"""A torch.profiler cycle over a phase's steps, and the time cycle: CPU (+CUDA) activities, shapes and FLOPs, with
nothing that distorts timing (the memory cycle, ``memory_cycle``, is separate for that)."""

from __future__ import annotations

import json
from typing import Callable

import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from profkit import store
from profkit.core.quiet import library_output
from profkit.record.environment import cpu_wait_share, scheduler_times
from profkit.record.phase_labels import PhaseLabels
from profkit.record.phase_schedule import PhaseWork
from profkit.store.manifest import RunRecord


class ProfilerCycle(PhaseWork):
    """One profiler cycle over ``steps`` steps: the profiler's warm-up step, then the rest recorded, with the phase
    labels installed."""

    def __init__(self, run_dir: store.RunDir, labels: PhaseLabels, record: RunRecord, cuda: bool, steps: int):
        self.run_dir, self.labels, self.record, self.cuda, self.steps = run_dir, labels, record, cuda, steps
        self.profiler: profile | None = None

    def start_profiler(self, on_trace_ready: Callable[[profile], None], **options) -> None:
        self.labels.install()
        self.profiler = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []),
            # repeat=1: one cycle; with the default (0) a new, empty cycle starts after the trace is saved.
            schedule=schedule(wait=0, warmup=1, active=self.steps - 1, repeat=1),
            on_trace_ready=on_trace_ready, **options)
        run = {"run": self.record.run, "method": self.record.method}
        self.profiler.preset_metadata_json("profkit", json.dumps(run))
        if not (dist.is_available() and dist.is_initialized()):
            # Kineto writes distributedInfo only under torch.distributed; HTA needs a rank to load a trace.
            self.profiler.preset_metadata_json("distributedInfo",
                                               json.dumps({"backend": "none", "rank": 0, "world_size": 1}))
        with self.native_output():
            self.profiler.start()

    def step(self, last: bool) -> None:
        if self.profiler is not None:
            with self.native_output():
                self.profiler.step()

    def stop(self) -> None:
        profiler, self.profiler = self.profiler, None
        if profiler is not None:
            self.labels.close_data()
            with self.native_output():
                profiler.stop()  # mid-cycle, this still exports what was captured

    def native_output(self):
        """Kineto's native progress lines and the profiler's deprecation warnings: into the run's profiler.log."""
        return library_output(self.run_dir.profiler_log)


class TimeCycle(ProfilerCycle):
    def start(self) -> None:
        self.scheduler = scheduler_times()
        trace = str(self.run_dir.time_trace)
        self.start_profiler(lambda p: p.export_chrome_trace(trace), record_shapes=True, with_flops=True)
        self.labels.open_data()

    def finish(self) -> None:
        if self.record.timings:
            # Before the profiler writes its trace: the profiled steps' own waits only.
            self.record.timings["profiled_cpu_wait_share"] = cpu_wait_share(self.scheduler, scheduler_times())
