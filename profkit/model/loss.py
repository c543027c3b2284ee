"""The causal-LM loss in each form a training script computes it; what each holds differs by whole copies of the
logits, the largest tensors of a short-sequence step.

- ``fp32``: transformers' ``ForCausalLMLoss`` since 4.49 (every model in transformers 5): an fp32 copy of the
  logits, the labels shifted rather than the logits. The model computes it (``labels=``).
- ``fp32-shifted``: the same in transformers 4.46-4.48, which also copies the fp32 logits shifted by one.
- ``logits-dtype``: transformers 4's models with a loss of their own (GPT-2, GPTBigCode, Falcon and others before
  4.49): a shifted copy of the logits, cross-entropy in their own dtype.
- ``sum``: the logits summed, a benchmark's stand-in for a loss (transformers' and optimum's attention benchmarks:
  ``logits.sum().backward()``): no copy of the logits; its gradient is a broadcast scalar, which the LM head's
  backward matmul copies out whole in the logits' dtype.
- ``chunked``: a fused linear cross-entropy (Liger's, Cut Cross-Entropy, Unsloth's): the LM head and the loss run
  over the final hidden states a chunk of positions at a time, so the whole logits never exist. Here each chunk runs
  under activation checkpointing (recomputed in backward), with Liger's chunk size: as many positions as make a
  chunk's logits about the size of the hidden states. Cut Cross-Entropy holds less still (blocks, not chunks).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from profkit.core.methods import LOSSES

SHIFTED = tuple(f for f in LOSSES if f not in ("fp32", "chunked", "sum"))  # from the whole logits, labels shifted
OF_LOGITS = (*SHIFTED, "sum")  # computed from the model's whole logits, outside the model


def causal_lm_loss(model, batch: dict[str, torch.Tensor], form: str) -> torch.Tensor:
    """The loss of one batch (``input_ids``, ``labels``) computed as ``form`` computes it."""
    if form == "fp32":
        return model(**batch).loss
    if form == "chunked":
        return chunked_loss(model, batch["input_ids"], batch["labels"])
    # The outputs stay referenced while the loss runs, as in a model's own loss and in the Trainer's compute_loss:
    # the logits are live beside the loss' copies of them.
    outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
    return loss_of_logits(outputs.logits, batch["labels"], form)


def loss_of_logits(logits: torch.Tensor, labels: torch.Tensor, form: str,
                   num_items: torch.Tensor | int | None = None) -> torch.Tensor:
    """Cross-entropy of ``logits`` against ``labels`` shifted by one, as the shifted forms compute it; over
    ``num_items`` labels when the Trainer counts them across accumulated batches, as transformers' loss does. The
    ``sum`` form sums the logits, labels unread."""
    if form not in OF_LOGITS:
        raise ValueError(f"loss form {form!r}: the forms over whole logits are {', '.join(OF_LOGITS)}")
    if form == "sum":
        return logits.sum()
    if form == "fp32-shifted":
        logits = logits.float()
    shifted = logits[..., :-1, :].contiguous()
    targets = labels[..., 1:].contiguous().view(-1)
    if num_items is None:
        return F.cross_entropy(shifted.view(-1, shifted.size(-1)), targets)
    return F.cross_entropy(shifted.view(-1, shifted.size(-1)), targets, reduction="sum") / num_items


def _unwrapped(model):
    """The causal LM inside DeepSpeed's engine and peft's wrapper (their forwards would compute the logits)."""
    model = getattr(model, "module", model)  # DeepSpeed's engine
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def chunk_positions(positions: int, hidden: int, vocab: int) -> int:
    """Liger's chunk size: as many positions as make one chunk's logits the size of the hidden states (vocab / hidden
    chunks), rounded up to a power of two."""
    chunks = -(-vocab // hidden)
    return 1 << max(0, (-(-positions // chunks) - 1).bit_length())


def _chunk_loss(head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(head(hidden).float(), targets, reduction="sum")


def chunked_loss(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The ``chunked`` form: the model's forward for the final hidden states, then ``hidden_cross_entropy``. The
    forward is the whole model's (so DeepSpeed's, peft's and FSDP's hooks run as in any step), asked for the last
    position's logits only; the decoder's output is taken as it leaves the decoder."""
    causal = _unwrapped(model)
    captured: dict[str, torch.Tensor] = {}

    def keep(module, args, output) -> None:  # returning None leaves the output as it is
        captured["hidden"] = output.last_hidden_state

    hook = causal.get_decoder().register_forward_hook(keep)
    try:
        model(input_ids=input_ids, logits_to_keep=1)
    finally:
        hook.remove()
    return hidden_cross_entropy(causal.get_output_embeddings(), captured.pop("hidden"), labels)


def hidden_cross_entropy(head: torch.nn.Module, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the final hidden states a chunk at a time (``chunk_positions``), each chunk's logits
    recomputed in backward rather than kept: the whole logits never exist. Holds a shifted copy of the hidden
    states and labels for backward (``chunked_bytes`` counts what it holds)."""
    shifted = hidden[:, :-1].reshape(-1, hidden.size(-1))  # a copy, as Liger's callers make
    targets = labels[:, 1:].reshape(-1)
    # The vocabulary from the layer, not its weight, which ZeRO-3 keeps partitioned (empty) outside the call.
    size = chunk_positions(shifted.size(0), shifted.size(1), head.out_features)
    total = sum(checkpoint(_chunk_loss, head, shifted[i:i + size], targets[i:i + size], use_reentrant=False)
                for i in range(0, shifted.size(0), size))
    return total / targets.numel()


def chunked_bytes(hidden_shape: tuple[int, int, int], hidden_dtype: torch.dtype, vocab: int,
                  logits_dtype: torch.dtype) -> dict[str, int]:
    """What ``hidden_cross_entropy`` holds: ``saved``, the shifted copies of the hidden states and of the labels
    (int64) that its chunks keep for backward; ``at_loss``, one chunk's logits and their fp32 copy while its loss
    runs; ``backward``, the gradient of the hidden states (filled chunk by chunk) beside one recomputed chunk's
    logits, fp32 copy, saved log-softmax and its two gradients."""
    batch, seq, hidden = hidden_shape
    positions = batch * (seq - 1)
    chunk = min(chunk_positions(positions, hidden, vocab), positions) * vocab
    saved = positions * (hidden * hidden_dtype.itemsize + 8)
    return {"saved": saved, "at_loss": chunk * (logits_dtype.itemsize + 4),
            "backward": saved + chunk * (logits_dtype.itemsize + 4 * 4)}


def live_beside_logits(shape: tuple[int, int, int], logits_dtype: torch.dtype, form: str) -> dict[str, int]:
    """What the loss holds beside logits of ``shape`` (batch, sequence, vocabulary) while cross-entropy runs, not
    saved for backward: the copies each form makes (the log-softmax output it saves is counted where autograd
    saves it)."""
    batch, seq, vocab = shape
    copies = {}
    if form in ("fp32", "fp32-shifted") and logits_dtype != torch.float32:
        copies["fp32 copy of the logits"] = batch * seq * vocab * 4
    if form in SHIFTED:
        itemsize = 4 if form == "fp32-shifted" else logits_dtype.itemsize
        copies["shifted copy of the logits"] = batch * (seq - 1) * vocab * itemsize
    return copies


def gradient_bytes(shape: tuple[int, int, int], logits_dtype: torch.dtype, form: str,
                   autocast_device: str | None = None) -> int:
    """The loss' backward: nll_loss' gradient and log_softmax's, live together, each the size of the logits (less
    one position when shifted) in the dtype cross-entropy ran in. Under autocast a 16-bit cross-entropy is not
    all 16-bit: on CUDA its nll_loss runs in fp32 (an fp32 gradient beside its 16-bit cast), on CPU all of it.
    The ``sum`` form's gradient is one scalar broadcast to the logits' shape, which the LM head's backward matmul
    copies out whole (its GEMM takes no zero strides)."""
    batch, seq, vocab = shape
    if form == "sum":
        return batch * seq * vocab * logits_dtype.itemsize
    elements = batch * (seq if form == "fp32" else seq - 1) * vocab
    if form != "logits-dtype" or logits_dtype == torch.float32 or autocast_device == "cpu":
        return 2 * elements * 4
    if autocast_device == "cuda":
        return elements * (4 + logits_dtype.itemsize)
    return 2 * elements * logits_dtype.itemsize
