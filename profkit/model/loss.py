"""The causal-LM loss in each form a training script computes it; what each holds differs by whole copies of the
logits, the largest tensors of a short-sequence step.

- ``fp32``: transformers' ``ForCausalLMLoss`` since 4.49 (every model in transformers 5): an fp32 copy of the
  logits, the labels shifted rather than the logits. The model computes it (``labels=``).
- ``fp32-shifted``: the same in transformers 4.46-4.48, which also copies the fp32 logits shifted by one.
- ``logits-dtype``: transformers 4's models with a loss of their own (GPT-2, GPTBigCode, Falcon and others before
  4.49): a shifted copy of the logits, cross-entropy in their own dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from profkit.core.methods import LOSSES


def causal_lm_loss(model, batch: dict[str, torch.Tensor], form: str) -> torch.Tensor:
    """The loss of one batch (``input_ids``, ``labels``) computed as ``form`` computes it."""
    if form == "fp32":
        return model(**batch).loss
    # The outputs stay referenced while the loss runs, as in a model's own loss and in the Trainer's compute_loss:
    # the logits are live beside the loss' copies of them.
    outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
    return loss_of_logits(outputs.logits, batch["labels"], form)


def loss_of_logits(logits: torch.Tensor, labels: torch.Tensor, form: str,
                   num_items: torch.Tensor | int | None = None) -> torch.Tensor:
    """Cross-entropy of ``logits`` against ``labels`` shifted by one, as the shifted forms compute it; over
    ``num_items`` labels when the Trainer counts them across accumulated batches, as transformers' loss does."""
    if form not in LOSSES[1:]:
        raise ValueError(f"loss form {form!r}: the shifted forms are {', '.join(LOSSES[1:])}")
    if form == "fp32-shifted":
        logits = logits.float()
    shifted = logits[..., :-1, :].contiguous()
    targets = labels[..., 1:].contiguous().view(-1)
    if num_items is None:
        return F.cross_entropy(shifted.view(-1, shifted.size(-1)), targets)
    return F.cross_entropy(shifted.view(-1, shifted.size(-1)), targets, reduction="sum") / num_items


def live_beside_logits(shape: tuple[int, int, int], logits_dtype: torch.dtype, form: str) -> dict[str, int]:
    """What the loss holds beside logits of ``shape`` (batch, sequence, vocabulary) while cross-entropy runs, not
    saved for backward: the copies each form makes (the log-softmax output it saves is counted where autograd
    saves it)."""
    batch, seq, vocab = shape
    copies = {}
    if form in ("fp32", "fp32-shifted") and logits_dtype != torch.float32:
        copies["fp32 copy of the logits"] = batch * seq * vocab * 4
    if form != "fp32":
        itemsize = 4 if form == "fp32-shifted" else logits_dtype.itemsize
        copies["shifted copy of the logits"] = batch * (seq - 1) * vocab * itemsize
    return copies


def gradient_bytes(shape: tuple[int, int, int], logits_dtype: torch.dtype, form: str,
                   autocast_device: str | None = None) -> int:
    """The loss' backward: nll_loss' gradient and log_softmax's, live together, each the size of the logits (less
    one position when shifted) in the dtype cross-entropy ran in. Under autocast a 16-bit cross-entropy is not
    all 16-bit: on CUDA its nll_loss runs in fp32 (an fp32 gradient beside its 16-bit cast), on CPU all of it."""
    batch, seq, vocab = shape
    elements = batch * (seq if form == "fp32" else seq - 1) * vocab
    if form != "logits-dtype" or logits_dtype == torch.float32 or autocast_device == "cpu":
        return 2 * elements * 4
    if autocast_device == "cuda":
        return elements * (4 + logits_dtype.itemsize)
    return 2 * elements * logits_dtype.itemsize
