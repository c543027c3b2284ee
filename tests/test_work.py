"""FLOPs and bytes from recorded shapes (core/work.py), held against an independent count: the same ops, on
the same shapes and dtypes, run on the meta device under ``torch.utils.flop_counter``. On a real GPU trace
(Qwen1.5-0.5B on an H100, recorded by others) and on profkit's own CPU runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from profkit.core import work
from profkit.analyze.trace import load_trace

DATA = Path(__file__).parent / "data"
H100 = DATA / "gpu-traces" / "h100_qwen1.5-0.5b_hf_memory.json.gz"
BF16, F32 = "c10::BFloat16", "float"


@pytest.mark.parametrize("name, dims, types, concrete, flops, nbytes", [
    ("aten::mm", [[8, 16], [16, 32]], [BF16, BF16], ["", ""], 2 * 8 * 16 * 32, 2 * (8 * 16 + 16 * 32 + 8 * 32)),
    ("aten::addmm", [[32], [8, 16], [16, 32], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"], ["", "", "", "1", "1"],
     2 * 8 * 16 * 32, 2 * (32 + 8 * 16 + 16 * 32 + 8 * 32)),
    ("aten::bmm", [[4, 8, 16], [4, 16, 32]], [F32, F32], ["", ""], 2 * 4 * 8 * 16 * 32,
     4 * 4 * (8 * 16 + 16 * 32 + 8 * 32)),
    # Attention, [batch, heads, length, dim]: full, then causal (query i sees i + 1 keys).
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 8, 16]] * 3 + [[]] * 4, [BF16] * 3 + ["Scalar"] * 4,
     ["", "", "", "0.", "False", "False", "0.25"], 4 * 2 * 4 * 8 * 8 * 16, 2 * 4 * 2 * 4 * 8 * 16),
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 8, 16]] * 3 + [[]] * 4, [BF16] * 3 + ["Scalar"] * 4,
     ["", "", "", "0.", "True", "False", "0.25"], 4 * 2 * 4 * (8 * 9 / 2) * 16, 2 * 4 * 2 * 4 * 8 * 16),
    # [batch, length, heads, dim], one query against a cache of 8 keys (decoding): all 8 seen.
    ("aten::_flash_attention_forward", [[2, 1, 4, 16], [2, 8, 4, 16], [2, 8, 4, 16]] + [[]] * 6,
     [BF16] * 3 + [""] * 2 + ["Scalar"] * 4, ["", "", "", "", "", "1", "8", "0.", "True"],
     4 * 2 * 4 * 1 * 8 * 16, 2 * (2 * (2 * 1 * 4 * 16) + 2 * (2 * 8 * 4 * 16))),  # q and the output; k, v
    # An MoE's grouped product: each expert's rows of [tokens, K] by its [K, N] weight; the weights' gradients,
    # [K, tokens] x [tokens, N] split by offs into one [K, N] per expert; a batched form.
    ("aten::_grouped_mm", [[64, 32], [4, 32, 48], [4], [], []], [BF16, BF16, "int", "", ""], [""] * 5,
     2 * 64 * 32 * 48, 2 * (64 * 32 + 4 * 32 * 48 + 64 * 48) + 4 * 4),
    ("aten::_grouped_mm", [[32, 64], [64, 48], [4], [], []], [BF16, BF16, "int", "", ""], [""] * 5,
     2 * 32 * 64 * 48, 2 * (32 * 64 + 64 * 48 + 4 * 32 * 48) + 4 * 4),
    ("aten::_grouped_mm", [[4, 16, 32], [4, 32, 48], [], [], []], [BF16, BF16, "", "", ""], [""] * 5,
     2 * 4 * 16 * 32 * 48, 2 * (4 * 16 * 32 + 4 * 32 * 48 + 4 * 16 * 48)),
    # Elementwise: both inputs read, the broadcast output written; in place, the first is the output.
    ("aten::mul", [[4, 8], [8]], [BF16, BF16], ["", ""], 0, 2 * (32 + 8 + 32)),
    ("aten::add_", [[4, 8], [4, 8], []], [F32, F32, "Scalar"], ["", "", "1"], 0, 4 * 3 * 32),
    ("aten::copy_", [[4, 8], [4, 8], []], [BF16, F32, "Scalar"], ["", "", "False"], 0, 2 * 32 + 4 * 32),
    # A view moves nothing; a composite counts through the ops nested in it.
    ("aten::view", [[4, 8], []], [F32, "ScalarList"], ["", "[32]"], 0, 0),
    ("aten::linear", [[4, 8], [16, 8], [16]], [F32] * 3, ["", "", ""], 0, 0),
    # bitsandbytes: the packed weight expands to two compute-dtype values per byte.
    ("bitsandbytes::dequantize_4bit", [[2048], [64], [256], [], []], ["unsigned char", F32, F32, "Scalar", "Scalar"],
     ["", "", "", "64", "6"], 0, 2048 + 4 * 64 + 4 * 256 + 2 * 2048 * 2),
])
def test_formulas(name, dims, types, concrete, flops, nbytes):
    w = work.work(name, dims, types, concrete)
    assert w.flops == pytest.approx(flops) and w.bytes == pytest.approx(nbytes)


def test_bitsandbytes_ops_count_as_what_they_compute():
    """gemv_4bit (the decode's one-token product) is the GEMM gemm_4bit is; a bitsandbytes op without a formula
    is not counted as memory work, and says so."""
    A, packed = [[1, 1, 64], [2048, 1]], [F32, "unsigned char"]
    gemv = work.work("bitsandbytes::gemv_4bit", A + [[]] * 3, packed + ["GenericList", "Tensor", "Int"],
                     ["", "", "[32, 64]", "", "64"])
    assert gemv.kind == "gemm" and gemv.flops == 2 * 1 * 64 * 32
    other = work.work("bitsandbytes::int8_mm_dequant", A, packed, ["", ""])
    assert other.flops == other.bytes == 0 and "no formula" in other.note


def test_backward_attention_counts_the_recomputed_scores_apart():
    dims = [[2, 4, 8, 16]] * 5 + [[2, 4, 8]]
    w = work.work("aten::_scaled_dot_product_flash_attention_backward", dims + [[]] * 9,
                  [BF16] * 5 + [F32] + [""] * 9, [""] * 11 + ["False"])
    forward = 4 * 2 * 4 * 8 * 8 * 16
    assert w.flops == 2.5 * forward and w.model == 2 * forward


def test_shapes_that_are_not_a_product_are_named_not_counted():
    w = work.work("aten::mm", [[8, 16], [15, 32]], [F32, F32], ["", ""])
    assert w.flops == 0 and "not those of a matrix product" in w.note


_DTYPES = {BF16: torch.bfloat16, F32: torch.float32, "c10::Half": torch.float16}


def _meta_flops(name: str, dims: list, types: list, concrete: list) -> int:
    """The op run on the meta device with these shapes, under FlopCounterMode: tensors of the recorded shapes
    and dtypes, other inputs from the concrete values the trace recorded, placed by the op's schema.
    bitsandbytes' 4-bit GEMM is replayed as the matrix product it computes (A times the [N, K] weight)."""
    if name == "bitsandbytes::gemm_4bit":
        n, k = json.loads(next(c for c in concrete if c.startswith("[")))
        a = torch.empty(dims[0], dtype=_DTYPES[types[0]], device="meta").reshape(-1, k)
        with FlopCounterMode(display=False) as counter:
            torch.mm(a, torch.empty(k, n, dtype=a.dtype, device="meta"))
        return counter.get_total_flops()
    op = getattr(torch.ops.aten, name.removeprefix("aten::")).default
    args, kwargs = [], {}
    for arg, d, t, c in zip(op._schema.arguments, dims, types, concrete + [""] * len(dims)):
        if t in _DTYPES:
            value = torch.empty(d, dtype=_DTYPES[t], device="meta")
        elif c in ("True", "False"):
            value = c == "True"
        elif c:
            value = float(c) if "." in c or "e" in c else int(c)
        else:
            value = None
        if arg.name in ("key", "value") and name == "aten::scaled_dot_product_attention":
            # Grouped-query attention: the math on the meta device needs q's heads; each query head still
            # attends once, so the FLOPs are those of q's heads.
            value = value.repeat_interleave(dims[0][1] // d[1], dim=1)
        if arg.kwarg_only:
            kwargs[arg.name] = value
        else:
            args.append(value)
    with FlopCounterMode(display=False) as counter:
        op(*args, **kwargs)
    return counter.get_total_flops()


def _distinct_counted_ops(path: Path, kinds=("gemm",)):
    trace = load_trace(path)
    seen = {}
    for i in (trace.input_id >= 0).nonzero()[0].tolist():
        name = trace.names[trace.name_id[i]]
        key = (name, int(trace.input_id[i]))
        if key in seen or not work.counts_nested(name):
            continue
        dims, types, concrete = trace.inputs_of(i)
        w = work.work(name, dims, types, concrete)
        if w.kind in kinds:
            seen[key] = (name, dims, types, concrete, w)
    return list(seen.values())


def test_gemm_flops_match_flop_counter_on_a_real_h100_trace():
    ops = _distinct_counted_ops(H100)
    assert len(ops) >= 5
    for name, dims, types, concrete, w in ops:
        assert w.flops == _meta_flops(name, dims, types, concrete), (name, dims)


def test_attention_flops_match_flop_counter_on_a_real_h100_trace():
    """flop_counter counts attention as if no mask applied: held against the count without the causal mask,
    and the causal one is that times the share of (query, key) pairs a causal mask keeps."""
    ops = _distinct_counted_ops(H100, kinds=("attention",))
    assert ops
    for name, dims, types, concrete, w in ops:
        full = [c if c != "True" else "False" for c in concrete]
        unmasked = work.work(name, dims, types, full)
        q = dims[0]
        length = q[2] if "scaled_dot_product" in name else q[1]
        assert unmasked.flops == _meta_flops(name, dims, types, full), (name, dims)
        assert w.flops == pytest.approx(unmasked.flops * (length + 1) / (2 * length))
