"""Whether a difference between two runs is more than noise.

A profiled step on a busy machine varies by tens of percent from step to step, so a time difference is
claimed only when the two runs' spreads do not overlap: each run's range of values over its steps, and over
every repetition of the run when it was recorded with ``--repeats`` (a fresh process each: the noise between
processes, which the steps of one process cannot show). For the clean step, the ranges are those of the timed
steps. For a time category, they are its host time in each profiled step, widened by the run's relative
step-to-step spread of clean steps (one profiled step alone has no range); where the run's threads waited for a
CPU during its profiled steps (``disturbed.profiled_contention``), from zero up: another process's work only
adds time, by an amount the trace cannot show. A range, not a standard error:
conservative on purpose, since a noise read as an effect is the error this guards against. Two single
recordings can still differ by process-to-process noise that neither shows; ``--repeats`` measures it.
Pure pandas, from a Breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from profkit.analyze import Breakdown


@dataclass(frozen=True)
class Difference:
    value: float  # b - a (medians, or the mean per profiled step for categories)
    a_range: tuple[float, float]
    b_range: tuple[float, float]

    @property
    def measurable(self) -> bool:
        return self.b_range[0] > self.a_range[1] or self.a_range[0] > self.b_range[1]

    def ranges(self, fmt) -> str:
        return f"{fmt(self.a_range[0])}-{fmt(self.a_range[1])} against {fmt(self.b_range[0])}-{fmt(self.b_range[1])}"


def repetitions(bd: Breakdown, run: str) -> list[str]:
    """The runs that are repetitions of the same run as ``run`` (``<run>/rep<k>``), itself included."""
    runs = bd.runs.set_index("run")
    if "repetition_of" not in runs or pd.isna(runs.loc[run, "repetition_of"]):
        return [run]
    parent = Path(runs.loc[run, "path"]).parent
    return [r for r, p in runs.path.items() if Path(p).parent == parent]


def _step_times(bd: Breakdown, run: str) -> list[float]:
    record = bd.records.get(run)
    return list((record.timings or {}).get("step_times_s") or []) if record is not None else []


def _range(values) -> tuple[float, float]:
    values = [v for v in values if pd.notna(v)]
    return (min(values), max(values)) if values else (np.nan, np.nan)


def clean_step(bd: Breakdown, a: str, b: str) -> Difference:
    runs = bd.runs.set_index("run")
    ranges = [_range([t for r in repetitions(bd, x) for t in _step_times(bd, r)] or [runs.loc[x, "clean_step_time_s"]])
              for x in (a, b)]
    return Difference(float(runs.loc[b, "clean_step_time_s"] - runs.loc[a, "clean_step_time_s"]), *ranges)


def _relative_spread(bd: Breakdown, run: str) -> tuple[float, float]:
    times = _step_times(bd, run)
    if len(times) < 2:
        return 1.0, 1.0
    median = float(np.median(times))
    return min(times) / median, max(times) / median


def contended(bd: Breakdown, run: str) -> str | None:
    """Why ``run``'s profiled steps (or a repetition's) are upper bounds only, or None."""
    runs = bd.runs.set_index("run")
    if "profiled_contended" not in runs:
        return None
    return next((runs.loc[r, "profiled_contended"] for r in repetitions(bd, run)
                 if isinstance(runs.loc[r, "profiled_contended"], str)), None)


def _category_range(bd: Breakdown, run: str, category: str) -> tuple[float, float]:
    values = [0.0] if contended(bd, run) else []
    for r in repetitions(bd, run):
        steps = bd.time_per_step[bd.time_per_step.run == r]
        n = int(steps.step.max()) + 1 if len(steps) else 0
        per_step = steps[steps.category == category].set_index("step").seconds.reindex(range(n), fill_value=0.0)
        lo, hi = _relative_spread(bd, r)
        mean = float(per_step.mean()) if n else 0.0
        values += list(per_step) + [mean * lo, mean * hi]
    return _range(values)


def category(bd: Breakdown, a: str, b: str, name: str, seconds_a: float, seconds_b: float) -> Difference:
    return Difference(seconds_b - seconds_a, _category_range(bd, a, name), _category_range(bd, b, name))


def _per_request(bd: Breakdown, run: str, key: str) -> list[float]:
    """A generation latency per request: the TTFT of each, or the median TPOT of each one's decode passes."""
    record = bd.records.get(run)
    timings = (record.timings or {}) if record is not None else {}
    values = list(timings.get(f"{key}_s") or [])
    if key != "tpot" or not values:
        return values
    requests = len(timings.get("ttft_s") or []) or 1
    per = max(len(values) // requests, 1)
    return [float(np.median(values[i:i + per])) for i in range(0, len(values), per)]


def latency(bd: Breakdown, a: str, b: str, key: str) -> Difference:
    """``ttft`` or ``tpot`` of b against a: medians, and the ranges over requests (every repetition's)."""
    values = [[v for r in repetitions(bd, x) for v in _per_request(bd, r, key)] for x in (a, b)]
    medians = [float(np.median(v)) if v else np.nan for v in values]
    return Difference(medians[1] - medians[0], _range(values[0]), _range(values[1]))
