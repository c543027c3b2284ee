"""The estimator's stand-in for autocast (``TargetDevice``) against PyTorch's own autocast kernels.

Autocast does not dispatch on meta tensors, so the estimator casts by hand. The reference needs no GPU: fake
tensors (``FakeTensorMode``) that say they are on CUDA carry CUDA's autocast dispatch key, so the real CUDA
autocast kernels run on them. Each op, on each device, must return the same dtype and save the same tensors for
backward (dtype and shape) under the stand-in on the meta device as under real autocast. The table holds ops
autocast changes and ops it must leave alone, and whole tiny models check the same of everything a layer saves."""

from __future__ import annotations

import contextlib
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from transformers import AutoConfig

from profkit.core.methods import get_method, with_overrides
from profkit.model.build import meta_model
from profkit.predict.estimate import TargetDevice, contiguous_batches


def _labels(x):
    return torch.zeros(x.shape[0], dtype=torch.long, device=x.device)


OPS = {
    # autocast's float32 ops
    "exp": torch.exp, "log": torch.log, "rsqrt": torch.rsqrt, "reciprocal": torch.Tensor.reciprocal,
    "pow": lambda x: x.pow(2), "**": lambda x: x ** 3, "rpow": lambda x: 2 ** x, "rtruediv": lambda x: 1.0 / x,
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
    "matmul": lambda x: x @ x.t(), "linear_fp32_weight": lambda x: F.linear(x, torch.ones(8, 8, device=x.device)),
}


@contextlib.contextmanager
def real_autocast(device: str):
    """torch.autocast refuses CUDA on a machine without one; the switches it sets are set directly."""
    enabled, dtype = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    torch.set_autocast_dtype(device, torch.bfloat16)
    torch.set_autocast_enabled(device, True)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)


def _saved(fn, x) -> tuple[torch.dtype, Counter]:
    saved: Counter = Counter()

    storages = set()

    def pack(t):  # once per storage, as the estimator counts (fake tensors have no address: the storage object)
        if t.untyped_storage()._cdata not in storages:
            storages.add(t.untyped_storage()._cdata)
            saved[(t.dtype, tuple(t.shape))] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x)
    # A norm's per-row statistics are fp32 on meta and in the input's dtype on a CPU whatever autocast does: bytes
    # per token, not per element, and not autocast's doing, so only tensors larger than one value a row compare.
    rows = x.numel() // x.shape[-1]
    return y.dtype, Counter({key: n for key, n in saved.items() if torch.Size(key[1]).numel() > rows})


@pytest.mark.parametrize("device", ["cuda", "cpu"])
@pytest.mark.parametrize("op", OPS)
def test_each_op_is_cast_as_autocast_casts_it(op, device):
    with FakeTensorMode(), real_autocast(device):
        real = _saved(OPS[op], torch.rand(4, 8, device=device, dtype=torch.bfloat16, requires_grad=True))
    with TargetDevice(device, torch.bfloat16):
        stand_in = _saved(OPS[op], torch.rand(4, 8, device="meta", dtype=torch.bfloat16, requires_grad=True))
    assert stand_in == real


def _on_fake_device(model, mode: FakeTensorMode, device: str):
    """The meta-device model with every parameter and buffer a fake tensor on ``device`` (tied weights stay tied)."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table, wrap in ((module._parameters, True), (module._buffers, False)):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in done:
                    fake = FakeTensor(mode, t.detach(), torch.device(device))
                    done[id(t)] = torch.nn.Parameter(fake, t.requires_grad) if wrap else fake
                table[name] = done[id(t)]
    return model


def _layer_saves(model, device: str) -> Counter:
    """What a decoder layer's forward saves, by dtype and shape: the second layer, whose input has been through a
    layer (a residual stream that an fp32 op made fp32 stays so)."""
    saved: Counter = Counter()
    where = {"layer": -1}
    layers = [m for m in model.modules() if type(m).__name__.endswith(("DecoderLayer", "Block"))]

    def pack(t):
        if where["layer"] == 1:
            saved[(t.dtype, tuple(t.shape))] += 1
        return t

    for i, layer in enumerate(layers):
        layer.register_forward_pre_hook(lambda *_, i=i: where.update(layer=i))
    batch = torch.zeros(2, 16, dtype=torch.long, device=device)
    with contiguous_batches(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=batch)
    return saved


SMALL = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4, vocab_size=256)
CONFIGS = {
    "gpt_bigcode": dict(n_embd=64, n_layer=2, n_head=4, multi_query=True, n_positions=64, n_inner=192, vocab_size=256,
                        bos_token_id=0, eos_token_id=0),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256, bos_token_id=0, eos_token_id=0),
    "llama": dict(SMALL, num_key_value_heads=2),
    "qwen2_moe": dict(SMALL, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64),
}


@pytest.mark.parametrize("model_type, method", [
    ("gpt_bigcode", "qlora"), ("gpt_bigcode", "lora"), ("gpt2", "full"), ("llama", "qlora"), ("qwen2_moe", "lora"),
])
def test_a_layer_saves_what_it_saves_under_real_cuda_autocast(model_type, method, monkeypatch):
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
        stand_in = _layer_saves(model, "meta")
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = _on_fake_device(model, mode, "cuda")
        with real_autocast("cuda"):
            real = _layer_saves(fake, "cuda")
    assert stand_in == real
    if model_type in ("gpt_bigcode", "gpt2"):  # LayerNorm models: autocast's fp32 norms keep fp32 activations
        assert any(dtype == torch.float32 for dtype, shape in real if len(shape) == 3)
