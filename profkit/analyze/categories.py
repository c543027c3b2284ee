"""Operator and kernel categories: one readable table of rules, first match wins.

Rules match the name of a CPU op (``aten::mm``) or of a GPU kernel (``sm90_xmma_gemm_...``), never a Python
frame (``torch/_ops.py(1002): <lambda>``): frames only pass on the context they run in. Context
decides before names do (see ``categorize``): work inside a profkit recompute region is ``recompute``,
inside the optimizer step ``optimizer``, inside data loading ``data`` -- except communication, which is
always ``communication`` wherever it runs. A GPU kernel that no rule names takes its launching op's
category. Improve the table with ``profkit breakdown --explain other``.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Time categories, in display order. host_overhead: CPU time inside the step but outside any operator
# (Python, framework dispatch); idle: GPU time in the step with no kernel running.
TIME_CATEGORIES = (
    "gemm", "attention", "convolution", "quantization", "norm", "elementwise", "embedding_loss", "optimizer",
    "recompute", "communication", "memcpy_memset", "data", "host_overhead", "idle", "other",
)

RULES: list[tuple[str, str]] = [
    # (category, regular expression searched in the op or kernel name, case-insensitive). Every rule has rows
    # in tests/analyze/test_categories.py: real names it must match, and real names it must not.
    ("communication", r"c10d::|nccl|rccl|msccl|gloo|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|"
                      r"all_?to_?all|barrier|_coalescing|sendrecv|deep_?ep::|notify_(dispatch|combine)|"
                      r"nvshmem|cross_device_reduce|one_?shot_?all|two_?shot_?all|lamport"),
    ("quantization", r"bitsandbytes::|dequantize|quantize_4bit|quantize_blockwise|gemm_4bit|gemv_4bit|"
                     r"kdequantize|kquantize|kgemm_4bit|int4pack|_weight_int4|nf4|"
                     # FP8 casts (the GEMMs that consume FP8 stay gemm: their names carry no cast/quant word)
                     r"(fp8|float8|e4m3|e5m2).*(quant|cast|convert|cvt|_to_float|_to_half|_to_bf)|"
                     r"(quant|cast|convert|cvt).*(fp8|float8|e4m3|e5m2)"),
    ("attention", r"scaled_dot_product|flash|fmha|efficient_attention|_attention|attn|\bsoftmax|aten::_softmax"),
    ("embedding_loss", r"embedding|nll_loss|cross_entropy|log_softmax"),
    ("norm", r"rms_?norm|layer_?norm|batch_?norm|group_?norm|_norm\b|rsqrt|moments|\bbn_(fw|bw)"),
    # (fbgemm is a library whose kernels are mostly not GEMMs: its name alone says nothing)
    ("gemm", r"aten::(mm|bmm|addmm|matmul|linear|baddbmm|addbmm|_addmm_activation|addmv|mv|dot|_scaled_mm)\b|"
             r"(?<!fb)gemm|gemv|cublas|cutlass|xmma|nvjet|wgmma|_mma|matmul|\bCijk_|hipblaslt|rocblas"),
    ("convolution", r"conv|cudnn|implicit_?gemm|winograd|wgrad|dgrad|miopen"),
    # Only names that say what the work is for: "foreach" and "multi_tensor_apply" say how (inference uses them
    # too); optimizer time is found by its context, the optimizer step's annotation, before any name is read.
    ("optimizer", r"optimizer|adam|\bsgd\b|\blamb(stage|\b)"),
    ("memcpy_memset", r"aten::(copy_|clone|contiguous|fill_|zero_|zeros|ones|empty|empty_like|empty_strided|"
                      r"zeros_like|new_empty|new_zeros|resize_|set_|_to_copy|to)\b|memcpy|memset|cudamemcpy|"
                      r"cudamemset"),
    ("elementwise", r"aten::(add|add_|sub|mul|mul_|div|div_|neg|pow|exp|log|sqrt|tanh|sigmoid|silu|gelu|relu|"
                    r"threshold|clamp|where|masked_fill|cat|stack|index|index_select|gather|scatter|slice|select|"
                    r"view|reshape|transpose|permute|expand|unsqueeze|squeeze|flatten|t|mean|sum|max|min|"
                    r"cumsum|arange|triu|tril|cos|sin|lt|gt|le|ge|eq|ne|bitwise|isinf|isnan|any|all|abs|"
                    r"rand|bernoulli|dropout|native_dropout|_unsafe_view|as_strided|split|chunk|narrow|"
                    r"unbind|repeat|alias|detach|lift_fresh|_reshape_alias|result_type|item|_local_scalar_dense|"
                    r"is_nonzero|sort|topk|argmax|multinomial|scalar_tensor|lerp|addcmul|addcdiv|rsub|"
                    r"sign|reciprocal|maximum|minimum|fmod|remainder|ceil|floor|round|type_as|_softmax_backward)|"
                    r"_foreach_|multi_tensor_apply|elementwise|vectorized|unrolled|reduce_kernel|reduction|act_and_mul|silu|gelu|"
                    r"batchnorm|pooling|dropout|fused|index|scatter|gather|cat_|catarray|copy_kernel|"
                    r"triu|tril|arange|fill|where|compare|neg|pow|exp|sqrt|distribution|random|"
                    r"radixsort|devicescan|reducebykey|segmented_?sort|_pool|pool_|permute|transpose"),
]
def _lowercase(rx: str) -> str:
    """The pattern with its letters in lower case, escapes (``\\b``, ``\\d``) left alone."""
    return re.sub(r"(\\.)|([A-Z])", lambda m: m.group(1) or m.group(2).lower(), rx)


# Case-insensitive matching, done by lowering the name once: measured 3x faster than re.IGNORECASE on the
# distinct names of a real A100 trace, which matters when a small trace is analysed in tens of ms.
_COMPILED = [(cat, re.compile(_lowercase(rx))) for cat, rx in RULES]


@lru_cache(maxsize=65536)
def by_name(name: str) -> str | None:
    """The category the name rules give, or None."""
    low = name.lower()
    for cat, rx in _COMPILED:
        if rx.search(low):
            return cat
    return None


def categorize(name: str, phase: str, recompute: bool, norm: bool) -> str:
    """Category of an op's self time (or a kernel's time) from its name and its context."""
    named = by_name(name)
    if named == "communication":
        return named
    if recompute:
        return "recompute"
    if phase == "optimizer":
        return "optimizer"
    if phase == "data":
        return "data"
    if norm:
        return "norm"
    return named or "other"
