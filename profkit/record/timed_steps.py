"""The timed steps: no profiler and nothing added, so their wall time is the step time; tokens/s and the loss beside
it, and for generation the latency of each token."""

from __future__ import annotations

import statistics
import time
from typing import Callable

from profkit.record.environment import cpu_wait_share, scheduler_times
from profkit.record.generation import Generation
from profkit.record.phase_schedule import PhaseWork
from profkit.store.manifest import RunRecord


class TimedSteps(PhaseWork):
    def __init__(self, sync: Callable[[], None], record: RunRecord, generation: Generation | None = None,
                 tokens_per_step: int | None = None) -> None:
        self.sync = sync  # the device's: a step has ended when its kernels have
        self.record = record
        self.generation = generation
        self.tokens_per_step = tokens_per_step  # the caller's count; else the forwards' token inputs
        self.times: list[float] = []
        self.losses: list[float] = []
        self.tokens: list[int] = []
        self.mark = 0.0
        self.scheduler: dict | None = None  # the threads' scheduler times when the steps began

    def start(self) -> None:
        self.sync()
        self.scheduler = scheduler_times()
        self.mark = time.perf_counter()

    def measure(self, tokens: int, loss) -> None:
        self.sync()
        now_s = time.perf_counter()
        if self.generation is not None:
            self.generation.step_done(self.mark)
        self.times.append(now_s - self.mark)
        self.mark = now_s
        self.tokens.append(tokens)
        if loss is not None:
            self.losses.append(float(loss.float().item()))

    def finish(self) -> None:
        median = statistics.median(self.times)
        tokens = self.tokens_per_step or (int(statistics.median(self.tokens)) if self.tokens else 0)
        self.record.timings = {"step_times_s": self.times, "step_time_s": median, "tokens_per_step": tokens,
                               "tokens_per_s": tokens / median if median > 0 else None, "losses": self.losses,
                               "cpu_wait_share": cpu_wait_share(self.scheduler, scheduler_times())}
        if self.generation is not None:
            self.record.timings.update(self.generation.timings(median))
