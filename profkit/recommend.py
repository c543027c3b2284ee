"""Which methods fit a memory budget, fastest first.

Candidates come from recorded runs (measured peak and clean step time) and, for methods without a run,
from the estimator (predicted peak, no step time). Pure pandas; the command decides where they come from.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["method", "source", "peak_bytes", "step_time_s", "tokens_per_s", "fits"]


def from_breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """Measured candidates: training runs that completed, with their measured peak and clean step time."""
    if runs.empty or "measured_peak_bytes" not in runs:
        return pd.DataFrame(columns=COLUMNS[:-1])
    ok = runs[(runs.status == "ok") & runs.measured_peak_bytes.notna()]
    return pd.DataFrame({"method": ok.method, "source": "measured", "peak_bytes": ok.measured_peak_bytes.astype("int64"),
                         "step_time_s": ok.clean_step_time_s, "tokens_per_s": ok.tokens_per_s}).reset_index(drop=True)


def from_estimates(estimates) -> pd.DataFrame:
    return pd.DataFrame([{"method": e.method, "source": "estimated", "peak_bytes": e.peak_bytes,
                          "step_time_s": None, "tokens_per_s": None} for e in estimates], columns=COLUMNS[:-1])


def rank(candidates: pd.DataFrame, budget_bytes: int) -> pd.DataFrame:
    """Every candidate with ``fits``; those that fit first: measured ones by step time, then estimated ones
    by predicted peak, largest first (the fewest memory-saving measures, which each cost time: recompute,
    dequantization, ZeRO's copies). Those that do not fit follow, closest to the budget first."""
    c = candidates.assign(fits=candidates.peak_bytes <= budget_bytes,
                          _measured=candidates.source == "measured")
    fit = c[c.fits].sort_values(["_measured", "step_time_s", "peak_bytes"], ascending=[False, True, False])
    rest = c[~c.fits].sort_values("peak_bytes")
    return pd.concat([fit, rest], ignore_index=True)[COLUMNS]
