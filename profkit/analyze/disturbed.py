"""Whether a run's clean steps look disturbed: timed while something else competed for the machine.

Three signs, each a fact about the run's own measurements, never about other runs:
- its clean steps are slower than its profiled steps (median against median). The profiler only adds work to
  a step, so a clean step slower than a profiled one was slowed by something outside the run;
- its clean steps are spread wide: the slowest takes ``WIDE_SPREAD`` times the fastest or more. Identical steps
  of one process on a quiet machine differ by a few percent; half as long again is another process's work;
- its threads waited for a CPU (ready to run, another task on every core) for ``CONTENDED_WAIT_SHARE`` of the
  time they were ready to run, or more, as Linux's scheduler counted it during the clean steps.
The same wait during the profiled steps makes their category times upper bounds only (``profiled_contention``):
a waiting thread stalls the others at the next parallel region's barrier, so a step slows by far more than the
share itself (on this project's 2-core machine, a 50% wait share gave steps 2.3 to 23 times as long).
A disturbed run is flagged, and its time is neither compared nor explained: its memory still is (memory does
not depend on what else ran).
"""

from __future__ import annotations

import math

from profkit.core.units import human_seconds

WIDE_SPREAD = 1.5  # slowest clean step over the fastest ("half as long again")
# Quiet, this machine's recordings wait for under 0.2% of their ready time; a tenth is another process's work.
CONTENDED_WAIT_SHARE = 0.10


def _number(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def disturbance(run: dict) -> str | None:
    """The reason a run's clean steps look disturbed, or None. ``run``: a row of ``Breakdown.runs``."""
    clean, profiled = _number(run.get("clean_step_time_s")), _number(run.get("profiled_step_time_s"))
    fastest, slowest = _number(run.get("clean_step_min_s")), _number(run.get("clean_step_max_s"))
    reasons = []
    if clean and profiled and clean > profiled:
        reasons.append(f"its clean steps (median {human_seconds(clean)}) are slower than its profiled steps "
                       f"({human_seconds(profiled)}), which the profiler only slows")
    if fastest and slowest and slowest >= WIDE_SPREAD * fastest:
        reasons.append(f"its clean steps range from {human_seconds(fastest)} to {human_seconds(slowest)}: the "
                       "slowest took half as long again as the fastest, or more")
    share = _number(run.get("clean_cpu_wait_share"))
    if share is not None and share >= CONTENDED_WAIT_SHARE:
        reasons.append(f"its threads waited for a CPU for {share:.0%} of the time they were ready to run")
    return "; ".join(reasons) or None


def profiled_contention(run: dict) -> str | None:
    """Why a run's profiled steps' times are upper bounds only (its threads waited for a CPU), or None."""
    share = _number(run.get("profiled_cpu_wait_share"))
    if share is not None and share >= CONTENDED_WAIT_SHARE:
        return f"its threads waited for a CPU for {share:.0%} of the time they were ready to run in its profiled steps"
    return None
