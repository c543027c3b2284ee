"""FLOPs and bytes from recorded shapes (core/work.py), held against an independent count: the same ops, on the same
shapes and dtypes, run on the meta device under ``torch.utils.flop_counter``. On a real GPU trace (Qwen1.5-0.5B on an
H100, recorded by others) and on profkit's own CPU runs.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_work.py``."""

from __future__ import annotations

import pytest

from profkit.core import work
from tests.test_work import _distinct_counted_ops, _meta_flops


@pytest.mark.parametrize("run", ["full", "lora_gc", "qlora"])
def test_flops_match_flop_counter_on_profkit_cpu_runs(matrix, run):
    """Every distinct GEMM and attention op of a profkit run (micro, CPU: grouped-query attention, LoRA's
    adapters, bitsandbytes' 4-bit GEMM, the attention backward), forward and backward."""
    ops = _distinct_counted_ops(matrix / run / "time.pt.trace.json.gz", kinds=("gemm", "attention"))
    assert any(w.kind == "attention" for *_, w in ops) and sum(w.kind == "gemm" for *_, w in ops) >= 5
    for name, dims, types, concrete, w in ops:
        unmasked = work.work(name, dims, types, [c if c != "True" else "False" for c in concrete])
        assert unmasked.flops == _meta_flops(name, dims, types, [c if c != "True" else "False" for c in concrete]), \
            (name, dims)
