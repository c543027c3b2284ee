"""The work an operator does, from the shapes a trace records (``record_shapes``): floating-point operations
and the least bytes it must move.

FLOPs count a multiply-add as two: a GEMM is 2·M·K·N; attention is 4·B·H·L·S·D forward (scores and the
weighted sum), less as far as a causal mask hides pairs (a fused kernel skips the masked blocks), and 2.5 times
that backward: the four products of the gradients and the scores recomputed, as every fused attention kernel
does (``torch.utils.flop_counter`` counts the same). ``model_flops`` leaves the recomputed scores out (the
backward is twice the forward), as MFU conventions do. Bytes are each tensor input read once and the output written
once -- the traffic no kernel can avoid; an op that moves more (a GEMM re-reading tiles) shows it as a lower
share of the bandwidth roof. 4-bit dequantization reads the packed weight and writes the weight it expands.

Formulas are keyed by the aten (or custom) op's schema: which argument is which is what the schema says,
and nothing here reads a kernel's name. Composite ops whose work is done by the ops nested in them
(``aten::linear`` over ``aten::addmm``) have no formula; the analyser counts each op under the outermost
op that has one, so nothing is counted twice. Analysis does not import torch: these are a few lines each,
and an independent count is what ``torch.utils.flop_counter`` is held against in the tests.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

# Bytes per element of the "Input type" strings torch.profiler writes.
DTYPE_BYTES = {
    "double": 8, "float": 4, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4, "short int": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::complex<float>": 8, "c10::complex<double>": 16,
}
# The precision a GEMM's inputs run at, for the device's peak (the first tensor input decides).
PRECISION = {"double": "fp64", "float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16",
             "c10::Float8_e4m3fn": "fp8", "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8",
             "c10::Float8_e5m2fnuz": "fp8", "signed char": "int8"}

# Ops that only make views or allocate: no data moves (their kernels, if any, are another op's).
NO_TRAFFIC = frozenset({
    "aten::view", "aten::_unsafe_view", "aten::as_strided", "aten::transpose", "aten::t", "aten::permute",
    "aten::expand", "aten::slice", "aten::select", "aten::unsqueeze", "aten::squeeze", "aten::reshape",
    "aten::detach", "aten::alias", "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::resize_",
    "aten::split", "aten::chunk", "aten::narrow", "aten::unbind", "aten::lift_fresh", "aten::result_type",
    "aten::view_as", "aten::split_with_sizes", "aten::contiguous", "aten::to", "aten::_reshape_alias",
})

# Attention ops: (layout of q/k/v, position of the causal flag among the inputs (None: the op has none),
# forward (1) or backward (2)), positions as the ops' schemas have them. "bhld": [batch, heads, length,
# head_dim]; "blhd": [batch, length, heads, head_dim]. xformers-style ops take a mask type (1 or 2: causal).
_ATTENTION = {
    "aten::scaled_dot_product_attention": ("bhld", 5, 1),
    "aten::_scaled_dot_product_flash_attention": ("bhld", 4, 1),
    "aten::_scaled_dot_product_flash_attention_for_cpu": ("bhld", 4, 1),
    "aten::_scaled_dot_product_efficient_attention": ("bhld", 6, 1),
    "aten::_scaled_dot_product_cudnn_attention": ("bhld", 6, 1),
    "aten::_scaled_dot_product_fused_attention_overrideable": ("bhld", 5, 1),
    "aten::_flash_attention_forward": ("blhd", 8, 1),
    "aten::_efficient_attention_forward": ("blhd", 9, 1),
    "aten::_scaled_dot_product_flash_attention_backward": ("bhld", 11, 2),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": ("bhld", 7, 2),
    "aten::_scaled_dot_product_efficient_attention_backward": ("bhld", 11, 2),
    "aten::_scaled_dot_product_cudnn_attention_backward": ("bhld", 14, 2),
    "aten::_flash_attention_backward": ("blhd", 11, 2),
    "aten::_efficient_attention_backward": ("blhd", 14, 2),
    # The flash-attn package's ops (torch.library custom ops since flash-attn 2.6).
    "flash_attn::_flash_attn_forward": ("blhd", 5, 1),
    "flash_attn::_flash_attn_backward": ("blhd", 11, 2),
    # FlashAttention-3 (hopper/flash_attn_interface.py): the C++ ops and their Python custom ops.
    "flash_attn_3::fwd": ("blhd", 24, 1),
    "flash_attn_3::_flash_attn_forward": ("blhd", 24, 1),
    "flash_attn_3::bwd": ("blhd", 16, 2),
    "flash_attn_3::_flash_attn_backward": ("blhd", 13, 2),
}
_CAUSAL = {"True", "1", "2"}
# In a backward op, q, k and v follow the output's gradient.
_ATTENTION_QKV_AT = {1: 0, 2: 1}


@dataclass(frozen=True)
class Work:
    flops: float
    bytes: float
    kind: str  # "gemm", "attention", "dequantize", "memory" (elementwise, norms, copies), "" (no traffic)
    precision: str = ""  # the GEMM's or attention's input precision, for the device's peak
    note: str = ""  # why the count is partial, where it is
    model_flops: float | None = None  # where it differs from ``flops``: without what a kernel recomputes
    # Attention: the independent tiles of its kernel's grid, one (batch, head, block of ATTENTION_TILE queries)
    # each. Fewer tiles than the GPU has multiprocessors leave some idle: a short prefill cannot reach the rate a
    # long training sequence does (predict.step_time). 0 where not known.
    tiles: int = 0
    # Attention: the forward FLOPs of one tile (its 128 queries against the keys it walks, times the head dim). A
    # tile's fixed cost (loading its queries, the softmax's last rescaling, writing its output) is spread over
    # this work: short sequences and small heads reach a lower rate (predict.step_time). 0 where not known.
    tile_flop: float = 0.0
    backward: bool = False  # attention: the backward kernel (its own efficiency)

    @property
    def model(self) -> float:
        return self.flops if self.model_flops is None else self.model_flops


NONE = Work(0.0, 0.0, "")


def _tensors(dims: list, types: list) -> list[tuple[list[int], str]]:
    """(shape, dtype) of each tensor input; a 0-dim tensor (a wrapped scalar) has shape []."""
    out = []
    for d, t in zip(dims, types):
        if t in DTYPE_BYTES and isinstance(d, list) and all(isinstance(x, int) for x in d):
            out.append((d, t))
    return out


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _nbytes(shape: list[int], dtype: str) -> int:
    return _numel(shape) * DTYPE_BYTES[dtype]


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, x in enumerate(s, start=rank - len(s)):
            out[i] = max(out[i], x)
    return out


def _gemm(name: str, tensors: list[tuple[list[int], str]]) -> Work | None:
    """mm [M,K]x[K,N]; addmm bias,[M,K],[K,N]; bmm and baddbmm [B,M,K]x[B,K,N]."""
    mats = tensors[1:3] if name in ("aten::addmm", "aten::addmm_", "aten::baddbmm", "aten::baddbmm_",
                                    "aten::_addmm_activation") else tensors[:2]
    if len(mats) != 2:
        return None
    (a, ta), (b, _) = mats
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        m, k, n, batch = a[0], a[1], b[1], 1
    elif len(a) == 3 and len(b) == 3 and a[2] == b[1] and a[0] == b[0]:
        batch, m, k, n = a[0], a[1], a[2], b[2]
    else:
        return None
    moved = sum(_nbytes(s, t) for s, t in tensors) + batch * m * n * DTYPE_BYTES[ta]
    return Work(2.0 * batch * m * k * n, float(moved), "gemm", PRECISION.get(ta, ""))


def _grouped_gemm(tensors: list[tuple[list[int], str]]) -> Work | None:
    """_grouped_mm(self, mat2, offs, ...): one matrix product per group (an MoE's experts), the groups' rows split
    by ``offs``. [M,K]x[G,K,N] (each expert's tokens by its weight, forward and the input's gradient) and
    [K,M]x[M,N] (the weights' gradients, M split among the groups) compute 2·M·K·N in all; [G,M,K]x[G,K,N],
    2·G·M·K·N."""
    if len(tensors) < 2:
        return None
    (a, ta), (b, _) = tensors[:2]
    if len(a) == 2 and len(b) == 3 and a[1] == b[1]:
        flops, written = 2.0 * a[0] * a[1] * b[2], a[0] * b[2]
    elif len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        flops, written = 2.0 * a[0] * a[1] * a[2] * b[2], a[0] * a[1] * b[2]
    elif len(a) == 2 and len(b) == 2 and a[1] == b[0] and len(tensors) > 2 and len(tensors[2][0]) == 1:
        flops, written = 2.0 * a[0] * a[1] * b[1], tensors[2][0][0] * a[0] * b[1]
    else:
        return None
    moved = sum(_nbytes(s, t) for s, t in tensors) + written * DTYPE_BYTES[ta]
    return Work(flops, float(moved), "gemm", PRECISION.get(ta, ""))


def _concrete(concrete: list, at: int | None) -> str:
    return concrete[at] if at is not None and at < len(concrete) and isinstance(concrete[at], str) else ""


# FlashAttention-2 and the fused SDPA kernels give each thread block one head of one sequence and a block of 128
# queries (FlashAttention-2's forward on A100 and H100, head dim up to 128; Dao 2023, section 3.2).
ATTENTION_TILE = 128


def _attention(name: str, tensors: list, concrete: list) -> Work | None:
    layout, causal_at, passes = _ATTENTION[name]  # passes: 1 forward, 2 backward
    first = _ATTENTION_QKV_AT[passes]
    qkv = [t for t in tensors if len(t[0]) == 4][first:first + 3]
    if len(qkv) != 3:
        return None
    (q, tq), (k, _), _v = qkv
    if layout == "bhld":
        batch, heads, length, dim = q
        keys = k[2]
    else:
        batch, length, heads, dim = q
        keys = k[1]
    pairs = float(length * keys)
    causal = _concrete(concrete, causal_at) in _CAUSAL
    if causal:
        # Query i sees the keys up to its own position, offset by the keys that precede the queries (a cache).
        offset = max(keys - length, 0)
        pairs = length * offset + length * (length + 1) / 2 if keys >= length else length * (keys + 1) / 2
    forward = 4.0 * batch * heads * pairs * dim
    tiles = batch * heads * -(-length // ATTENTION_TILE)
    moved = sum(_nbytes(s, t) for s, t in tensors) + _nbytes(q, tq) * passes  # the output (and its gradients)
    per_tile = forward / tiles if tiles else 0.0
    if passes == 1:
        return Work(forward, float(moved), "attention", PRECISION.get(tq, ""), tiles=tiles, tile_flop=per_tile)
    return Work(2.5 * forward, float(moved), "attention", PRECISION.get(tq, ""), model_flops=2.0 * forward,
                tiles=tiles, tile_flop=per_tile, backward=True)


def _dequantize_4bit(tensors: list, concrete: list) -> Work:
    """bitsandbytes' dequantize_4bit(A packed uint8, absmax, blocksize, quant_type, shape, dtype): two
    weights per packed byte, written in the compute dtype (2 bytes: bf16 or fp16)."""
    packed = next((s for s, t in tensors if t == "unsigned char"), None)
    read = sum(_nbytes(s, t) for s, t in tensors)
    if packed is None:
        return Work(0.0, float(read), "dequantize")
    return Work(0.0, float(read + 2 * _numel(packed) * 2), "dequantize")


def _gemm_4bit(tensors: list, concrete: list) -> Work | None:
    """bitsandbytes' gemm_4bit and gemv_4bit(A, B packed, shape [N, K], absmax, ...): A [..., K] times the
    [N, K] weight."""
    shape = next((c for c in concrete if isinstance(c, str) and c.startswith("[")), "")
    try:
        n, k = json.loads(shape)
    except (ValueError, TypeError):
        return None
    if not tensors or not tensors[0][0] or tensors[0][0][-1] != k:
        return None
    a, ta = tensors[0]
    m = _numel(a[:-1])
    moved = sum(_nbytes(s, t) for s, t in tensors) + m * n * DTYPE_BYTES[ta]
    return Work(2.0 * m * k * n, float(moved), "gemm", PRECISION.get(ta, ""))


# Ops that read rows picked by an index: the rows they pick, not the whole table. (name: position of the
# table among the tensor inputs, of the index.)
_GATHERS = {"aten::embedding": (0, 1), "aten::index_select": (0, 1), "aten::embedding_dense_backward": (None, 1)}


def _gather(name: str, tensors: list) -> Work | None:
    table_at, index_at = _GATHERS[name]
    if len(tensors) <= index_at:
        return None
    index, index_type = tensors[index_at]
    if table_at is None:  # the backward: the gradient of the rows read, scattered into a table of the weight's size
        grad, dtype = tensors[0]
        return Work(0.0, float(2 * _nbytes(grad, dtype) + _nbytes(index, index_type)), "memory")
    table, dtype = tensors[table_at]
    row = _numel(table[1:]) if len(table) > 1 else 1
    picked = _numel(index) * row * DTYPE_BYTES[dtype]
    return Work(0.0, float(_nbytes(index, index_type) + 2 * picked), "memory")


def _memory(name: str, tensors: list) -> Work:
    """An elementwise, normalisation, reduction or copy op: its inputs read and one output written (the
    inputs' broadcast shape, or the first input for an in-place op, which is written where it is read)."""
    if not tensors:
        return NONE
    read = sum(_nbytes(s, t) for s, t in tensors)
    if name == "aten::copy_":
        return Work(0.0, float(read), "memory")
    first, dtype = tensors[0]
    written = _nbytes(first if name.endswith("_") else _broadcast([s for s, _ in tensors]), dtype)
    return Work(0.0, float(read + written), "memory")


_GEMMS = frozenset({"aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", "aten::baddbmm", "aten::baddbmm_",
                    "aten::_addmm_activation", "aten::_scaled_mm"})
_GROUPED_GEMMS = frozenset({"aten::_grouped_mm"})
_COMPOSITE = frozenset({"aten::linear", "aten::matmul", "aten::einsum", "aten::conv2d", "aten::conv1d",
                        "aten::layer_norm", "aten::group_norm", "aten::dropout", "aten::softmax",
                        "aten::cross_entropy_loss", "aten::nll_loss_nd", "aten::rms_norm"})


def has_formula(name: str) -> bool:
    """Whether ``work`` counts this op itself (rather than through the ops nested in it)."""
    return (name in _GEMMS or name in _GROUPED_GEMMS or name in _ATTENTION or name.startswith("bitsandbytes::")
            or name.startswith("aten::") and name not in _COMPOSITE and name not in NO_TRAFFIC)


def counts_nested(name: str) -> bool:
    """Whether the op's own formula covers the ops nested in it (GEMMs, attention, 4-bit ops), so those are
    not counted again."""
    return name in _GEMMS or name in _GROUPED_GEMMS or name in _ATTENTION or name.startswith("bitsandbytes::")


def work(name: str, dims: list, types: list, concrete: list) -> Work:
    """The work of one call of ``name`` with these recorded inputs; NONE for an op that moves nothing or has
    no formula."""
    tensors = _tensors(dims, types)
    if name in _GEMMS:
        return _gemm(name, tensors) or Work(0.0, 0.0, "gemm", note="shapes not those of a matrix product")
    if name in _GROUPED_GEMMS:
        return _grouped_gemm(tensors) or Work(0.0, 0.0, "gemm", note="shapes not those of a grouped matrix product")
    if name in _ATTENTION:
        return _attention(name, tensors, concrete) or Work(
            0.0, 0.0, "attention", note="not 4-D q, k, v (variable-length attention: its sequence lengths are not "
                                        "in the trace), not counted")
    if name == "bitsandbytes::dequantize_4bit":
        return _dequantize_4bit(tensors, concrete)
    if name in ("bitsandbytes::gemm_4bit", "bitsandbytes::gemv_4bit"):  # gemv: the one-token decode's kernel
        return _gemm_4bit(tensors, concrete) or Work(0.0, 0.0, "gemm", note="no [N, K] weight shape")
    if name.startswith("bitsandbytes::") and "quantize" not in name:
        # A 4-bit or 8-bit kernel may compute as much as a GEMM: its bytes alone would pass it off as memory work.
        # (Its (de)quantizations are memory work: they read and write their tensors.)
        return Work(0.0, 0.0, "memory", note=f"{name}: no formula for this bitsandbytes op, not counted")
    if name in _GATHERS:
        return _gather(name, tensors) or NONE
    if name in NO_TRAFFIC or name in _COMPOSITE or not (name.startswith("aten::") or name.startswith("bitsandbytes::")):
        return NONE
    return _memory(name, tensors)
