"""Predicted against measured: the estimate a run recorded in its manifest (``profkit.predict.estimate``, made
before the run) set beside the memory breakdown of the same run.

Each category is compared where both sides mean the same instant: parameters and optimizer state (static)
and activations at the forward phase's peak (the loss, where the logits are live beside everything saved
for backward); gradients at the optimizer phase's peak (where every gradient exists). For generation: weights and
activations at the prefill's peak, the KV cache at the last decode pass's. The measured peak is
set beside the predicted peak too (on CUDA the allocated peak beside the allocated one, and the predicted reserved
beside ``max_memory_reserved``); it is shown, not held to a target: transients inside backward and the optimizer
step are modelled roughly.
"""

from __future__ import annotations

import pandas as pd

PREDICTED_COLUMNS = ["category", "phase", "predicted_bytes", "measured_bytes", "error"]
# category -> (the estimate's instant, the breakdown's phase)
COMPARED = {
    "parameters_trainable": ("forward", "forward"),
    "parameters_frozen": ("forward", "forward"),
    "parameters_quantized": ("forward", "forward"),
    "optimizer_state": ("forward", "forward"),
    "gradients": ("optimizer", "optimizer"),
    "activations": ("forward", "forward"),
}
# generate(): weights and the transients at the prompt's pass, the KV cache at the last pass (its largest)
COMPARED_INFERENCE = {
    "parameters_frozen": ("prefill", "prefill"),
    "parameters_quantized": ("prefill", "prefill"),
    "kv_cache": ("decode", "decode"),
    "activations": ("prefill", "prefill"),
}


def predicted_vs_measured(estimate: dict, memory: pd.DataFrame, measured: pd.DataFrame,
                          cuda_peaks: dict | None = None) -> pd.DataFrame:
    """Rows per compared category plus ``peak``; ``error`` is predicted / measured - 1 (None when measured
    is 0 and so is the prediction's scale meaningless). ``cuda_peaks``: a CUDA run's ``cuda_max_allocated`` and
    ``cuda_max_reserved``; with them the predicted allocated peak is set beside the allocated one (the
    breakdown's measured peak on CUDA is reserved memory) and the predicted reserved beside the reserved one."""
    rows = []
    compared = COMPARED_INFERENCE if "prefill" in estimate["instants"] else COMPARED
    for category, (instant, phase) in compared.items():
        got = memory[(memory.phase == phase) & (memory.category == category)].bytes
        if got.empty or instant not in estimate["instants"]:
            continue
        rows.append(_row(category, phase, estimate["instants"][instant][category], int(got.iloc[0])))
    reserved = estimate.get("reserved")
    if cuda_peaks and "cuda_max_allocated" in cuda_peaks:
        rows.append(_row("peak", "peak", estimate["peak_bytes"], int(cuda_peaks["cuda_max_allocated"])))
        if reserved and "cuda_max_reserved" in cuda_peaks:
            rows.append(_row("reserved", "peak", reserved["bytes"], int(cuda_peaks["cuda_max_reserved"])))
        return pd.DataFrame(rows, columns=PREDICTED_COLUMNS)
    peak = measured[measured.phase == "peak"].measured_peak_bytes
    if not peak.empty:
        rows.append(_row("peak", "peak", estimate["peak_bytes"], int(peak.iloc[0])))
    return pd.DataFrame(rows, columns=PREDICTED_COLUMNS)


def _row(category: str, phase: str, predicted: int, measured: int) -> dict:
    error = predicted / measured - 1 if measured else (0.0 if predicted == 0 else None)
    return {"category": category, "phase": phase, "predicted_bytes": int(predicted), "measured_bytes": measured,
            "error": error}


PREDICTED_TIME_COLUMNS = ["category", "predicted_s", "measured_s", "error"]


def predicted_time(estimate: dict, time: pd.DataFrame, clean_step_s: float | None) -> pd.DataFrame:
    """A GPU run's step time as ``profkit estimate --gpu`` predicted it before the run (the manifest's
    ``estimate.step_time``), beside what its trace measured: each predicted category against the GPU's kernel time
    in it per profiled step (exposed and overlapped together: the prediction does not model overlap), and the
    step against the clean step. Empty where the run has no such prediction or no GPU time."""
    step = (estimate or {}).get("step_time") or {}
    gpu = time[time.resource == "gpu"] if len(time) else time
    if "seconds_by_category" not in step or gpu.empty:
        return pd.DataFrame(columns=PREDICTED_TIME_COLUMNS)
    kernels = gpu.groupby("category")[["seconds", "overlapped_seconds"]].sum().sum(axis=1)
    rows = [_time_row(c, s, float(kernels.get(c, 0.0))) for c, s in step["seconds_by_category"].items()
            if c != "host_overhead"]  # the host's launches are not kernel time
    if clean_step_s:
        rows.append(_time_row("step", step["step_time_s"], float(clean_step_s)))
    return pd.DataFrame(rows, columns=PREDICTED_TIME_COLUMNS)


def _time_row(category: str, predicted: float, measured: float) -> dict:
    return {"category": category, "predicted_s": float(predicted), "measured_s": measured,
            "error": predicted / measured - 1 if measured else None}
