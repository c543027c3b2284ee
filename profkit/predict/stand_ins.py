"""What the meta device does differently from the target device, set as the target would do it.

The estimator runs the model on the meta device (shapes and dtypes, no memory). Three things happen there that
would not on the target, so they are set here (the reason for hand-written code): the scaled-dot-product-attention
kernel (on meta, PyTorch always picks the math kernel, which saves the full attention matrix; the CPU and CUDA
flash kernels save only q, k, v, the output and a log-sum-exp); CUDA's dropout (a fused kernel keeping a bool
mask, where meta keeps one in the input's dtype); and autocast (it does not dispatch on meta tensors).
tests/test_autocast_stand_in.py holds ``TargetDevice`` to PyTorch's own autocast and dropout kernels, run without
a GPU on fake CUDA tensors (``profkit.model.fake_cuda``).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch
from torch.utils import _pytree as pytree
from transformers import masking_utils

Target = Literal["cpu", "cuda"]

_FP32_LOSSES = ("binary_cross_entropy_with_logits cosine_embedding_loss hinge_embedding_loss kl_div l1_loss huber_loss "
                "margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss nll_loss poisson_nll_loss "
                "smooth_l1_loss soft_margin_loss triplet_margin_loss")


def _callables(names: str) -> set:
    """Every Python callable by which an op of these names is called: torch's, the Tensor method, F's, linalg's."""
    spaces = (torch, torch.Tensor, torch.nn.functional, torch.linalg)
    return {getattr(space, name) for name in names.split() for space in spaces if hasattr(space, name)}


class TargetDevice(torch.overrides.TorchFunctionMode):
    """Make meta-device ops save what the target device's kernels save (see the module docstring)."""

    # CUDA autocast's lower-precision ops (torch.amp's "ops that can autocast to float16"), as Python calls them
    F = torch.nn.functional
    LOWER = {F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.bmm,
             torch.Tensor.mm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm,
             torch.addbmm, torch.Tensor.addbmm, torch.addmv, torch.Tensor.addmv, torch.addr, torch.Tensor.addr,
             torch.mv, torch.Tensor.mv, torch.chain_matmul, torch.linalg.multi_dot, F.conv1d, F.conv2d, F.conv3d,
             F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.prelu,
             # composites whose matrix products autocast casts (Mamba2's chunked scan is einsums)
             torch.einsum, torch.inner, torch.Tensor.inner}
    # Autocast's float32 ops: their floating inputs are cast to fp32, so they return, and save, fp32. A LayerNorm
    # on a bf16 residual stream saves an fp32 copy of it and returns fp32, and a 4-bit layer casts its output back
    # to its input's dtype, so under CUDA autocast a LayerNorm model's layers run in fp32 between the matmuls.
    # torch.amp's lists ("ops that can autocast to float32"), each checked against the real autocast kernels by
    # tests/test_autocast_stand_in.py. CPU autocast keeps norms and softmax in the input's dtype.
    FP32 = {"cuda": _callables("acos asin cosh erfinv exp expm1 log log10 log1p log2 reciprocal rsqrt sinh tan pow "
                               "__pow__ __rpow__ __rtruediv__ __rdiv__ square dist cdist pdist renorm cosine_similarity "
                               "layer_norm group_norm rms_norm softplus logsumexp " + _FP32_LOSSES),
            "cpu": _callables("cdist prod cross_entropy binary_cross_entropy " + _FP32_LOSSES)}
    # Float32 ops that take a dtype: run with dtype=fp32 unless one is given, so the output is fp32 but no fp32
    # copy of the input is made (softmax's half-to-float kernels).
    FP32_OUTPUT = {"cuda": _callables("softmax log_softmax softmin cumsum cumprod prod sum norm vector_norm"),
                   "cpu": set()}
    # Ops that autocast runs in the widest floating dtype among their inputs.
    WIDEST = {"cuda": _callables("addcdiv addcmul atan2 bilinear cross dot grid_sample index_put scatter_add "
                                 "tensordot"),
              "cpu": _callables("stack cat index_copy")}
    # MoE experts' grouped matmul, [tokens, K] x [experts, K, N]. Not autocast-enabled (transformers casts the input
    # to the experts' dtype); torch's meta kernel takes bf16 only where the device kernels take fp32 too.
    GROUPED = {f for f in (getattr(torch.nn.functional, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f}

    def __init__(self, target: Target, autocast: torch.dtype | None):
        super().__init__()
        self.target, self.half = target, autocast
        self.autocast = autocast is not None
        self.fp32, self.fp32_output, self.widest = self.FP32[target], self.FP32_OUTPUT[target], self.WIDEST[target]
        # autocast caches casts of leaf weights per forward; the weight is kept with its cast so that its id is
        # never another tensor's (ZeRO-3's linear casts a fresh leaf view of each weight)
        self.cast_cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def _cast(self, x):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != self.half):
            return x
        if x.is_leaf and x.requires_grad:
            cached = self.cast_cache.get(id(x))
            if cached is None or cached[0] is not x:
                cached = self.cast_cache[id(x)] = (x, x.to(self.half))
            return cached[1]
        return x.to(self.half)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            if self.autocast:
                args, kwargs = tuple(self._cast(a) for a in args), {k: self._cast(v) for k, v in kwargs.items()}
            return self._attention(*args, **kwargs)
        if func in self.GROUPED and args[0].dtype != torch.bfloat16 and args[0].dim() == 2 and args[1].dim() == 3:
            # One matrix product with the first expert's weight has the grouped product's output, its FLOPs (the
            # experts' rows add up to the input's), what autograd saves (each operand where the other needs a
            # gradient: a frozen expert keeps its input unsaved) and its gradients' shapes; it runs backward too.
            return args[0] @ args[1][0]
        if func is torch.nn.functional.dropout and self.target == "cuda" and _dropping(*args, **kwargs):
            # CUDA's dropout is the fused kernel, which keeps a bool mask; meta's (like CPU's) keeps a mask in the
            # input's dtype, twice or four times the bytes
            return torch.native_dropout(args[0], kwargs.get("p", args[1] if len(args) > 1 else 0.5), True)[0]
        if self.autocast and func in self.LOWER:
            args, kwargs = tuple(self._cast(a) for a in args), {k: self._cast(v) for k, v in kwargs.items()}
        elif self.autocast and func in self.fp32:
            args, kwargs = tuple(_to_fp32(a) for a in args), {k: _to_fp32(v) for k, v in kwargs.items()}
        elif self.autocast and func in self.widest:
            floats = [t.dtype for t in pytree.tree_leaves((args, kwargs))
                      if isinstance(t, torch.Tensor) and t.is_floating_point()]
            widest = max(floats, key=lambda d: d.itemsize, default=None)
            args, kwargs = pytree.tree_map_only(torch.Tensor, lambda t: t.to(widest) if t.is_floating_point() else t,
                                                (args, kwargs))
        elif self.autocast and func in self.fp32_output and kwargs.get("dtype") is None and _lower(args[0]):
            kwargs = {**kwargs, "dtype": torch.float32}
        elif self.autocast and func is torch.nn.functional.cross_entropy and self.target == "cuda" \
                and _lower(args[0]):
            return self._cuda_cross_entropy(*args, **kwargs)
        return func(*args, **kwargs)

    @staticmethod
    def _cuda_cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                            reduction="mean", label_smoothing=0.0):
        """CUDA autocast has no rule for cross_entropy itself: its log-softmax is asked for the input's dtype and
        keeps it; its nll_loss is a float32 op, so it saves an fp32 copy of the log-probabilities."""
        dim = 1 if input.dim() >= 2 else 0
        log_probs = torch.nn.functional.log_softmax(input, dim, dtype=input.dtype)
        if label_smoothing or target.is_floating_point():  # not modelled part by part: all of it on the copy
            return torch.nn.functional.cross_entropy(log_probs.float(), target, weight, None, ignore_index, None,
                                                     reduction, label_smoothing)
        return torch.nn.functional.nll_loss(log_probs.float(), target, weight, None, ignore_index, None, reduction)

    def _attention(self, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        sdpa = torch.nn.functional.scaled_dot_product_attention
        # PyTorch's CPU flash kernel takes no dropout; its CUDA kernels do (they keep the RNG state, not a mask).
        if (dropout_p and self.target == "cpu") or q.shape[-1] != v.shape[-1] or q.shape[-1] > 256:
            return sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa)
        if self.target == "cpu":
            return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q, k, v, 0.0, is_causal, attn_mask=attn_mask, scale=scale)[0]
        if attn_mask is None and q.dtype in (torch.float16, torch.bfloat16):
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False,
                                                                      scale=scale)[0]
        if k.shape[-3] != q.shape[-3]:  # memory-efficient attention takes no grouped heads
            k = k.repeat_interleave(q.shape[-3] // k.shape[-3], -3)
            v = v.repeat_interleave(q.shape[-3] // v.shape[-3], -3)
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, attn_mask, True, dropout_p, is_causal, scale=scale)[0]


def _dropping(input, p=0.5, training=True, inplace=False) -> bool:
    return bool(p) and training and not inplace and input.is_floating_point()


def _lower(x) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16)


def _to_fp32(x):
    return x.float() if _lower(x) else x


@contextlib.contextmanager
def contiguous_batches():
    """transformers looks for packed sequences in the position ids, and for padding in an attention mask a model
    made itself (BioGPT's all-ones mask), data-dependent tests that meta tensors cannot answer; profkit's batches
    and prompts are contiguous blocks of real tokens, for which the answers are "none" and "no padding".
    transformers offers no argument for either, so its functions are swapped for the answers while the meta
    forward runs."""
    packed, all_true = masking_utils.find_packed_sequence_indices, masking_utils.fast_all
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    masking_utils.fast_all = lambda mask: True if mask.device.type == "meta" else all_true(mask)
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices, masking_utils.fast_all = packed, all_true
