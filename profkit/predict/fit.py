"""What fits a device: the largest micro-batch at a sequence length and the longest sequence at a batch, per method.

A step's allocations do not change their order or number with the batch or the sequence length, only their sizes,
and each size is a product of the tensor's dimensions: linear in the batch (one batch dimension; from two rows up,
as a single row is sometimes a view where more need a copy) and at most quadratic in the sequence length (attention
scores are sequence x sequence). So the search estimates a few sample points in full (``predict.estimate``: the
accounted instants and the step's allocations, ``step_replay.AllocationTrace``), checks that they share one
structure, and interpolates every allocation and every category exactly (integer results or not at all); each
point of the search is then the interpolated step through the caching allocator's policy with the device's room,
never the model traced again. The answer and one step past it are then estimated in full: where either differs
from what the search saw (the accounting takes the larger of two parts, and the other grows faster beyond the
samples), the search runs again from samples at that point. Where the samples disagree in structure, an
interpolated size is not a whole byte count (a loss chunked by the length, say), or the second try misses too,
the search estimates each point it visits in full instead, and says so.

A setting fits when the step replayed with the room the allocator has (the device less the CUDA context, NCCL's
buffers on several ranks and the margin) finds room for every request and the allocated peak is within it; where
the step is not replayed (ZeRO, a model whose backward has no meta kernel), when what nvidia-smi would show
(reserved at the measured ratio, plus what lies outside the allocator) is within the device less the margin; on the
CPU, when the allocated peak is within the budget.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import product

from profkit.core.methods import Method, OverrideError, with_overrides
from profkit.core.settings import RunSettings
from profkit.model.build import model_config
from profkit.predict.estimate import estimate_methods
from profkit.predict.mechanisms import stacked_run
from profkit.predict.memory.result import Estimate, EstimateError
from profkit.predict.step_replay import AllocationTrace, fixed_lengths, interpolated, lagrange_weights
from profkit.predict.step_time import predict_run

__all__ = ["BATCH", "SEQUENCE", "VARY", "Accumulated", "Boundary", "Device", "EstimateError", "NotScalable", "Scaling",
           "accumulated", "boundary", "fit_methods", "sequence_limit"]

BATCH, SEQUENCE = "batch_size", "seq_len"
DEGREE = {BATCH: 1, SEQUENCE: 2}  # of each size as a polynomial in the dimension
LIMIT = {BATCH: 1 << 16, SEQUENCE: 1 << 21}  # where the search stops looking, when nothing else bounds it
STEP = {BATCH: 1, SEQUENCE: 8}  # the search's resolution: sequences in multiples of 8 tokens


# What a search may vary beside the methods themselves (checkpointing, LoRA or QLoRA and sharding are methods):
# the values tried, each method's own among them where it has one. A variant a method cannot take (offload
# without sharding) is skipped.
VARY = {"optimizer": ("adamw", "adamw-8bit", "paged-adamw-8bit"), "loss": ("chunked",),
        "offload": ("optimizer", "optimizer+params")}


def variants(methods: list[Method], vary: list[str]) -> list[Method]:
    """Each method, then its variants in what ``vary`` names (``VARY``'s keys; ValueError naming them where one is
    unknown): every combination of its own value and the alternatives the method can take."""
    unknown = [v for v in vary if v not in VARY]
    if unknown:
        raise ValueError(f"cannot vary {', '.join(unknown)}; valid: {', '.join(VARY)}")
    out = []
    for method in methods:
        out.append(method)
        for combo in product(*[(None, *VARY[v]) for v in vary]):
            changes = {k: v for k, v in zip(vary, combo) if v is not None}
            if not changes:
                continue
            try:
                variant = with_overrides(method, **changes)
            except OverrideError:
                continue
            if variant not in out:  # a value the method has already (a config's 8-bit AdamW) adds nothing
                out.append(variant)
    return out


class NotScalable(Exception):
    """The sample points do not share one structure, or a size is not a polynomial of the dimension's degree."""


@dataclass
class Device:
    """The memory a step may take: ``device_bytes`` (a GPU's or a budget) less ``margin`` of it."""

    device_bytes: int
    margin: float = 0.05
    name: str = ""

    @property
    def usable_bytes(self) -> int:
        return int(self.device_bytes * (1 - self.margin))

    def check(self, e: Estimate) -> dict:
        """Whether ``e`` fits, with its peaks, what holds the memory at its peak and the headroom left (the usable
        bytes less what nvidia-smi would show, or less the allocated peak on the CPU; negative: short by that)."""
        row = {"peak_bytes": e.peak_bytes, "at_peak": e.at_peak(), "peak_instant": e.peak_instant}
        if e.settings.get("device") != "cuda":
            return {**row, "basis": "allocated peak", "fits": e.peak_bytes <= self.usable_bytes,
                    "reserved_bytes": None, "device_used_bytes": None, "failed_request_bytes": None,
                    "headroom_bytes": self.usable_bytes - e.peak_bytes}
        used = e.device_used()
        outside = sum(used["outside_allocator"].values())
        replayed = e.on_device(self.usable_bytes) if e.trace is not None else None
        if replayed is not None:
            shown = replayed["reserved_bytes"] + outside
            return {**row, "basis": "replay", "fits": replayed["fits"], "reserved_bytes": replayed["reserved_bytes"],
                    "device_used_bytes": shown, "failed_request_bytes": replayed["failed_request_bytes"],
                    "headroom_bytes": self.usable_bytes - shown}
        return {**row, "basis": "ratio", "fits": used["bytes"] <= self.usable_bytes,
                "reserved_bytes": e.reserved()["bytes"], "device_used_bytes": used["bytes"],
                "failed_request_bytes": None, "headroom_bytes": self.usable_bytes - used["bytes"]}


def _interpolate(xs: list[int], ys: list[int], x: int) -> int:
    """The polynomial through ``(xs, ys)`` at ``x``, exactly; ``NotScalable`` where it is not a whole number."""
    total = sum(w * y for w, y in zip(lagrange_weights(xs, x), ys))
    if total.denominator != 1:
        raise NotScalable(f"a size is not a polynomial of degree {len(xs) - 1}")
    return int(total)


@dataclass
class Scaling:
    """One method's estimate as a function of one dimension, from full estimates at sample points."""

    dimension: str
    samples: dict[int, Estimate]
    _firsts: dict[int, AllocationTrace] = field(default_factory=dict, repr=False)

    def __post_init__(self):
        xs = sorted(self.samples)
        first = self.samples[xs[0]]
        if any(set(e.instants) != set(first.instants) for e in self.samples.values()):
            raise NotScalable("the instants of the step differ between sample points")
        # The steady step's first step: the sample's own trace, which its check replays too
        firsts = {x: e.trace and e.trace.first_step() for x, e in self.samples.items()}
        if any((t is None) != (firsts[xs[0]] is None) for t in firsts.values()):
            raise NotScalable("the step is replayed at some sample points only")
        if firsts[xs[0]] is not None:
            shape = [(k, h, s) for k, h, _, s in firsts[xs[0]].canonical()]
            if any([(k, h, s) for k, h, _, s in t.canonical()] != shape for t in firsts.values()):
                raise NotScalable("the step's allocations differ in order or number between sample points")
            self._firsts = firsts

    def _at(self, values: list[int], x: int) -> int:
        return _interpolate(sorted(self.samples), values, x)

    def estimate(self, x: int) -> Estimate:
        """The estimate at ``x``: instants and, where replayed, the step's allocations, interpolated."""
        xs = sorted(self.samples)
        if x in self.samples:
            return self.samples[x]
        first = self.samples[xs[0]]
        instants = {i: {c: self._at([self.samples[s].instants[i][c] for s in xs], x) for c in cats}
                    for i, cats in first.instants.items()}
        tracer: Callable | None = None
        if self._firsts:
            one_step = interpolated(self._firsts, x)
            if one_step is None:
                raise NotScalable("an interpolated allocation is not a whole, non-negative number of bytes")
            seq = x if self.dimension == SEQUENCE else first.settings["seq_len"]

            def tracer(lengths, one_step=one_step, seq=seq):
                return one_step.repeated() if tuple(lengths) == fixed_lengths(seq) else None
        settings = {**first.settings, self.dimension: x}
        return replace(first, settings=settings, instants=instants, detail=self._parts("detail", x),
                       host=self._parts("host", x), notes=list(first.notes), tracer=tracer, _on_device={})

    def _parts(self, name: str, x: int) -> dict[str, int]:
        """A dict of byte counts (``detail``, ``host``) at ``x``; the parts every sample names."""
        values = [getattr(self.samples[s], name) for s in sorted(self.samples)]
        return {k: self._at([v[k] for v in values], x) for k in values[0] if all(k in v for v in values)}


@dataclass
class Boundary:
    """The largest value of ``dimension`` that fits (None: not even the smallest) and the checks at it and one step
    past it; ``searched``: "interpolated" or "estimated at each point" (and why)."""

    method: str
    dimension: str
    fixed: int  # the other dimension's value
    largest: int | None
    at: dict | None  # Device.check at the largest
    past: dict | None  # Device.check one step past it (None: the search's limit)
    searched: str
    limit: int
    points: int  # settings checked


def _bisect(fits: Callable[[int], bool], low: int, high: int, step: int) -> int:
    """The largest multiple of ``step`` in [low, high] where ``fits`` holds, given it holds at ``low`` and not at
    ``high`` (monotone)."""
    while high - low > step:
        mid = low + (high - low) // (2 * step) * step
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


def boundary(method: Method, dimension: str, settings: RunSettings, device: Device,
             estimate: Callable[[RunSettings], Estimate], limit: int | None = None) -> Boundary:
    """The largest ``dimension`` (batch or sequence) that fits ``device``, the other held at ``settings``' value.
    ``estimate``: a full estimate of one setting (the method, stack and target fixed by the caller)."""
    step = STEP[dimension]
    other = SEQUENCE if dimension == BATCH else BATCH
    limit = limit or LIMIT[dimension]
    full: dict[int, Estimate] = {}

    def full_estimate(x: int) -> Estimate:
        if x not in full:
            full[x] = estimate(replace(settings, **{dimension: x}))
        return full[x]

    smallest = 1 if dimension == BATCH else step
    fixed = getattr(settings, other)

    def scaled_from(samples: list[int]) -> Scaling | None:
        try:
            return Scaling(dimension, {x: full_estimate(x) for x in samples})
        except NotScalable:
            return None

    def search(scaling: Scaling | None, searched: str) -> Boundary:
        checked: dict[int, dict] = {}

        def check(x: int) -> dict:
            if x not in checked:
                estimate_at = None
                if scaling is not None and (dimension == SEQUENCE or x >= 2):
                    try:
                        estimate_at = scaling.estimate(x)
                    except NotScalable:
                        pass
                checked[x] = device.check(estimate_at or full_estimate(x))
            return checked[x]

        def fits(x: int) -> bool:
            return check(x)["fits"]

        # From the user's own value: where it fits, doubling from there; where it does not, bisection below it
        # (fitting is monotone in either dimension, so the answer is the same as from the smallest value up).
        start = max(smallest, min(limit, getattr(settings, dimension) // step * step))
        if not fits(start):
            if start == smallest or not fits(smallest):
                return Boundary(method.label, dimension, fixed, None, None, check(smallest), searched, limit,
                                len(checked))
            largest = _bisect(fits, smallest, start, step)
            return Boundary(method.label, dimension, fixed, largest, check(largest), check(largest + step),
                            searched, limit, len(checked))
        low, high = start, start
        while fits(high):  # doubling, then bisection between the last that fits and the first that does not
            low = high
            if high >= limit:
                return Boundary(method.label, dimension, fixed, low, check(low), None, searched, limit, len(checked))
            high = min(limit, high * 2 if high >= step else step)
        largest = _bisect(fits, low, high, step)
        return Boundary(method.label, dimension, fixed, largest, check(largest), check(largest + step), searched,
                        limit, len(checked))

    def missed(found: Boundary) -> int | None:
        """Where the interpolated check differs from the full estimate, at the answer or one step past it."""
        for x, seen in ((found.largest, found.at),
                        (smallest if found.largest is None else found.largest + step, found.past)):
            if x is None or seen is None:
                continue
            truth = device.check(full_estimate(x))
            if (truth["fits"], truth["peak_bytes"], truth["reserved_bytes"]) != \
                    (seen["fits"], seen["peak_bytes"], seen["reserved_bytes"]):
                return x
        return None

    # Sample points: batches from 2 (see the module's docstring), sequences up to the user's length; then, where
    # the answer or one step past it disagrees with its full estimate (the accounting takes the larger of two
    # parts, and the other one grows faster past the samples), points at that answer.
    top = getattr(settings, dimension) // step * step if dimension == SEQUENCE else 3
    tries, why = [], ""
    for _ in range(2):
        lowest = 2 if dimension == BATCH else step
        samples = sorted(x for x in {top - k * step for k in range(DEGREE[dimension] + 1)} if x >= lowest)
        if len(samples) < DEGREE[dimension] + 1 or samples[-1] > limit:
            why = "too few sample points below the limit"
            break
        scaling = scaled_from(samples)
        if scaling is None:
            why = "the sample points' allocations differ in structure"
            break
        tries.append(samples)
        found = search(scaling, "interpolated from full estimates at " + ", ".join(map(str, samples)))
        x = missed(found)
        if x is None:
            return found
        why = f"the interpolation missed the full estimate at {x}"
        top = max(x, 3 if dimension == BATCH else (DEGREE[dimension] + 1) * step)
    return search(None, f"estimated at each point ({why})")


def sequence_limit(config) -> int:
    """The longest sequence the model's configuration allows (``max_position_embeddings``), or the search's limit."""
    value = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return int(value) if value else LIMIT[SEQUENCE]



@dataclass
class Accumulated:
    """An effective batch (samples per optimizer step, every rank together) as micro-batches that fit: ``micro``
    samples per rank, ``accumulation`` of them a step; ``check``: the full estimate of that very setting on the
    device; ``boundary``: the search that bounded the micro-batch (accumulating where ``accumulation`` > 1)."""

    effective: int
    micro: int | None  # None: not even one sample per rank fits
    accumulation: int
    method: Method
    check: dict | None
    boundary: Boundary


def accumulated(method: Method, effective: int, world_size: int, largest: Boundary, settings: RunSettings,
                device: Device, estimate: Callable[[Method, RunSettings], Estimate]) -> Accumulated:
    """The largest micro-batch that divides the effective batch's share of each rank and fits. Where the whole share
    does not fit at once (``largest``: the batch boundary without accumulation), the micro-batch is searched again
    with accumulation on: gradients then outlive the backward and are alive through the next micro-batch's forward
    (``grad_accum``), so the boundary can be lower; the chosen setting is then estimated in full."""
    share = effective // world_size
    if largest.largest is not None and largest.largest >= share:
        chosen = replace(settings, batch_size=share)
        return Accumulated(effective, share, 1, method, device.check(estimate(method, chosen)), largest)
    accumulating = with_overrides(method, grad_accum=2)
    found = boundary(accumulating, BATCH, settings, device, lambda s: estimate(accumulating, s), limit=share)
    if found.largest is None:
        return Accumulated(effective, None, 0, accumulating, None, found)
    micro = max(d for d in range(1, found.largest + 1) if share % d == 0)
    final = with_overrides(method, grad_accum=share // micro) if share > micro else method
    check = device.check(estimate(final, replace(settings, batch_size=micro)))
    return Accumulated(effective, micro, share // micro, final, check, found)


def fit_methods(methods: list[Method], settings: RunSettings, device: Device, target: str, world_size: int = 1,
                stack=None, given: dict | None = None, gpu=None, effective_batch: int | None = None,
                dimensions: tuple[str, ...] = (BATCH, SEQUENCE),
                progress: Callable[[str], None] = lambda _: None) -> list[dict]:
    """Per method: the largest batch at ``settings``' sequence length and the longest sequence at its batch, each
    with the checks at the boundary and one step past it; with ``effective_batch`` (samples per optimizer step,
    every rank together), the largest micro-batch that keeps it with gradient accumulation (``Accumulated``); with a
    ``gpu``, the step time predicted at the largest batch, or at the accumulated setting. A method the estimator
    does not model is kept with its reason (``refused``). ``dimensions``: the searches to run (the batch's is
    always run: the step time and the accumulated setting start from it)."""
    settings = settings.resolved()
    limit = sequence_limit(model_config(settings))
    rows = []
    def with_method(m: Method, s: RunSettings) -> Estimate:
        [e] = estimate_methods([m], s, target, world_size, stack, given)
        return e

    for method in methods:
        one = functools.partial(with_method, method)

        row = {"method": method.label, "seq_len": settings.seq_len, "batch_size": settings.batch_size}
        try:
            progress(f"{method.label}: the largest batch at {settings.seq_len} tokens")
            row["batch"] = boundary(method, BATCH, settings, device, one)
            if SEQUENCE in dimensions:
                progress(f"{method.label}: the longest sequence at batch {settings.batch_size}")
                row["sequence"] = boundary(method, SEQUENCE, settings, device, one,
                                           limit=limit // STEP[SEQUENCE] * STEP[SEQUENCE])
            if effective_batch:
                progress(f"{method.label}: micro-batches of an effective batch of {effective_batch}")
                row["accumulated"] = accumulated(method, effective_batch, world_size, row["batch"], settings, device,
                                                 with_method)
        except EstimateError as exc:
            rows.append({**row, "refused": str(exc)})
            continue
        timed = row["accumulated"] if effective_batch else None
        micro = timed.micro if timed else row["batch"].largest
        if gpu is not None and micro:
            timed_method = timed.method if timed else method
            stacked = next(m for m, _ in stacked_run([timed_method], given or {}, stack, settings)) \
                if stack else timed_method
            row["step_time"] = predict_run(stacked, replace(settings, batch_size=micro), gpu, world_size)
        rows.append(row)
    return rows
