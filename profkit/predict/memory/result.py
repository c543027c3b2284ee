"""What an estimate returns: the bytes of each category at each instant of a step, and what follows from them on a
CUDA device (reserved memory, what nvidia-smi shows, whether the step fits a GPU)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from statistics import median
from typing import Callable

import pandas as pd

from profkit.core.bundled import bundled
from profkit.core.categories import MEMORY_CATEGORIES
from profkit.predict.step_replay import (AllocationTrace, AllocatorReplay, fixed_lengths, growing_lengths,
                                       interpolated)

# The breakdown's categories, less the two only a measurement has.
CATEGORIES = tuple(c for c in MEMORY_CATEGORIES if c not in ("allocator_overhead", "unattributed"))


class EstimateError(ValueError):
    """A method or model the estimator does not model; the message says which and why."""


@dataclass
class Estimate:
    method: str
    settings: dict  # batch_size, seq_len, world_size, device, model
    instants: dict[str, dict[str, int]]  # instant -> category -> bytes
    params: dict[str, int]  # trainable / frozen / quantized element counts
    detail: dict[str, int] = field(default_factory=dict)  # named parts behind the categories, bytes
    notes: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)  # offloaded to pinned host memory, by category, bytes
    stack: dict = field(default_factory=dict)  # the stack assumed (core.stack.Stack.to_json): part -> value, from
    # The allocations of steps of the given lengths (``predict.step_replay.AllocationTrace``), recorded when reserved
    # memory is first asked for (whole steps on meta, several times the estimate's own forward); None where the step
    # is not replayed.
    tracer: Callable[[tuple[int, ...]], AllocationTrace | None] | None = field(default=None, repr=False,
                                                                           compare=False)
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)  # capacity -> its replay

    @functools.cached_property
    def trace(self) -> AllocationTrace | None:
        return self.tracer(fixed_lengths(self.settings["seq_len"])) if self.tracer is not None else None

    @functools.cached_property
    def replay(self) -> AllocatorReplay | None:
        return self.trace.through() if self.trace is not None else None

    @functools.cached_property
    def growing_replay(self) -> AllocatorReplay | None:
        """The steps of ``growing_lengths`` through the allocator, each later step its length's first step less the
        state the first made (``AllocationTrace.then``): the full length's is the fixed trace's, the others traced
        once each, or, where three lengths are known and their calls agree, interpolated exactly from them."""
        if self.replay is None:
            return None
        lengths = growing_lengths(self.settings["seq_len"])
        firsts = {lengths[-1]: self.trace.first_step()}
        for length in lengths[:-1]:
            firsts[length] = (interpolated(firsts, length) if len(firsts) >= 3 else None) or self.tracer((length,))
            if firsts[length] is None:
                return None
        trace = firsts[lengths[0]]
        for length in lengths[1:]:
            trace = trace.then(firsts[length])
        return trace.through()

    @property
    def peak_instant(self) -> str:
        return max(self.instants, key=lambda i: sum(self.instants[i].values()))

    @property
    def peak_bytes(self) -> int:
        return sum(self.instants[self.peak_instant].values())

    def at_peak(self) -> dict[str, int]:
        return dict(self.instants[self.peak_instant])

    def reserved(self) -> dict | None:
        """CUDA targets: what ``max_memory_reserved`` would show. Where the step was replayed through the caching
        allocator's policy (``predict.step_replay``), the allocated peak plus the reserve the replay found beyond
        its own allocated peak; elsewhere (ZeRO, generation, a step meta kernels cannot run) the allocated
        peak times the reserved/allocated ratios of real training steps (lowest, median, highest). None on CPU,
        which has no caching allocator."""
        if self.settings.get("device") != "cuda":
            return None
        if self.replay is not None:
            value = self.peak_bytes + self.replay.overhead
            return {"low_bytes": value, "bytes": value, "high_bytes": value, "basis": "replay"}
        ratios = reserved_ratios()
        return {"low_bytes": int(self.peak_bytes * min(ratios)), "bytes": int(self.peak_bytes * median(ratios)),
                "high_bytes": int(self.peak_bytes * max(ratios)), "basis": "ratio", "ratios": ratios}

    def reserved_if_lengths_grow(self) -> dict | None:
        """Reserved memory when each batch is padded to its longest sample and the lengths grow to the full one over
        the run (``step_replay.growing_lengths``): the other choice to the packed, fixed-length steps ``reserved``
        assumes. None where the step is not replayed."""
        if self.growing_replay is None:
            return None
        return {"bytes": self.peak_bytes + self.growing_replay.overhead,
                "lengths": list(growing_lengths(self.settings["seq_len"]))}

    def on_device(self, device_bytes: int) -> dict | None:
        """Whether the step fits a GPU of ``device_bytes``: the replay run again with the room the allocator has
        there (the device less what lies outside it, ``outside_allocator``), where it releases its cache when full
        and fails when that is not enough. None where the step is not replayed."""
        if self.replay is None:
            return None
        outside = self.device_used()["outside_allocator"]
        capacity = device_bytes - sum(outside.values())
        replay = self._on_device.get(capacity)
        if replay is None:
            replay = self._on_device[capacity] = self.trace.through(capacity)
        fits = replay.failed_request is None and self.peak_bytes <= capacity
        return {"device_bytes": device_bytes, "capacity_bytes": capacity, "fits": fits,
                "reserved_bytes": min(self.peak_bytes + replay.overhead, capacity),
                "failed_request_bytes": replay.failed_request}

    def on_gpu(self, gpu) -> dict:
        """Whether the step fits ``gpu`` (``core.gpus.Gpu``): ``on_device`` where the step is replayed (the allocator
        with the room it has there), else the allocated peak against the GPU's memory; ``share``: the part of that
        room (or memory) the step takes."""
        replayed = self.on_device(gpu.memory_bytes) if self.settings.get("device") == "cuda" else None
        if replayed is not None:
            return {"gpu": gpu.key, "basis": "replay", **replayed,
                    "share": replayed["reserved_bytes"] / replayed["capacity_bytes"]}
        return {"gpu": gpu.key, "basis": "allocated peak", "device_bytes": gpu.memory_bytes,
                "fits": self.peak_bytes <= gpu.memory_bytes, "share": self.peak_bytes / gpu.memory_bytes}

    def device_used(self) -> dict | None:
        """CUDA targets: what nvidia-smi would show for this process: reserved memory plus what lies outside
        PyTorch's allocator, the CUDA context and, on more than one rank, NCCL's buffers, as sourced in
        ``profkit/data/allocator/outside_allocator.csv``."""
        reserved = self.reserved()
        if reserved is None:
            return None
        ranks = self.settings.get("world_size", 1)
        outside = outside_allocator()
        rows = outside[(outside.min_ranks <= ranks) & (outside.max_ranks.isna() | (outside.max_ranks >= ranks))]
        return {key: reserved[key] + int(rows[key].sum()) for key in ("low_bytes", "bytes", "high_bytes")} | \
            {"outside_allocator": {r.item: int(r.bytes) for r in rows.itertuples()}}

    def to_json(self) -> dict:
        return {"method": self.method, "settings": self.settings, "instants": self.instants,
                "peak_instant": self.peak_instant, "peak_bytes": self.peak_bytes, "reserved": self.reserved(),
                "device_used": self.device_used(), "allocator_replay": self.replay and self.replay.to_json(),
                "reserved_if_lengths_grow": self.reserved_if_lengths_grow(),
                "params": self.params, "detail": self.detail, "notes": self.notes, "host": self.host,
                "host_bytes": sum(self.host.values()), "stack": self.stack}


RESERVED_BASIS = {
    "replay": "reserved: the allocated peak plus what the CUDA caching allocator's policy reserves beyond it when "
              "the step's allocations are replayed through it (profkit/predict/allocator.py)",
    "ratio": "reserved: the predicted allocated peak x the CUDA caching allocator's peak reserved / peak allocated "
             "on real training steps ({ratios}; analyses/allocator_overhead.py)"}
GROWING_BASIS = ("reserved, lengths grow: each batch padded to its longest sample and the lengths growing to the full "
                 "one over the run; steps of {lengths} tokens replayed, the blocks of the shorter ones staying cached")
DEVICE_BASIS = ("nvidia-smi: reserved plus the CUDA context (about 0.4 GB) and, on several ranks, NCCL's buffers "
                "(0.5-0.7 GB), outside PyTorch's counters (profkit/data/allocator/outside_allocator.csv)")


@functools.cache  # read once: every estimate's table and JSON ask for it
def reserved_ratios() -> list[float]:
    """Peak reserved over peak allocated, measured on real allocator snapshots (``profkit/data/allocator``)."""
    return sorted(float(r) for r in pd.read_csv(bundled("allocator/reserved_over_allocated.csv")).ratio)


@functools.cache
def outside_allocator() -> pd.DataFrame:
    """GPU memory a process holds outside PyTorch's caching allocator, with sources."""
    return pd.read_csv(bundled("allocator/outside_allocator.csv"))

