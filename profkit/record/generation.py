"""What a generation run measures beyond its step time, for ``Session``: the latency of each token, from the ends
of successive forward passes in the timed steps, and the KV cache that the last pass returned."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np
import torch

from profkit.model.storage import storage_bytes


class Generation:
    def __init__(self, sync: Callable[[], None]):
        self._sync = sync  # the device's: a pass has ended when its kernels have
        self._ends: list[float] = []  # this step's forward passes, when each ended
        self.ttft_s: list[float] = []
        self.tpot_s: list[float] = []
        self.cache = None

    def forward_done(self, output, timed: bool) -> None:
        if timed:
            self._sync()
            self._ends.append(time.perf_counter())
        cache = getattr(output, "past_key_values", None)
        if cache is not None:
            self.cache = cache

    def step_done(self, started: float) -> None:
        """Time to first token: from the step's start to the end of the prefill pass; time per output token:
        between the ends of successive passes."""
        if self._ends:
            ends = [started, *self._ends]
            self.ttft_s.append(ends[1] - ends[0])
            self.tpot_s += [b - a for a, b in zip(ends[1:], ends[2:])]
        self._ends = []

    def timings(self, request_latency_s: float) -> dict:
        if not self.ttft_s:
            return {}
        tpot = self.tpot_s or [float("nan")]
        return dict(ttft_s=self.ttft_s, tpot_s=tpot, ttft_median_s=float(np.median(self.ttft_s)),
                    tpot_median_s=float(np.median(tpot)), tpot_p90_s=float(np.percentile(tpot, 90)),
                    request_latency_median_s=request_latency_s)

    def inventory(self) -> dict:
        return kv_cache_inventory(self.cache) if self.cache is not None else {}


def kv_cache_inventory(cache) -> dict:
    """The KV cache generate() built: its key and value tensors, once per storage, and the tokens it holds."""
    tensors = []
    for layer in getattr(cache, "layers", None) or []:  # transformers' Cache: one entry per decoder layer
        tensors += [t for t in (getattr(layer, "keys", None), getattr(layer, "values", None)) if isinstance(t, torch.Tensor)]
    if not tensors and isinstance(cache, (tuple, list)):  # the legacy tuple of (key, value) per layer
        tensors = [t for pair in cache for t in pair if isinstance(t, torch.Tensor)]
    length = cache.get_seq_length() if callable(getattr(cache, "get_seq_length", None)) else None
    return {"kv_cache_bytes": storage_bytes(tensors), "kv_cache_tokens": int(length) if length is not None else None,
            "kv_cache_tensors": len(tensors), "kv_cache_dtype": str(tensors[0].dtype).removeprefix("torch.")
            if tensors else None}
