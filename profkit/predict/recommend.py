"""Which methods fit a memory budget, fastest first.

Candidates come from recorded runs (measured peak and clean step time at the batch they ran) and, for methods
without a run, from the estimator: on a named GPU, each method at the largest batch that fits (``fit``'s search)
with the step time predicted there; without one, the predicted peak at the given batch. Pure pandas; the command
decides where they come from.
"""

from __future__ import annotations

import pandas as pd

COLUMNS = ["method", "source", "batch_size", "peak_bytes", "step_time_s", "tokens_per_s", "time_costs", "fits"]
# What each memory-saving measure is known to cost in time, heaviest first, for ranking methods no one has run:
# ZeRO-3 and FSDP (resharding after forward) gather every layer's weights in forward and again in backward; 4-bit weights are dequantized at every
# use; gradient checkpointing runs the forward a second time; ZeRO-2 adds bucketed reductions and copies;
# 8-bit and paged optimizers (de)quantize their state each step; offload moves state over PCIe every step.
TIME_COSTS = {"offload": 5, "zero3": 4, "fsdp": 4, "fsdp_no_reshard": 2, "quantization": 3, "gradient_checkpointing": 3, "zero2": 1,
              "8bit_optimizer": 1}


def from_breakdown(runs: pd.DataFrame) -> pd.DataFrame:
    """Measured candidates: training runs that completed, with their measured peak and clean step time."""
    if runs.empty or "measured_peak_bytes" not in runs:
        return pd.DataFrame(columns=COLUMNS[:-1])
    ok = runs[(runs.status == "ok") & runs.measured_peak_bytes.notna()]
    batch = [s.get("batch_size") if isinstance(s, dict) else None for s in ok.get("settings", [None] * len(ok))]
    return pd.DataFrame({"method": ok.method, "source": "measured", "batch_size": batch,
                         "peak_bytes": ok.measured_peak_bytes.astype("int64"),
                         "step_time_s": ok.clean_step_time_s, "tokens_per_s": ok.tokens_per_s,
                         "time_costs": [[] for _ in range(len(ok))]}).reset_index(drop=True)


def time_costs(settings: dict) -> list[str]:
    """The measures a method's settings take that are known to cost time, heaviest first."""
    found = []
    if settings.get("offload", "none") != "none":
        found.append("offload")
    if settings.get("zero_stage") == 3:
        found.append("zero3")
    if settings.get("fsdp"):
        found.append("fsdp" if settings.get("reshard_after_forward", True) else "fsdp_no_reshard")
    if settings.get("quantization"):
        found.append("quantization")
    if settings.get("gradient_checkpointing"):
        found.append("gradient_checkpointing")
    if settings.get("zero_stage") == 2:
        found.append("zero2")
    if "8bit" in str(settings.get("optimizer", "")):
        found.append("8bit_optimizer")
    return found


def from_estimates(estimates, times: dict | None = None) -> pd.DataFrame:
    """Estimated peaks: reserved bytes on CUDA (what a measured CUDA run's peak is, and what runs out), allocated on
    CPU; ``times``: method -> its predicted StepTime on a GPU (source "predicted")."""
    times = times or {}
    return pd.DataFrame([{"method": e.method, "source": "predicted" if e.method in times else "estimated",
                          "batch_size": e.settings.get("batch_size"), "peak_bytes": e.reserved()["bytes"] if e.reserved() else e.peak_bytes,
                          "step_time_s": times[e.method].seconds if e.method in times else None,
                          "tokens_per_s": times[e.method].tokens_per_s if e.method in times else None,
                          "time_costs": time_costs(e.settings.get("method", {}))} for e in estimates],
                        columns=COLUMNS[:-1])


def from_fit(rows: list[dict], methods) -> pd.DataFrame:
    """Predicted candidates from ``fit.fit_methods``' rows (with a GPU): each method at the largest batch that fits,
    its check there (what nvidia-smi would show, or the allocated peak) and the step time predicted at it; a method
    where not even one sample fits, its check at batch 1. ``fits`` is the search's verdict, not a comparison."""
    out = []
    for r, method in zip(rows, methods):
        if "refused" in r:
            continue
        b, step = r["batch"], r.get("step_time")
        check = b.at if b.largest else b.past
        out.append({"method": r["method"], "source": "predicted" if step else "estimated",
                    "batch_size": b.largest or 1, "peak_bytes": check["device_used_bytes"] or check["peak_bytes"],
                    "step_time_s": step.seconds if step else None, "tokens_per_s": step.tokens_per_s if step else None,
                    "time_costs": time_costs(method.settings()), "fits": bool(b.largest)})
    return pd.DataFrame(out, columns=COLUMNS)


def rank(candidates: pd.DataFrame, budget_bytes: int) -> pd.DataFrame:
    """Every candidate with ``fits`` (where a candidate does not say, its peak within the budget); those that fit
    first: measured ones, then predicted ones, each by tokens/s (at the batch each ran or fits), then estimated
    ones (no GPU named) by what their memory-saving measures are known to cost in time (``TIME_COSTS``: fewer and
    lighter first; the larger peak breaks ties) -- an order from knowledge, not a measurement. Those that do not
    fit follow, closest to the budget first."""
    cost = candidates.time_costs.map(lambda found: (len(found), sum(TIME_COSTS[m] for m in found)))
    order = {"measured": 0, "predicted": 1, "estimated": 2}
    within = candidates.peak_bytes <= budget_bytes
    fits = candidates.fits.where(candidates.fits.notna(), within) if "fits" in candidates else within
    c = candidates.assign(fits=fits.astype(bool), _source=candidates.source.map(order),
                          _n=cost.map(lambda x: x[0]), _weight=cost.map(lambda x: x[1]),
                          _speed=-pd.to_numeric(candidates.tokens_per_s, errors="coerce"))
    fit = c[c.fits].sort_values(["_source", "_speed", "_n", "_weight", "peak_bytes"],
                                ascending=[True, True, True, True, False])
    rest = c[~c.fits].sort_values("peak_bytes")
    return pd.concat([fit, rest], ignore_index=True)[COLUMNS]
