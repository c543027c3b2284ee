"""The estimator's stand-in for autocast (``TargetDevice``) against PyTorch's own autocast kernels.

Autocast does not dispatch on meta tensors, so the estimator casts by hand. The reference needs no GPU: fake
tensors (``FakeTensorMode``) that say they are on CUDA carry CUDA's autocast dispatch key, so the real CUDA
autocast kernels run on them. Each op, on each device, must return the same dtype and save the same tensors for
backward (dtype and shape) under the stand-in on the meta device as under real autocast. The table holds ops
autocast changes and ops it must leave alone, and whole tiny models check the same of everything a training forward saves."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from transformers import AutoConfig

from profkit.core.methods import get_method, with_overrides
from profkit.model.build import meta_model
from profkit.model.fake_cuda import on_fake_device, real_autocast, saved_by
from profkit.predict.stand_ins import TargetDevice, contiguous_batches


def _labels(x):
    return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


OPS = {
    # autocast's float32 ops
    "exp": torch.exp, "log": torch.log, "rsqrt": torch.rsqrt, "reciprocal": torch.Tensor.reciprocal,
    "pow": lambda x: x.pow(2), "**": lambda x: x ** 3, "rpow": lambda x: 2 ** x, "square": torch.square, "rtruediv": lambda x: 1.0 / x,
    "softplus": F.softplus, "logsumexp": lambda x: torch.logsumexp(x, -1), "cosh": torch.cosh,
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)), "rms_norm": lambda x: F.rms_norm(x, (x.shape[-1],)),
    "layer_norm_affine": lambda x: F.layer_norm(x, (x.shape[-1],), torch.ones_like(x[0]), torch.zeros_like(x[0])),
    "group_norm": lambda x: F.group_norm(x, 2), "norm": lambda x: x.norm(dim=-1),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.detach()), "cdist": lambda x: torch.cdist(x, x.detach()),
    "mse_loss": lambda x: F.mse_loss(x, x.detach()), "l1_loss": lambda x: F.l1_loss(x, x.detach()),
    "kl_div": lambda x: F.kl_div(x, x.detach(), reduction="batchmean"), "nll_loss": lambda x: F.nll_loss(x, _labels(x)),
    "bce_with_logits": lambda x: F.binary_cross_entropy_with_logits(x, x.detach()),
    # float32 output, the input not copied
    "softmax": lambda x: F.softmax(x, -1), "log_softmax": lambda x: F.log_softmax(x, -1),
    "softmax_method": lambda x: x.softmax(-1), "sum": lambda x: x.sum(-1), "cumsum": lambda x: x.cumsum(-1),
    "prod": lambda x: x.prod(-1), "vector_norm": lambda x: torch.linalg.vector_norm(x, dim=-1),
    "softmax_asked_bf16": lambda x: F.softmax(x, -1, dtype=torch.bfloat16),
    # cross-entropy: on CUDA a log-softmax in the input's dtype and an fp32 nll_loss; a float32 op on CPU
    "cross_entropy": lambda x: F.cross_entropy(x, _labels(x)),
    "cross_entropy_sum": lambda x: F.cross_entropy(x, _labels(x), reduction="sum", ignore_index=3),
    # left in the input's dtype
    "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "silu": F.silu, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "mean": lambda x: x.mean(-1), "sqrt": torch.sqrt, "relu": F.relu,
    "where": lambda x: torch.where(x > 0, x, 0.0), "amax": lambda x: x.amax(-1), "var": lambda x: x.var(-1),
    "dropout": lambda x: F.dropout(x, 0.1), "dropout_eval": lambda x: F.dropout(x, 0.1, training=False),
    "topk": lambda x: torch.topk(x, 2).values, "mul": lambda x: x * x, "scaled": lambda x: x * 0.5,
    # lower precision
    "matmul": lambda x: x @ x.t(), "einsum": lambda x: torch.einsum("ij,kj->ik", x, x.float()),
    "inner": lambda x: torch.inner(x, x),
    # the widest input's dtype (on CPU, mixed dtypes are refused, by both)
    "tensordot": lambda x: torch.tensordot(x, x.float(), dims=([1], [1])),
    "bilinear": lambda x: F.bilinear(x, x, torch.ones(3, 8, 8, device=x.device)),
    "addcmul": lambda x: torch.addcmul(x, x, torch.ones(8, device=x.device)),
    "cat": lambda x: torch.cat([x, x.float()]), "stack": lambda x: torch.stack([x, x.float()]), "linear_fp32_weight": lambda x: F.linear(x, torch.ones(8, 8, device=x.device)),
}


def _saved(fn, x) -> tuple[torch.dtype, Counter]:
    out: list = []
    saved = saved_by(lambda: out.append(fn(x)))
    # A norm's per-row statistics are fp32 on meta and in the input's dtype on a CPU whatever autocast does: bytes
    # per token, not per element, and not autocast's doing, so only tensors larger than one value a row compare.
    rows = x.numel() // x.shape[-1]
    return out[0].dtype, Counter({key: n for key, n in saved.items() if torch.Size(key[1]).numel() > rows})


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("op", OPS)
def test_each_op_is_cast_as_autocast_casts_it(op, device):
    """Or refused by both: an op autocast does not cast refuses mixed dtypes on the meta device too."""
    try:
        with FakeTensorMode(), real_autocast(device):
            real = _saved(OPS[op], torch.rand(4, 8, device=device, dtype=torch.bfloat16, requires_grad=True))
    except RuntimeError:
        with pytest.raises(RuntimeError), TargetDevice(device, torch.bfloat16):
            _saved(OPS[op], torch.rand(4, 8, device="meta", dtype=torch.bfloat16, requires_grad=True))
        return
    with TargetDevice(device, torch.bfloat16):
        stand_in = _saved(OPS[op], torch.rand(4, 8, device="meta", dtype=torch.bfloat16, requires_grad=True))
    assert stand_in == real


def _forward_saves(model, device: str) -> Counter:
    """What a training forward saves, the loss' included, by dtype and shape; the weights apart."""
    batch = torch.zeros(2, 16, dtype=torch.long, device=device)
    with contiguous_batches():
        return saved_by(lambda: model(input_ids=batch, labels=batch), [*model.parameters(), *model.buffers()])


SMALL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, vocab_size=256,
             bos_token_id=0, eos_token_id=0)
CONFIGS = {
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, multi_query=True, n_positions=64, n_inner=192, vocab_size=256,
                        bos_token_id=0, eos_token_id=0),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256, bos_token_id=0, eos_token_id=0),
    "llama": dict(SMALL, num_key_value_heads=2),
    "qwen2_moe": dict(SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
    "arcee": dict(SMALL, num_key_value_heads=2),  # a squared-ReLU MLP: torch.square is autocast's pow
    "mamba2": dict(hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, state_size=16, n_groups=1,
                   chunk_size=8, vocab_size=256, expand=2),  # the chunked scan: einsums
}


@pytest.mark.parametrize("model_type, method", [
    ("gpt_bigcode", "qlora"), ("gpt_bigcode", "lora"), ("gpt2", "full"), ("llama", "qlora"), ("qwen2_moe", "lora"),
    ("arcee", "full"), ("mamba2", "full"),
])
def test_a_forward_saves_what_it_saves_under_real_cuda_autocast(model_type, method, monkeypatch):
    """QLoRA keeps the norms in the model's dtype (--no-kbit-upcast), as fms-acceleration trains it; the 4-bit
    layers are the estimator's stand-in in both runs, which is what makes them comparable. transformers asks the
    GPU's compute capability before a grouped matmul; the answer is an H100's."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    chosen = with_overrides(get_method(method), precision="bf16-mixed", attention="eager",
                            kbit_upcast=False if method == "qlora" else None,
                            lora_targets=("c_attn",) if model_type == "gpt_bigcode" and method != "full" else None)
    config = AutoConfig.for_model(model_type, **CONFIGS[model_type])
    model, _, plan = meta_model(chosen, config, "cuda", torch.bfloat16)
    assert plan.autocast == torch.bfloat16
    with TargetDevice("cuda", torch.bfloat16):
        stand_in = _forward_saves(model, "meta")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = on_fake_device(model, mode, "cuda")
        with real_autocast("cuda"):
            real = _forward_saves(fake, "cuda")
    assert stand_in == real
    if model_type in ("gpt_bigcode", "gpt2"):  # LayerNorm models: autocast's fp32 norms keep fp32 activations
        assert any(dtype == torch.float32 for dtype, shape in real if len(shape) == 3)
