"""Which phase of a recording each call of ``Session.step()`` falls in, and what runs during a phase. Pure: no torch.

Phases, in order, each a number of steps (memory instrumentation distorts timing, so time and memory get separate
cycles):

1. warm-up steps (caches, lazy allocations, DeepSpeed buckets);
2. timed steps with no profiler and no instrumentation: clean step time, tokens/s, loss;
3. the time cycle: the profiler's warm-up step, then the profiled steps;
4. the memory cycle: the profiler's warm-up step, then the memory steps;
5. done: every step after the last is ignored.

The labels of the work inside a step (forward, backward, optimizer...) are another thing: ``phase_labels``.
"""

from __future__ import annotations

PHASES = ("warmup", "timed", "time_profile", "memory_profile")
DONE = "done"


class PhaseSchedule:
    """The steps each phase takes, and where a session is in them: ``begin()``, then ``count_step()`` after every
    step and ``next_phase()`` after a phase's last."""

    def __init__(self, warmup_steps: int = 2, timed_steps: int = 5, profiled_steps: int = 2, memory_steps: int = 1):
        for name, value in (("warmup_steps", warmup_steps), ("timed_steps", timed_steps),
                            ("profiled_steps", profiled_steps), ("memory_steps", memory_steps)):
            if not isinstance(value, int) or value < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"Session({name}={value!r}): a whole number, at least "
                                 f"{0 if name == 'warmup_steps' else 1}")
        # A profiling cycle starts with the profiler's own warm-up step.
        self.plan = dict(zip(PHASES, (warmup_steps, timed_steps, 1 + profiled_steps, 1 + memory_steps)))
        self.phase: str | None = None  # None until begin()
        self.steps = 0  # steps counted so far

    @property
    def total_steps(self) -> int:
        return sum(self.plan.values())

    @property
    def done(self) -> bool:
        return self.phase == DONE

    def end_of(self, phase: str) -> int:
        """The number of steps counted when ``phase`` ends."""
        return sum(self.plan[p] for p in PHASES[:PHASES.index(phase) + 1])

    def phase_of(self, step: int) -> str:
        """The phase the step with index ``step`` (from 0) falls in; ``done`` past the last."""
        return next((phase for phase in PHASES if step < self.end_of(phase)), DONE)

    @property
    def in_phase(self) -> int:
        """Steps counted in the current phase."""
        return self.steps - self.end_of(self.phase) + self.plan[self.phase] if self.phase in self.plan else 0

    def on_last_step(self) -> bool:
        """Whether the step running now (not counted yet) is its phase's last."""
        return self.phase in self.plan and self.steps == self.end_of(self.phase) - 1

    def begin(self) -> str:
        self.phase = self.phase_of(0)  # a phase of no steps (no warm-up) is skipped
        return self.phase

    def count_step(self) -> bool:
        """Count a step of the current phase; whether it was the phase's last."""
        self.steps += 1
        return self.steps == self.end_of(self.phase)

    def next_phase(self) -> str:
        self.phase = self.phase_of(self.steps)
        return self.phase


class PhaseWork:
    """What runs during one phase, stepped by the session; this one runs nothing (a warm-up off CUDA, done)."""

    def start(self) -> None:
        pass

    def measure(self, tokens: int, loss) -> None:
        """The step that just ended, as its forwards saw it (``loss``: the last forward's, a tensor, or None)."""

    def step(self, last: bool) -> None:
        """After each step of the phase; ``last``: its last."""

    def finish(self) -> None:
        """Every step of the phase ran: what only a complete phase records."""

    def stop(self) -> None:
        """Stop what runs, keeping what it captured: after ``finish``, or when the session closes mid-phase."""
