"""Operator and kernel categories: what the work is, decided by its context first and its name last.

1. Context (``categorize``): work inside a profkit recompute region is ``recompute``, inside the optimizer step
   (profkit's label, or PyTorch's own ``Optimizer.step#...`` annotation) ``optimizer``, inside data loading
   ``data`` -- except communication, which is always ``communication``. Then the module or annotation the work
   runs in (``context_of``: ``nn.Module: LlamaRMSNorm_3`` in a stack, a ``record_function`` label): an
   elementwise op or a copy inside a norm, an attention or a mixture-of-experts router is that layer's work.
2. The op's own name, through the rule table below; a GPU kernel takes its launching op's category.
3. A kernel with no launching op (GPU-only traces, CUDA graphs, Triton launches from Python) is named by what
   its function is (``kernel_function``): the demangled name without return type, namespaces, template
   arguments and parameters, so a parameter's type never decides.

Names that say *how* work is done (``foreach``, ``multi_tensor_apply``, ``fused``, ``vectorized``) never say
what it is for. Python frames (``torch/_ops.py(1002): <lambda>``) never decide; they pass on their context.
Improve the table with ``profkit breakdown --explain other``.
"""

from __future__ import annotations

import re
from functools import lru_cache

# Time categories, in display order. host_overhead: CPU time inside the step but outside any operator
# (Python, framework dispatch, launching kernels); idle: GPU time in the step with no kernel running, and host
# time blocked in a device synchronisation outside any op (the host waits for the GPU). moe_routing: a mixture
# of experts' router, top-k and token permutation (shown only where present).
TIME_CATEGORIES = (
    "gemm", "attention", "convolution", "quantization", "norm", "moe_routing", "elementwise", "embedding_loss",
    "optimizer", "recompute", "communication", "memcpy_memset", "data", "host_overhead", "idle", "other",
)

RULES: list[tuple[str, str]] = [
    # (category, regular expression searched in the op or kernel name, case-insensitive). Every rule has rows
    # in tests/analyze/test_categories.py: real names it must match, and real names it must not.
    ("communication", r"c10d::|nccl|rccl|msccl|gloo|record_param_comms|all_?reduce|all_?gather|reduce_?scatter|"
                      r"all_?to_?all|alltoall|\ba2a|_a2a|a2a_|barrier|_coalescing|sendrecv|nvshmem|cross_device_reduce|one_?shot_?all|"
                      r"two_?shot_?all|lamport"),
    ("quantization", r"bitsandbytes::|dequantize|quantize_4bit|quantize_blockwise|gemm_4bit|gemv_4bit|"
                     r"kdequantize|kquantize|kgemm_4bit|int4pack|_weight_int4|nf4|"
                     # FP8 casts (the GEMMs that consume FP8 stay gemm: their names carry no cast/quant word)
                     r"(fp8|float8|e4m3|e5m2).*(quant|cast|convert|cvt|_to_float|_to_half|_to_bf)|"
                     r"(quant|cast|convert|cvt).*(fp8|float8|e4m3|e5m2)"),
    # A mixture of experts' routing: gating with top-k, aligning and sorting tokens by expert, permuting them to
    # their experts and back, summing their outputs (the experts' grouped GEMMs are gemm).
    ("moe_routing", r"moe_?(align|sum|permute|unpermute|sort|count|scatter|gather|topk|routing|gate|gating)|"
                    r"(top_?k).{0,12}(gating|softmax|sigmoid)|(gating|softmax|sigmoid).{0,12}top_?k|grouped_?top_?k|"
                    r"(count|sort|align).{0,12}expert|expert.{0,12}(count|sort|offset|map|align|histogram)|"
                    r"(un)?permute.{0,8}(token|row)|(token|row).{0,8}(un)?permute|expand_?input_?rows|"
                    r"finalize_?moe|moe_?finalize|\brout(er|ing)"),
    # Attention and what only attention does: q/k/v packing, rotary position embedding, the KV cache.
    ("attention", r"scaled_dot_product|flash|fmha|efficient_attention|_attention|attn|\bsoftmax|aten::_softmax|"
                  r"qkv|rotary|\brope\b|_rope|rope_|kv_?cache|reshape_and_cache|paged_?att"),
    # Embeddings and every loss function (aten's are named *_loss, cross_entropy, kl_div).
    ("embedding_loss", r"embedding|loss\b|_loss|cross_entropy|log_softmax|kl_div"),
    ("norm", r"rms_?norm|layer_?norm|batch_?norm|group_?norm|_norm\b|rsqrt|moments|\bbn_(fw|bw)"),
    # (fbgemm is a library whose kernels are mostly not GEMMs: its name alone says nothing)
    ("gemm", r"aten::(mm|bmm|addmm|matmul|linear|baddbmm|addbmm|_addmm_activation|addmv|mv|dot|_scaled_mm|"
             r"_grouped_mm|_scaled_grouped_mm)\b|(?<!fb)gemm|gemv|cublas|cutlass|xmma|nvjet|wgmma|_mma|matmul|"
             r"\bCijk_|hipblaslt|rocblas|fused_moe|moe_?mlp|grouped_?mm"),
    ("convolution", r"conv|cudnn|implicit_?gemm|winograd|wgrad|dgrad|miopen"),
    # Only names that say what the work is for: "foreach" and "multi_tensor_apply" say how (inference uses them
    # too); optimizer time is found by its context, the optimizer step's annotation, before any name is read.
    ("optimizer", r"optimizer|adam|\bsgd\b|\blamb(stage|\b)"),
    ("memcpy_memset", r"aten::(copy_|clone|contiguous|fill_|zero_|(zeros|ones|empty|full)(_like)?|empty_strided|"
                      r"new_empty|new_zeros|new_ones|new_full|resize_|set_|_to_copy|to)\b|memcpy|memset|"
                      r"cudamemcpy|cudamemset|copybuffer|fillbuffer"),
    ("elementwise", r"aten::(add|add_|sub|mul|mul_|div|div_|neg|pow|exp|log|sqrt|tanh|sigmoid|silu|gelu|relu|"
                    r"threshold|clamp|where|masked_fill|cat|stack|index|index_select|gather|scatter|slice|select|"
                    r"view|reshape|transpose|permute|expand|unsqueeze|squeeze|flatten|t|mean|sum|max|min|"
                    r"cumsum|arange|triu|tril|cos|sin|lt|gt|le|ge|eq|ne|bitwise|isinf|isnan|any|all|abs|"
                    r"rand|randn|randint|rand_like|randn_like|normal_|uniform_|random_|exponential_|bernoulli_?|dropout|"
                    r"native_dropout|_unsafe_view|as_strided|split|chunk|narrow|"
                    r"unbind|repeat|alias|detach|lift_fresh|_reshape_alias|result_type|item|_local_scalar_dense|"
                    r"is_nonzero|sort|topk|argmax|multinomial|scalar_tensor|lerp|addcmul|addcdiv|rsub|"
                    r"sign|reciprocal|maximum|minimum|fmod|remainder|ceil|floor|round|type_as|_softmax_backward|"
                    # logical and set tests (generate()'s stopping criteria run them on the host every token)
                    r"__and__|__or__|__xor__|__invert__|logical_(and|or|not|xor)|isin|resolve_conj|resolve_neg)|"
                    r"_foreach_|multi_tensor_apply|elementwise|vectorized|unrolled|reduce_kernel|reduction|act_and_mul|silu|"
                    r"gelu|"
                    r"batchnorm|pooling|dropout|fused|index|indices|scatter|gather|cat_|catarray|copy_kernel|"
                    r"triu|tril|arange|fill|where|compare|neg|pow|exp|sqrt|distribution|random|"
                    r"radixsort|devicescan|reducebykey|segmented_?sort|_pool|pool_|permute|transpose"),
]
def _lowercase(rx: str) -> str:
    """The pattern with its letters in lower case, escapes (``\\b``, ``\\d``) left alone."""
    return re.sub(r"(\\.)|([A-Z])", lambda m: m.group(1) or m.group(2).lower(), rx)


# Case-insensitive matching, done by lowering the name once: measured 3x faster than re.IGNORECASE on the
# distinct names of a real A100 trace, which matters when a small trace is analysed in tens of ms.
_COMPILED = [(cat, re.compile(_lowercase(rx))) for cat, rx in RULES]


_ANONYMOUS = re.compile(r"\((anonymous namespace)\)")


def kernel_function(name: str) -> str:
    """What a demangled kernel (or op) name says the function is: ``void deep_ep::intranode::dispatch<8, 768>(int4*,
    ...)`` is ``dispatch``. Template arguments, parameters, the return type and namespaces are dropped."""
    name = _ANONYMOUS.sub("anonymous", name)
    depth, kept = 0, []
    for ch in name:
        if ch in "<([{":
            if ch == "(" and depth == 0:
                break  # the parameter list
            depth += 1
        elif ch in ">)]}":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    words = "".join(kept).split()
    return words[-1].rsplit("::", 1)[-1] if words else ""


# Expert-parallel token exchange: a kernel whose function is to dispatch tokens to the ranks that hold their experts
# or to combine the experts' outputs back, whichever library names it (its namespace says nothing).
_EXCHANGE = re.compile(r"(cached_)?(notify_)?(dispatch|combine)(_kernel|_impl)?|"
                       r"\w*(ep|a2a|all2all|alltoall)_?(dispatch|combine)\w*|\w*(dispatch|combine)_?(ep|a2a)")


@lru_cache(maxsize=65536)
def by_name(name: str) -> str | None:
    """The category a name gives: first what its function is (token exchange), then the rule table."""
    if _EXCHANGE.fullmatch(kernel_function(name).lower()):
        return "communication"
    low = name.lower()
    for cat, rx in _COMPILED:
        if rx.search(low):
            return cat
    return None


# The module or annotation work runs in (``nn.Module: LlamaRMSNorm_3`` in a stack, a ``record_function`` label),
# read from its class or label name: the innermost one that says what it is decides. Layers that compute (MLPs,
# experts, linear layers, activations) stop an outer context: an expert's activation inside an MoE block is not
# routing, a q_proj's bias add inside attention is not attention.
CONTEXTS: list[tuple[str, str]] = [
    ("compute", r"mlp|feed_?forward|ffn|expert|linear|conv|dropout|activation|silu|gelu|relu|swiglu|geglu"),
    ("attention", r"attention|attn|rotary|\brope|multihead|\bmha\b"),
    ("norm", r"norm"),
    ("moe_routing", r"moe|router|routing|gate\b|gate_?\d|gating|top_?k"),
    ("embedding_loss", r"embedding|loss"),
]
_CONTEXTS = [(cat, re.compile(rx)) for cat, rx in CONTEXTS]
MODULE_FRAME = "nn.Module: "
_INSTANCE = re.compile(r"_\d+$")
# What a layer's context may override: work whose own name says only how it is done (elementwise, copies) or
# that a router shares with attention (softmax). GEMMs, convolutions, communication and quantization stay.
OVERRIDABLE = {None, "elementwise", "memcpy_memset", "attention", "embedding_loss"}


@lru_cache(maxsize=65536)
def context_of(name: str) -> str | None:
    """The context a module frame or annotation opens, or None for one that says nothing (a container)."""
    low = _INSTANCE.sub("", name.removeprefix(MODULE_FRAME)).lower()
    for cat, rx in _CONTEXTS:
        if rx.search(low):
            return cat
    return None


def categorize(name: str, phase: str, recompute: bool, context: str | None) -> str:
    """Category of an op's self time (or a kernel's time) from its name and its context (``context_of``)."""
    named = by_name(name)
    if named == "communication":
        return named
    if recompute:
        return "recompute"
    if phase == "optimizer":
        return "optimizer"
    if phase == "data":
        return "data"
    if context == "norm":
        return "norm"  # a norm layer is elementwise and reduction work that only its context names
    if context not in (None, "compute") and named in OVERRIDABLE:
        if context == "moe_routing" and named == "elementwise" and _ACTIVATION.search(name.lower()):
            return named  # an activation in an MoE block is an expert's work
        return context
    return named or "other"


_ACTIVATION = re.compile(r"silu|gelu|relu|swiglu|act_and_mul|tanh")
