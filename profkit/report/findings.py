"""Findings: short sentences generated from a Breakdown, each quoting the figures behind it.

A rule only speaks when the runs it compares are present and complete; no sentence without numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from profkit.analyze import Breakdown, noise, ranks, views
from profkit.analyze.measures import measure_pairs
from profkit.core.units import human_bytes, human_seconds, signed_bytes, signed_ms
from profkit.report import tables


def _pct(new: float, old: float) -> float:
    return 100.0 * (new - old) / old if old else float("nan")


# The settings that make two runs the same method apart from the one difference a finding is about.
SHAPE = ("adapter", "quantization", "gradient_checkpointing", "zero_stage", "fsdp", "lora_r", "lora_targets")
PLAIN_LORA = {"kind": "train", "adapter": "lora", "quantization": None, "zero_stage": 0, "gradient_checkpointing": False}


class _View:
    def __init__(self, bd: Breakdown):
        self.bd = bd
        self.records = bd.records
        self.runs = bd.runs.set_index("run") if not bd.runs.empty else pd.DataFrame()
        self.mem = views.memory_at(bd)
        self.tim = views.time_per_step(bd)
        self.ok = set(self.runs.index[self.runs.status == "ok"]) if len(self.runs) else set()

    def has(self, *runs: str) -> bool:
        return all(r in self.ok and r in self.mem.index and r in self.tim.index for r in runs)

    def m(self, run: str, cat: str) -> float:
        return float(self.mem.loc[run, cat]) if cat in self.mem.columns else 0.0

    def t(self, run: str, cat: str) -> float:
        v = self.tim.loc[run, cat] if cat in self.tim.columns else 0.0
        return 0.0 if pd.isna(v) else float(v)

    def profiled(self, run: str) -> float:
        return float(self.tim.loc[run].sum())

    def clean(self, run: str) -> float:
        return float(self.runs.loc[run, "clean_step_time_s"])

    def disturbed(self, run: str) -> bool:
        return isinstance(self.runs.loc[run].get("disturbed"), str)

    def sharded(self, run: str) -> bool:
        settings = self.records[run].settings
        return bool(settings.get("zero_stage") or settings.get("fsdp"))

    def clean_change(self, a: str, b: str) -> str:
        """b's clean step time against a's, or that they do not measurably differ (within the spread of the
        timed steps of both runs), or that a run's clean steps look disturbed and are not compared."""
        disturbed = [r for r in (a, b) if self.disturbed(r)]
        if disturbed:
            return (f"clean step time not compared: the clean steps of {' and '.join(disturbed)} look disturbed "
                    "(see the flagged runs)")
        diff = noise.clean_step(self.bd, a, b)
        if not diff.measurable:
            return (f"no measurable difference in clean step time ({human_seconds(self.clean(b))} vs "
                    f"{human_seconds(self.clean(a))}: their steps' ranges, {diff.ranges(human_seconds)}, overlap)")
        return (f"clean step time {_pct(self.clean(b), self.clean(a)):+.0f}% ({human_seconds(self.clean(b))} vs "
                f"{human_seconds(self.clean(a))}; steps {diff.ranges(human_seconds)})")

    def peak(self, run: str) -> float:
        return float(self.runs.loc[run, "measured_peak_bytes"])

    def params(self, run: str) -> float:
        return sum(self.m(run, c) for c in ("parameters_trainable", "parameters_frozen", "parameters_quantized"))

    def shape(self, run: str) -> dict:
        """What a run's method is, from its manifest (never from its name), plus the engine that ran it."""
        rec = self.records[run]
        out = {k: rec.settings.get(k) for k in SHAPE}
        out["lora_targets"] = tuple(sorted(out["lora_targets"] or ()))
        out["fsdp"] = bool(out["fsdp"])
        # A rank of a sharded run is compared with the same rank of another run with as many ranks.
        return {**out, "kind": rec.kind, "engine": rec.engine, "rank": rec.rank, "world_size": rec.world_size}

    def pairs(self, base: dict, change: dict) -> list[tuple[str, str]]:
        """Complete runs (a, b) where a matches ``base`` and b is a with only ``change`` applied."""
        runs = [r for r in self.records if r in self.ok and r in self.mem.index and r in self.tim.index]
        shapes = {r: self.shape(r) for r in runs}
        return [(a, b) for a in runs if all(shapes[a].get(k) == v for k, v in base.items())
                for b in runs if shapes[b] == {**shapes[a], **change}]


@dataclass(frozen=True)
class Finding:
    """One sentence with what ranks it: ``size``, the relative size of the effect it states (a change as a
    fraction, a share of the step); ``compared``, the runs it sets side by side; ``instant``, when the figures
    were taken."""

    text: str
    size: float
    compared: str
    instant: str


def findings(bd: Breakdown) -> list[str]:
    """The findings' sentences, the largest effect first."""
    return [f.text for f in ranked(bd)]


def ranked(bd: Breakdown) -> list[Finding]:
    v = _View(bd)
    out: list[Finding] = []
    pairs = measure_pairs(bd)
    gc = pairs[(pairs.measure == "gradient checkpointing") & pairs.base.map(lambda r: not v.sharded(r))]
    for _, p in gc.iterrows():
        out.append(_checkpointing(v, p))
    for lora, full in v.pairs(PLAIN_LORA, {"adapter": "none", "lora_r": None, "lora_targets": ()}):
        out.append(Finding(
            f"LoRA ({lora}) trains {human_bytes(v.m(lora, 'parameters_trainable'))} of parameters instead of "
            f"{human_bytes(v.m(full, 'parameters_trainable'))} ({full}), so its optimizer state is "
            f"{human_bytes(v.m(lora, 'optimizer_state'))} against full fine-tuning's "
            f"{human_bytes(v.m(full, 'optimizer_state'))}; its peak is {human_bytes(v.peak(lora))} against "
            f"{human_bytes(v.peak(full))}; {v.clean_change(full, lora)}.",
            abs(_pct(v.peak(lora), v.peak(full))) / 100, f"{lora} against {full}", "at each run's peak"))
    for lora, qlora in v.pairs(PLAIN_LORA, {"quantization": "nf4"}):
        q = v.m(qlora, "parameters_quantized")
        out.append(Finding(
            f"QLoRA ({qlora}) holds {human_bytes(v.params(qlora))} of parameters against LoRA's "
            f"{human_bytes(v.params(lora))} (NF4 weights with their quantization state: {human_bytes(q)}); 4-bit "
            f"(de)quantization costs {human_seconds(v.t(qlora, 'quantization'))} per profiled step; "
            f"{v.clean_change(lora, qlora)}.",
            abs(_pct(v.params(qlora), v.params(lora))) / 100, f"{qlora} against {lora}", "at each run's peak"))
    for stage in (2, 3):
        for lora, z in v.pairs(PLAIN_LORA, {"zero_stage": stage}):
            deltas = {c: v.m(z, c) - v.m(lora, c) for c in v.mem.columns}
            top = max(deltas, key=lambda c: deltas[c])
            out.append(Finding(
                f"ZeRO-{stage} on one process ({z}) has no one to shard with: its peak is "
                f"{human_bytes(v.peak(z))} against LoRA's {human_bytes(v.peak(lora))} "
                f"({_pct(v.peak(z), v.peak(lora)):+.0f}%), the largest growth being {top} "
                f"(+{human_bytes(deltas[top])}); optimizer state grows by "
                f"{human_bytes(deltas.get('optimizer_state', 0))} (an fp32 master copy), and communication takes "
                f"{human_seconds(v.t(z, 'communication'))} per profiled step.",
                abs(_pct(v.peak(z), v.peak(lora))) / 100, f"{z} against {lora}", "at each run's peak"))
    for zero3, fsdp in v.pairs({"kind": "train", "zero_stage": 3}, {"zero_stage": 0, "fsdp": True}):
        out.append(Finding(_fsdp_beside_zero3(v, zero3, fsdp), abs(_pct(v.peak(fsdp), v.peak(zero3))) / 100,
                           f"{fsdp} against {zero3}", "at each run's peak"))
    for fp16, int4 in v.pairs({"kind": "infer", "quantization": None}, {"quantization": "nf4"}):
        out.append(Finding(_quantized_inference(v, fp16, int4), abs(_pct(v.params(int4), v.params(fp16))) / 100,
                           f"{int4} against {fp16}", "weights as loaded; the KV cache after the last decode pass"))
    # A disturbed run's clean step is not a measure of the run: it is left out of the profiler's cost.
    ratios = {r: v.profiled(r) / v.clean(r) for r in v.tim.index
              if r in v.ok and pd.notna(v.runs.loc[r, "clean_step_time_s"]) and v.clean(r) > 0
              and not v.disturbed(r)}
    if ratios:
        lo, hi = min(ratios, key=ratios.get), max(ratios, key=ratios.get)
        out.append(Finding(
            f"Profiling costs time: a profiled step takes {ratios[lo]:.1f}x ({lo}) to {ratios[hi]:.1f}x ({hi}) the "
            f"clean step, so time categories below are shares of the profiled step and absolute step times come "
            f"from the unprofiled steps.", ratios[hi] - 1, "each run's profiled step against its clean steps",
            "medians of the clean steps and of the profiled steps"))
    out += work_findings(bd)
    out += [Finding(s, size, "two engines, one method", "at each run's peak") for s, size in _engine_differences(bd)]
    out += [Finding(s, size, "within one run", "per profiled step")
            for s, size in _idle(bd) + _exposure(bd)]
    out += [Finding(s, size, "the ranks of one job", "per profiled step") for s, size in _ranks(bd)]
    return sorted(out, key=lambda f: -f.size)


def flags(bd: Breakdown) -> list[str]:
    """Runs whose figures are not what they seem: not measured, or timed while something else ran."""
    if bd.runs.empty:
        return []
    out = []
    for _, r in bd.runs.iterrows():
        if r.status not in ("ok", "foreign"):
            out.append(f"{r.run} was not measured: status {r.status} ({r.get('reason') or 'no reason recorded'}).")
        elif isinstance(r.get("disturbed"), str):
            out.append(f"{r.run}: its clean steps look disturbed ({r.disturbed}); its time is neither compared nor "
                       "explained here (its memory is). Record it again on a quiet machine, or with --repeats.")
    return out


def _checkpointing(v: _View, p: pd.Series) -> Finding:
    """What gradient checkpointing changes is the activation peak; the run's peak may fall elsewhere (at the
    optimizer step, when activations are gone), and the sentence says where."""
    base, gc = p.base, p.run
    where = PHASE_WORDS.get(p.peak_phase, f"in the {p.peak_phase} phase")
    text = (f"Gradient checkpointing ({gc} vs {base}) cut the activation peak (activations at their own largest "
            f"during the step) by {-100 * p.activation_peak_change:.0f}% "
            f"({human_bytes(p.base_activation_peak_bytes)} -> {human_bytes(p.activation_peak_bytes)}); the run's "
            f"peak, which falls {where}, changed by {100 * p.peak_change:+.0f}% ({human_bytes(p.base_peak_bytes)} "
            f"-> {human_bytes(p.peak_bytes)}); recompute takes {human_seconds(v.t(gc, 'recompute'))} per profiled "
            f"step; {v.clean_change(base, gc)}.")
    return Finding(text, abs(p.activation_peak_change) if pd.notna(p.activation_peak_change) else 0.0,
                   f"{gc} against {base}", "activations at their own largest; each run's peak where it falls")


PHASE_WORDS = {"forward": "in the forward pass", "backward": "in the backward pass",
               "optimizer": "at the optimizer step, when activations are gone"}


def _fsdp_beside_zero3(v: _View, zero3: str, fsdp: str) -> str:
    """The same method sharded by FSDP2 and by ZeRO-3 on as many ranks: what each rank holds, and its time."""
    where = (f"rank {v.records[fsdp].rank} of {v.records[fsdp].world_size}" if v.records[fsdp].world_size > 1
             else "one process")
    return (f"FSDP2 ({fsdp}) beside ZeRO-3 ({zero3}), {where}: parameters held {human_bytes(v.params(fsdp))} "
            f"against {human_bytes(v.params(zero3))}, with {human_bytes(v.m(fsdp, 'parameters_unsharded'))} gathered "
            f"at FSDP's peak; optimizer state {human_bytes(v.m(fsdp, 'optimizer_state'))} against "
            f"{human_bytes(v.m(zero3, 'optimizer_state'))} (ZeRO-3 adds an fp32 master partition); gradients "
            f"{human_bytes(v.m(fsdp, 'gradients'))} against {human_bytes(v.m(zero3, 'gradients'))} at the peak; "
            f"peak {human_bytes(v.peak(fsdp))} against {human_bytes(v.peak(zero3))} "
            f"({_pct(v.peak(fsdp), v.peak(zero3)):+.0f}%); communication "
            f"{human_seconds(v.t(fsdp, 'communication'))} against {human_seconds(v.t(zero3, 'communication'))} per "
            f"profiled step; {v.clean_change(zero3, fsdp)}.")


def _quantized_inference(v: _View, fp16: str, int4: str) -> str:
    """Where NF4 generation's time goes (dequantization per decode pass), what it saves (weights, set beside the
    KV cache) and at which length the cache outgrows the 4-bit weights."""

    bd, runs = v.bd, v.runs
    timings = bd.records[int4].timings or {}
    # Decode passes per request, as timed (the run's own, so a user's Session-driven generation counts too).
    passes = max(len(timings.get("tpot_s") or []) // max(len(timings.get("ttft_s") or []), 1), 1)
    decode = bd.time[(bd.time.run == int4) & (bd.time.phase == "decode") & (bd.time.category == "quantization")]
    per_pass = float(decode.seconds.sum()) / passes
    tpot = lambda r: runs.loc[r, "tpot_median_s"]
    diff = noise.latency(bd, int4, fp16, "tpot")  # ranges in the sentence's order: int4 first
    verdict = "" if diff.measurable else "; no measurable difference: the requests' ranges overlap"
    saved = v.params(fp16) - v.params(int4)
    text = (f"NF4 inference ({int4}) vs {fp16}: 4-bit (de)quantization takes {human_seconds(per_pass)} of each "
            f"profiled decode pass ({passes} per request), and a decode pass takes {human_seconds(tpot(int4))} "
            f"against {human_seconds(tpot(fp16))} unprofiled (median TPOT; per request "
            f"{diff.ranges(human_seconds)}{verdict}); it holds {human_bytes(v.params(int4))} "
            f"of weights against {human_bytes(v.params(fp16))}, saving {human_bytes(saved)}")
    kv, tokens = runs.loc[int4, "kv_cache_bytes"], runs.loc[int4, "kv_cache_tokens"]
    if pd.notna(kv) and pd.notna(tokens) and tokens:
        per_token = kv / tokens  # the whole batch's cache per position: it grows linearly
        overtakes = int(v.params(int4) // per_token) + 1
        batch = int((bd.records[int4].run_settings or {}).get("batch_size") or 1)
        text += (f", while its KV cache holds {human_bytes(kv)} after {int(tokens)} positions "
                 f"({human_bytes(per_token)} each at batch {batch}); the cache outgrows the 4-bit weights beyond "
                 f"{overtakes:,} positions")
    return text + "."


ENGINE_NAMES = {"loop": "profkit's loop", "trainer": "transformers.Trainer", "session": "a user's loop"}
BUCKET_ORIGIN = {"loop": "DeepSpeed's default", "trainer": "Hugging Face's \"auto\": hidden_size^2"}


WORK_MARGIN = 1.1  # "more work": at least this many times the other run's model FLOPs per step


def work_findings(bd: Breakdown) -> list[Finding]:
    """More work in less time: run a does at least ``WORK_MARGIN`` times b's model FLOPs per step, on the same
    device and tokens per step, yet its clean step is measurably shorter. Not a contradiction in a measurement --
    it says that b's time is not spent on its arithmetic -- but a figure to check wherever it is claimed without
    one (a published comparison: ``estimate`` holds those to the device's peak)."""
    v = _View(bd)
    if v.runs.empty or "model_flop_per_step" not in v.runs:
        return []
    runs = [r for r in v.ok if pd.notna(v.runs.loc[r, "model_flop_per_step"]) and v.runs.loc[r, "model_flop_per_step"] > 0
            and pd.notna(v.runs.loc[r, "clean_step_time_s"]) and r in bd.records]
    # Only runs one measure apart (LoRA against full, 4-bit against 16-bit weights): between any two runs the
    # sentence would be said of every pair, and say nothing about a method.
    pairs = measure_pairs(bd)
    one_apart = {frozenset(p) for p in zip(pairs.base, pairs.run)}
    out = []
    for a in runs:
        for b in runs:
            if frozenset((a, b)) not in one_apart:
                continue
            same = (bd.records[a].timings.get("tokens_per_step") == bd.records[b].timings.get("tokens_per_step")
                    and v.runs.loc[a, "device_name"] == v.runs.loc[b, "device_name"])
            work_a, work_b = v.runs.loc[a, "model_flop_per_step"], v.runs.loc[b, "model_flop_per_step"]
            if not same or work_a < WORK_MARGIN * work_b or v.clean(a) >= v.clean(b):
                continue
            if v.disturbed(a) or v.disturbed(b) or not noise.clean_step(bd, a, b).measurable:
                continue
            rate_a, rate_b = work_a / v.clean(a), work_b / v.clean(b)
            out.append(Finding(
                f"More work in less time: {a} does {work_a / work_b:.2f}x the model FLOPs per step of {b} "
                f"({work_a / 1e9:,.2f} vs {work_b / 1e9:,.2f} GFLOP) in {v.clean(a) / v.clean(b):.2f}x its clean "
                f"step ({human_seconds(v.clean(a))} vs {human_seconds(v.clean(b))}): {a} computes at "
                f"{rate_a / 1e9:,.1f} GFLOP/s, {b} at {rate_b / 1e9:,.1f}, so {b}'s extra time is not arithmetic "
                f"(its categories say what it is).", work_a / work_b - 1, f"{a} against {b}",
                "model FLOPs per step; medians of the clean steps"))
    return out


def engine_differences(bd: Breakdown) -> list[str]:
    return [text for text, _ in _engine_differences(bd)]


def _engine_differences(bd: Breakdown) -> list[tuple[str, float]]:
    """One method recorded by two engines (``profkit record --engine loop|trainer``): where the memory differs,
    and, for ZeRO, the reduce bucket each engine's DeepSpeed config gave the optimizer."""
    v = _View(bd)
    out = []
    by_method: dict[str, dict[str, str]] = {}
    for run, rec in bd.records.items():
        by_method.setdefault(rec.method, {})[rec.engine] = run
    for method, engines in by_method.items():
        a, b = engines.get("loop"), engines.get("trainer")
        if not (a and b and v.has(a, b)):
            continue
        deltas = {c: v.m(a, c) - v.m(b, c) for c in v.mem.columns}
        top = max(deltas, key=lambda c: abs(deltas[c]))
        sentence = (f"{a} ({ENGINE_NAMES['loop']}) vs {b} ({ENGINE_NAMES['trainer']}): peak {human_bytes(v.peak(a))} "
                    f"vs {human_bytes(v.peak(b))}, the largest difference in {top} ({'+' if deltas[top] >= 0 else '-'}"
                    f"{human_bytes(abs(deltas[top]))}); clean step {human_seconds(v.clean(a))} vs "
                    f"{human_seconds(v.clean(b))}")
        za, zb = (bd.records[r].model.get("zero") or {} for r in (a, b))
        if "reduce_bucket_size" in za and "reduce_bucket_size" in zb:
            sentence += (f". DeepSpeed's reduce bucket holds {za['reduce_bucket_size']:,} elements under "
                         f"{ENGINE_NAMES['loop']} ({BUCKET_ORIGIN['loop']}) against {zb['reduce_bucket_size']:,} under "
                         f"the Trainer ({BUCKET_ORIGIN['trainer']})")
        out.append((sentence + ".", abs(deltas[top]) / max(v.peak(a), v.peak(b), 1)))
    return out


def exposure_sentences(bd: Breakdown) -> list[str]:
    return [text for text, _ in _exposure(bd)]


def _exposure(bd: Breakdown) -> list[tuple[str, float]]:
    """GPU runs: each category that ran partly hidden under other work, with its exposed share
    ("communication 37.0 ms per step, of which 30.0 ms exposed")."""
    gpu = bd.time[bd.time.resource == "gpu"]
    out = []
    for run, g in gpu.groupby("run", sort=False):
        cats = g.groupby("category")[["seconds", "overlapped_seconds"]].sum()
        cats = cats[cats.overlapped_seconds > 1e-3 * (cats.seconds + cats.overlapped_seconds).sum()]
        pieces = [f"{cat} {human_seconds(r.seconds + r.overlapped_seconds)}, of which {human_seconds(r.seconds)} "
                  f"exposed" for cat, r in cats.sort_values("overlapped_seconds", ascending=False).iterrows()]
        if pieces:
            out.append((f"{run} (GPU, per step; the rest ran under higher-priority work): " + "; ".join(pieces),
                        float(cats.seconds.sum() / g.seconds.sum()) if g.seconds.sum() else 0.0))
    return out


def idle_sentences(bd: Breakdown) -> list[str]:
    return [text for text, _ in _idle(bd)]


def _idle(bd: Breakdown) -> list[tuple[str, float]]:
    """GPU runs: why the GPU was idle, per profiled step."""
    idle = bd.time_by_name[(bd.time_by_name.resource == "gpu") & (bd.time_by_name.category == "idle")]
    out = []
    for run, g in idle.groupby("run", sort=False):
        g = g[g.seconds > 0].sort_values("seconds", ascending=False)
        if len(g):
            reasons = ", ".join(f"{human_seconds(r.seconds)} {r['name'].removeprefix('idle: ')}" for _, r in g.iterrows())
            step = bd.time[(bd.time.run == run) & (bd.time.resource == "gpu")].seconds.sum()
            out.append((f"{run}: GPU idle {human_seconds(g.seconds.sum())} per step: {reasons}",
                        float(g.seconds.sum() / step) if step else 0.0))
    return out


def time_differences(bd: Breakdown, baseline: str) -> pd.DataFrame:
    """Per run against ``baseline``, each time category's difference per profiled step, the two runs' ranges
    (``analyze.noise``) and whether the difference exceeds them (``measurable``)."""
    d = tables.deltas(bd, baseline)
    d = d[d.kind == "time"]
    tim = views.time_per_step(bd)
    rows = []
    for run, category, delta in zip(d.run, d.category, d.delta):
        value_a, value_b = (tim.loc[r].get(category, 0.0) if r in tim.index else 0.0 for r in (baseline, run))
        diff = noise.category(bd, baseline, run, category, 0.0 if pd.isna(value_a) else float(value_a),
                              0.0 if pd.isna(value_b) else float(value_b))
        rows.append({"run": run, "baseline": baseline, "category": category, "delta_s": delta,
                     "measurable": diff.measurable, "baseline_low_s": diff.a_range[0],
                     "baseline_high_s": diff.a_range[1], "run_low_s": diff.b_range[0], "run_high_s": diff.b_range[1]})
    return pd.DataFrame(rows, columns=["run", "baseline", "category", "delta_s", "measurable", "baseline_low_s",
                                       "baseline_high_s", "run_low_s", "run_high_s"])


def delta_sentences(bd: Breakdown, baseline: str, top: int = 3) -> list[str]:
    """Per run, its largest differences from ``baseline``: memory (exact, from the inventory and the timeline) and
    time, where a time difference counts only if it exceeds the spread measured in the same runs
    (``time_differences``); the rest is said to be within the noise, with the band."""
    d = tables.deltas(bd, baseline)
    times = time_differences(bd, baseline)
    runs = bd.runs.set_index("run")
    out = []
    for run, g in d.groupby("run", sort=False):
        pieces = []
        m = g[g.kind == "memory"]
        m = m.reindex(m.delta.abs().sort_values(ascending=False).index).head(top)
        pieces += [f"{c} {signed_bytes(v)}" for c, v in zip(m.category, m.delta)]
        disturbed = [r for r in (baseline, run) if isinstance(runs.loc[r].get("disturbed"), str)] \
            if run in runs.index and baseline in runs.index else []
        t = times[times.run == run]
        measurable = t.measurable.astype(bool)
        real = sorted(zip(t.category[measurable], t.delta_s[measurable]), key=lambda x: -abs(x[1]))
        within = int((~measurable).sum())
        pieces += [f"{c} {signed_ms(v)}" for c, v in real[:top]]
        if within:
            pieces.append("no measurable time difference" + ("" if real else " in any category") +
                          (f" in {within} other categories" if real else "") +
                          " (within the runs' step-to-step spread)")
        contended = [(r, why) for r in (baseline, run) if (why := noise.contended(bd, r))]
        if contended:  # their ranges reach down to zero, so only a difference larger than a whole value is claimed
            pieces += [f"the category times of {r} are upper bounds only: {why}" for r, why in contended]
        clean = noise.clean_step(bd, baseline, run)
        if disturbed:  # the profiled steps' categories are still compared (their own spreads); the clean step not
            pieces.append(f"clean step not compared: the clean steps of {' and '.join(disturbed)} look disturbed"
                          + (", which the time differences above may include" if real else ""))
        elif pd.notna(clean.value):
            pieces.append(f"clean step {signed_ms(clean.value)} (steps {clean.ranges(human_seconds)})"
                          if clean.measurable else
                          f"clean step: no measurable difference ({signed_ms(clean.value)}; steps "
                          f"{clean.ranges(human_seconds)} overlap)")
        if pieces:
            out.append(f"{run} vs {baseline}: " + ", ".join(pieces))
    return out


def rank_sentences(bd: Breakdown) -> list[str]:
    return [text for text, _ in _ranks(bd)]


def _ranks(bd: Breakdown) -> list[tuple[str, float]]:
    """Per group: the rank the others wait for (or lockstep), the step-start skew, what each rank holds."""
    out = []
    summary, verdicts, memory = ranks.rank_summary(bd), ranks.verdict(bd), ranks.rank_memory(bd)
    for group, runs in ranks.groups(bd).items():
        s = summary[summary.group == group].set_index("run")
        v = verdicts[verdicts.group == group].iloc[0]
        if v.verdict == "straggler":
            does = max((("computes", v.compute_s - v.peers_compute_s), ("leaves its device idle", v.idle_s -
                        v.peers_idle_s)), key=lambda item: item[1])
            out.append((f"{group}: the others wait for rank {v['rank']}: it waits {human_seconds(v.waiting_s)} per "
                       f"step in collectives against a median of {human_seconds(v.peers_waiting_s)} for its peers, "
                       f"and {does[0]} {human_seconds(does[1])} more than they do"
                       + (" (host-bound: its host runs late)" if does[0].startswith("leaves") else "") + ".",
                       # the share of the step its peers spend waiting for it
                       float((v.peers_waiting_s - v.waiting_s) / s.step_s.max()) if s.step_s.max() else 0.0))
        else:
            out.append((f"{group}: the ranks are in lockstep: no rank waits in collectives less than the others by "
                        f"more than the noise ({human_seconds(v.noise_s)} per step); steps "
                        f"{human_seconds(s.step_s.min())} to {human_seconds(s.step_s.max())}.", 0.0))
        out.append((f"{group}: the first profiled step started {s.start_skew_ms.max():.2f} ms apart between the "
                    "earliest and the latest rank.", 0.0))
        mem = memory[(memory.group == group) & memory.parameters_fraction.notna()]
        if len(mem):
            n = len(runs)
            low, high = mem.parameters_fraction.min(), mem.parameters_fraction.max()
            share = f"{low:.1%}" if high - low < 5e-4 else f"{low:.1%} to {high:.1%}"
            record = bd.records.get(runs[0])
            found = (record.model.get("found") or {}) if record else {}
            stage = found.get("zero_stage")
            why = (f"; FSDP splits each parameter's first dimension {n} ways, padded to a multiple of {n}"
                   if found.get("fsdp") else
                   f"; ZeRO-3 splits each parameter {n} ways (1/{n} = {1 / n:.1%}) except those below DeepSpeed's "
                   "persistence threshold, which every rank keeps whole" if stage == 3 else
                   f"; ZeRO-{stage} partitions gradients and optimizer state only, so every rank holds every parameter"
                   if stage in (1, 2) else "")
            out.append((f"{group}: each rank holds {share} of the model's parameter bytes{why}.", 0.0))
    out.extend((f"{why}.", 0.0) for why in dict.fromkeys(ranks.unmatched(bd).values()))
    return out
