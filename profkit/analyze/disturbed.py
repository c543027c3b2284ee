"""Whether a run's clean steps look disturbed: timed while something else competed for the machine.

Two signs, each a fact about the run's own measurements, never about other runs:
- its clean steps are slower than its profiled steps (median against median). The profiler only adds work to
  a step, so a clean step slower than a profiled one was slowed by something outside the run;
- its clean steps are spread wide: the slowest takes ``WIDE_SPREAD`` times the fastest or more. Identical steps
  of one process on a quiet machine differ by a few percent; half as long again is another process's work.
A disturbed run is flagged, and its time is neither compared nor explained: its memory still is (memory does
not depend on what else ran).
"""

from __future__ import annotations

import math

from profkit.core.units import human_seconds

WIDE_SPREAD = 1.5  # slowest clean step over the fastest ("half as long again")


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
    return "; ".join(reasons) or None
