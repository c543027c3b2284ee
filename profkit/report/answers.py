"""The answers to the study's questions, a short paragraph each, from the measure pairs (``analyze.measures``)
and the at-a-glance table (``analyze.glance``): every figure is one of theirs, with its run, so a reader can
find it in ``breakdown --format json`` (``measures``, ``at_a_glance``).

1. What did each memory-saving measure save, and what did it cost in time?
2. Which combinations bring nothing over a simpler one (the "negative synergy" cases)?
3. Which method is best for a memory budget?
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profkit.analyze import Breakdown
from profkit.analyze.glance import at_a_glance
from profkit.analyze.measures import measure_pairs
from profkit.core.units import human_bytes, human_seconds

# A measure "brings nothing" when it lowers the peak by less than this fraction of it. Memory is measured to the
# byte, so this is not a noise band but the smallest saving worth a method's complexity.
NOTHING = 0.01
LISTED = 4  # pairs named in a sentence; the rest are counted (all are in the JSON's measures)


@dataclass(frozen=True)
class Answer:
    question: str
    lead: str  # the answer in a sentence
    points: tuple[str, ...] = ()  # one per measure, or per run

    @property
    def text(self) -> str:
        return " ".join((self.lead, *self.points))


def _pct(x: float) -> str:
    """A change: to a tenth of a percent below 1%, in whole percents to +100%, as a ratio beyond."""
    if x > 1:
        return f"{x + 1:.1f}x"
    return f"{100 * x:+.1f}%" if abs(x) < 0.01 else f"{100 * x:+.0f}%"


def _sentence(name: str) -> str:
    """A measure's name opening a sentence ("LoRA" stays as it is)."""
    return name[0].upper() + name[1:]


def _pair(p: pd.Series, value: str = "peak_change") -> str:
    return f"{p.run} vs {p.base}: {_pct(p[value])}"


def _listed(pairs: pd.DataFrame, value: str = "peak_change") -> str:
    named = [_pair(p, value) for _, p in pairs.head(LISTED).iterrows()]
    more = len(pairs) - LISTED
    return "; ".join(named) + (f"; and {more} more" if more > 0 else "")


def _time(pairs: pd.DataFrame) -> str:
    """What the measure cost in clean step time, counted by verdict, with the range of the measurable ones."""
    parts = []
    for verdict, words in (("slower", "slower"), ("faster", "faster")):
        g = pairs[pairs.time_verdict == verdict].sort_values("clean_step_change")
        if len(g):
            lo, hi = g.iloc[0], g.iloc[-1]
            span = (f"{_pct(lo.clean_step_change)} ({lo.run} vs {lo.base})" if len(g) == 1 else
                    f"{_pct(lo.clean_step_change)} ({lo.run} vs {lo.base}) to {_pct(hi.clean_step_change)} "
                    f"({hi.run} vs {hi.base})")
            parts.append(f"{words} in {len(g)} ({span})")
    for verdict, words in (("within noise", "no measurable difference in {n} (the steps' ranges overlap)"),
                           ("disturbed", "not compared in {n} (a run's clean steps look disturbed)"),
                           ("unmeasured", "not timed in {n}")):
        n = int((pairs.time_verdict == verdict).sum())
        if n:
            parts.append(words.format(n=n))
    return "clean step " + ", ".join(parts)


def _saved(measure: str, pairs: pd.DataFrame) -> str:
    pairs = pairs.sort_values("peak_change")
    lo, hi = pairs.iloc[0], pairs.iloc[-1]
    n = len(pairs)
    head = f"{_sentence(measure)} ({n} pair{'s' if n > 1 else ''})"
    if n == 1:
        text = (f"{head}, {lo.run} vs {lo.base}: peak {_pct(lo.peak_change)} ({human_bytes(lo.base_peak_bytes)} -> "
                f"{human_bytes(lo.peak_bytes)})")
    else:
        text = (f"{head}: peak from {_pct(lo.peak_change)} ({lo.run} vs {lo.base}: {human_bytes(lo.base_peak_bytes)} "
                f"-> {human_bytes(lo.peak_bytes)}) to {_pct(hi.peak_change)} ({hi.run} vs {hi.base}: "
                f"{human_bytes(hi.base_peak_bytes)} -> {human_bytes(hi.peak_bytes)})")
    if measure == "gradient checkpointing" and pairs.activation_peak_change.notna().any():
        a = pairs.dropna(subset=["activation_peak_change"]).sort_values("activation_peak_change")
        first, last = a.iloc[0], a.iloc[-1]
        text += (f"; the activation peak (activations at their own largest, which is what it changes) from "
                 f"{_pct(first.activation_peak_change)} ({first.run}: {human_bytes(first.base_activation_peak_bytes)} "
                 f"-> {human_bytes(first.activation_peak_bytes)}) to {_pct(last.activation_peak_change)} ({last.run})")
    return f"{text}; {_time(pairs)}."


def _saving(pairs: pd.DataFrame, foreign: bool) -> Answer:
    question = "What did each memory-saving measure save, and what did it cost in time?"
    if pairs.empty:
        return Answer(question, "No two complete runs here differ by one measure only (LoRA, 4-bit weights, "
                                "gradient checkpointing, ZeRO-2/3, FSDP), so no measure can be isolated"
                                + (" (a trace recorded by others carries no method settings)." if foreign else "."))
    points = tuple(_saved(m, g) for m, g in pairs.groupby("measure", sort=False))
    ranges = []
    for measure, g in pairs.groupby("measure", sort=False):
        g = g.sort_values("peak_change")
        lo, hi = g.iloc[0], g.iloc[-1]
        span = (f"{_pct(lo.peak_change)} ({lo.run})" if len(g) == 1 else
                f"{_pct(lo.peak_change)} ({lo.run}) to {_pct(hi.peak_change)} ({hi.run})")
        extra = ""
        if measure == "gradient checkpointing" and g.activation_peak_change.notna().any():
            a = g.dropna(subset=["activation_peak_change"]).sort_values("activation_peak_change")
            extra = (f"; activation peak {_pct(a.iloc[0].activation_peak_change)} ({a.iloc[0].run}) to "
                     f"{_pct(a.iloc[-1].activation_peak_change)} ({a.iloc[-1].run})")
        ranges.append(f"{measure} {span}, {len(g)} pair{'s' if len(g) > 1 else ''}{extra}")
    return Answer(question, "The peak with each measure against the same method without it, every other setting "
                            "equal: " + "; ".join(ranges) + ". The pairs, and the time each cost, below (a time "
                            "difference counts only beyond both runs' spreads).", points)


def _nothing(pairs: pd.DataFrame, glance: pd.DataFrame) -> Answer:
    question = "Which combinations bring nothing over a simpler one?"
    if pairs.empty:
        return Answer(question, "Not answerable here: no two complete runs differ by one measure only.")
    useless = pairs[pairs.peak_change > -NOTHING]
    if useless.empty:
        return Answer(question, f"None: in all {len(pairs)} pairs, the measure lowered the peak of the method it "
                                f"was added to by {NOTHING:.0%} or more.")
    owners = glance.set_index("run")
    points = []
    for measure, g in useless.groupby("measure", sort=False):
        total = int((pairs.measure == measure).sum())
        g = g.sort_values("peak_change", ascending=False)
        top = g.iloc[0]
        why = ""
        if top.run in owners.index and isinstance(owners.loc[top.run, "memory_first"], str):
            o = owners.loc[top.run]
            where = {"optimizer": "at the optimizer step", "forward": "in the forward pass",
                     "backward": "in the backward pass"}.get(top.peak_phase, "")
            why = (f". {top.run}'s peak{(' falls ' + where + ' and') if where else ''} is "
                   f"{o.memory_first_share:.0%} {o.memory_first}")
        points.append(f"{_sentence(measure)} did not lower the peak by {NOTHING:.0%} or more in {len(g)} of {total} pairs "
                      f"({_listed(g)}){why}; {_time(g)}.")
    counts = ", ".join(f"{m} in {len(g)} of {int((pairs.measure == m).sum())}"
                       for m, g in useless.groupby("measure", sort=False))
    return Answer(question, f"In {len(useless)} of {len(pairs)} pairs the measure did not lower the peak by "
                            f"{NOTHING:.0%} or more: {counts}.", tuple(points))


def _speed(r: pd.Series) -> str:
    return (f"{r.run} ({human_seconds(r.clean_step_s)} per step, {r.tokens_per_s:,.0f} tokens/s, peak "
            f"{human_bytes(r.peak_bytes)})")


def _budget(glance: pd.DataFrame, budget_bytes: int | None) -> Answer:
    question = "Which method is best for a memory budget?"
    train = glance[(glance.kind == "train") & (glance.status == "ok")]
    timed = train[train.clean_step_s.notna() & train.disturbed.isna()]
    disturbed = list(train.run[train.disturbed.notna()])
    left_out = (f" Not ranked, their clean steps look disturbed: {', '.join(disturbed)}." if disturbed else "")
    if timed.empty:
        traces = int((glance.status == "foreign").sum())
        why = (" (traces recorded by others have no clean steps: time them with `profkit record` or "
               "`profkit.Session` for one)" if traces else "")
        return Answer(question, f"Not answerable here: no complete training run with undisturbed clean steps{why}."
                      + left_out)
    if budget_bytes is not None:
        fits = timed[timed.within_budget == True].sort_values("clean_step_s")  # noqa: E712 (None: unknown)
        over = train[train.within_budget == False].sort_values("peak_bytes")  # noqa: E712
        if fits.empty:
            text = f"Nothing fits {human_bytes(budget_bytes)}"
            if len(over):
                text += f"; the smallest is {over.iloc[0].run} (peak {human_bytes(over.iloc[0].peak_bytes)})"
            return Answer(question, text + "." + left_out)
        lead = (f"Within {human_bytes(budget_bytes)}, fastest first: "
                + ", ".join(_speed(r) for _, r in fits.head(3).iterrows()) + ".")
        points = []
        if len(over):
            points.append(f"{len(over)} do not fit (the smallest of them: {over.iloc[0].run}, "
                          f"{human_bytes(over.iloc[0].peak_bytes)}).")
        if disturbed:
            points.append(left_out.strip())
        return Answer(question, lead, tuple(points))
    fastest = timed.loc[timed.clean_step_s.idxmin()]
    smallest = timed.loc[timed.peak_bytes.idxmin()]
    front = [r for _, r in timed.sort_values("peak_bytes").iterrows()
             if not ((timed.peak_bytes <= r.peak_bytes) & (timed.clean_step_s < r.clean_step_s)).any()]
    lead = f"The fastest is {_speed(fastest)}; the smallest peak is {_speed(smallest)}."
    points = [f"No other run is both smaller and faster than these {len(front)}, smallest peak first: "
              + ", ".join(f"{r.run}" for r in front) + ". Give --budget to rank the runs within a memory budget."]
    if disturbed:
        points.append(left_out.strip())
    return Answer(question, lead, tuple(points))


def answers(bd: Breakdown, budget_bytes: int | None = None) -> list[Answer]:
    pairs = measure_pairs(bd)
    glance = at_a_glance(bd, budget_bytes)
    foreign = bool(len(bd.runs)) and bool((bd.runs.status == "foreign").any())
    return [_saving(pairs, foreign), _nothing(pairs, glance), _budget(glance, budget_bytes)]
