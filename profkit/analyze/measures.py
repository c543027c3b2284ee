"""What each memory-saving measure did: every pair of complete runs that differ by one measure only (LoRA, 4-bit
weights, gradient checkpointing, ZeRO-2, ZeRO-3, FSDP), with the memory it saved and the time it cost.

A pair is found from the runs' manifests, never from their names: run b is run a with the measure applied and
every other setting equal (the engine, the ranks and the rank included). Memory is exact, so every memory
change is stated; a time change only where the two runs' clean-step ranges do not overlap (``noise``), and not
at all for a run whose clean steps look disturbed (``disturbed``). Pure pandas over a Breakdown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from profkit.analyze import Breakdown, noise


@dataclass(frozen=True)
class Measure:
    name: str
    setting: str  # the setting the measure turns on
    before: object  # its value without the measure
    after: tuple  # its values with it
    also: tuple[str, ...] = ()  # settings that come with it (LoRA's rank, ZeRO's offload)
    neither: dict = field(default_factory=dict)  # settings both runs must have (no other sharding)

    def applies(self, a: dict, b: dict) -> bool:
        if a.get(self.setting) != self.before or b.get(self.setting) not in self.after:
            return False
        if any(run.get(k, v) != v for run in (a, b) for k, v in self.neither.items()):
            return False
        free = {self.setting, *self.also}
        return all(a.get(k) == b.get(k) for k in set(a) | set(b) if k not in free)


SHARDING = ("zero_stage", "fsdp", "offload", "reshard_after_forward")
MEASURES = (
    Measure("LoRA", "adapter", "none", ("lora",), ("lora_r", "lora_alpha", "lora_dropout", "lora_targets",
                                                   "learning_rate")),
    Measure("4-bit weights", "quantization", None, ("nf4", "fp4"), ("double_quant",)),
    Measure("gradient checkpointing", "gradient_checkpointing", False, (True,)),
    Measure("ZeRO-2", "zero_stage", 0, (2,), SHARDING, {"fsdp": False}),
    Measure("ZeRO-3", "zero_stage", 0, (3,), SHARDING, {"fsdp": False}),
    Measure("FSDP", "fsdp", False, (True,), SHARDING, {"zero_stage": 0}),
)
# Settings that name a run rather than change what it does.
NOT_A_SETTING = {"name", "description", "variant"}

# Changes are fractions (new / old - 1) and ratios (new / old): a sentence says "+9%" or, beyond doubling, "5.9x".
MEASURE_COLUMNS = ["measure", "base", "run", "kind", "base_peak_bytes", "peak_bytes", "peak_change", "peak_ratio",
                   "base_activation_peak_bytes", "activation_peak_bytes", "activation_peak_change",
                   "activation_peak_ratio", "peak_phase", "base_clean_step_s", "clean_step_s", "clean_step_change",
                   "clean_step_ratio", "time_verdict"]


def shape(bd: Breakdown, run: str) -> dict:
    """What a run is, from its manifest: its method's settings, its kind, engine, rank and ranks."""
    rec = bd.records[run]
    out = {k: (tuple(sorted(v)) if isinstance(v, list) else v) for k, v in rec.settings.items()
           if k not in NOT_A_SETTING}
    return {**out, "kind": rec.kind, "engine": rec.engine, "rank": rec.rank, "world_size": rec.world_size}


def complete(bd: Breakdown) -> list[str]:
    """profkit runs that were measured and broken down."""
    if bd.runs.empty:
        return []
    ok = set(bd.runs.run[bd.runs.status == "ok"])
    broken_down = set(bd.memory.run)
    return [r for r in bd.records if r in ok and r in broken_down]


def _change(new, old) -> float:
    return float(new) / float(old) - 1 if pd.notna(new) and pd.notna(old) and old else math.nan


def peak_phase(bd: Breakdown, run: str) -> str | None:
    """The phase in which the run's peak fell: the phase whose own peak is the largest."""
    m = bd.measured[(bd.measured.run == run) & (bd.measured.phase != "peak")] if len(bd.measured) else bd.measured
    return None if m.empty else str(m.loc[m.measured_peak_bytes.idxmax(), "phase"])


def time_verdict(bd: Breakdown, a: str, b: str) -> str:
    """slower / faster (b against a, beyond both runs' spreads), within noise, disturbed, or unmeasured."""
    runs = bd.runs.set_index("run")
    if any(isinstance(runs.loc[r, "disturbed"], str) for r in (a, b)):
        return "disturbed"
    if any(pd.isna(runs.loc[r, "clean_step_time_s"]) for r in (a, b)):
        return "unmeasured"
    diff = noise.clean_step(bd, a, b)
    if not diff.measurable:
        return "within noise"
    return "slower" if diff.value > 0 else "faster"


def measure_pairs(bd: Breakdown) -> pd.DataFrame:
    """One row per (measure, base run, run with the measure): ``MEASURE_COLUMNS``; changes are fractions
    (new / old - 1)."""
    runs = complete(bd)
    shapes = {r: shape(bd, r) for r in runs}
    table = bd.runs.set_index("run")
    rows = []
    for measure in MEASURES:
        for a in runs:
            for b in runs:
                if a == b or not measure.applies(shapes[a], shapes[b]):
                    continue
                ra, rb = table.loc[a], table.loc[b]
                rows.append({
                    "measure": measure.name, "base": a, "run": b, "kind": shapes[b]["kind"],
                    "base_peak_bytes": ra.measured_peak_bytes, "peak_bytes": rb.measured_peak_bytes,
                    "peak_change": _change(rb.measured_peak_bytes, ra.measured_peak_bytes),
                    "peak_ratio": _change(rb.measured_peak_bytes, ra.measured_peak_bytes) + 1,
                    "base_activation_peak_bytes": ra.activation_peak_bytes,
                    "activation_peak_bytes": rb.activation_peak_bytes,
                    "activation_peak_change": _change(rb.activation_peak_bytes, ra.activation_peak_bytes),
                    "activation_peak_ratio": _change(rb.activation_peak_bytes, ra.activation_peak_bytes) + 1,
                    "peak_phase": peak_phase(bd, b),
                    "base_clean_step_s": ra.clean_step_time_s, "clean_step_s": rb.clean_step_time_s,
                    "clean_step_change": _change(rb.clean_step_time_s, ra.clean_step_time_s),
                    "clean_step_ratio": _change(rb.clean_step_time_s, ra.clean_step_time_s) + 1,
                    "time_verdict": time_verdict(bd, a, b),
                })
    return pd.DataFrame(rows, columns=MEASURE_COLUMNS)
