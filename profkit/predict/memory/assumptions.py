"""What the estimate takes where the user said nothing (every sample at full length, the attention kernel, the loss),
and what the other choice would hold: notes beside the figures."""

from __future__ import annotations


def loss_note(loss: str, logits: int, itemsize: int, autocast: bool = False) -> str:
    """Which loss the estimate took (``logits``: their element count), and what the others would hold."""
    gib = 2**30
    chunked = (f"a fused linear cross-entropy (Liger's, Cut Cross-Entropy, Unsloth's: --loss chunked) never holds "
               f"the whole logits, up to {2 * logits * 4 / gib:,.2f} GiB less at the backward's peak")
    if loss == "chunked":
        return (f"a fused linear cross-entropy (--loss chunked): the LM head and the loss a chunk of positions at a "
                f"time, never the whole logits; transformers >= 4.49's loss (--loss fp32) would hold an fp32 copy of "
                f"them ({logits * 4 / gib:,.2f} GiB) and two gradients of that size in backward")
    if loss == "sum":
        return (f"the logits summed (--loss sum), a benchmark's stand-in for a loss: no copy of them, and backward "
                f"copies out their broadcast gradient once; a cross-entropy as transformers >= 4.49 computes it "
                f"(--loss fp32) would hold an fp32 copy of them ({logits * 4 / gib:,.2f} GiB) and two gradients of "
                f"that size in backward")
    if loss == "fp32":
        return (f"the loss as transformers >= 4.49 computes it (--loss fp32), on an fp32 copy of the logits "
                f"({logits * 4 / gib:,.2f} GiB) whose backward holds two gradients of that size: 4.46-4.48 also "
                f"copied it shifted (--loss fp32-shifted, {logits * 4 / gib:,.2f} GiB more at the loss); {chunked}")
    if loss == "fp32-shifted":
        return (f"the loss as transformers 4.46-4.48 computed it (--loss fp32-shifted): an fp32 copy of the logits "
                f"and a shifted copy of that, {logits * 4 / gib:,.2f} GiB each; transformers >= 4.49 makes no "
                f"shifted copy (--loss fp32); {chunked}")
    own = ("the loss in the logits' own dtype after a shifted copy (--loss logits-dtype), as models with a loss of "
           "their own computed it before transformers 4.49")
    if autocast and itemsize < 4:  # autocast's fp32 nll_loss (CUDA) or cross-entropy (CPU) already copies to fp32
        return (f"{own}, its nll_loss in fp32 under autocast: transformers >= 4.49's form (--loss fp32), an fp32 copy "
                f"of the logits, holds about as much at the backward's peak")
    return (f"{own}: transformers >= 4.49 (--loss fp32) computes it on an fp32 copy, whose backward holds two fp32 "
            f"gradients, about {3 * logits * (4 - itemsize) / gib:,.2f} GiB more at the backward's peak")


def assumptions(config, plan, batch_size: int, seq_len: int, checkpointing: bool, activations: int,
                 loss: str = "fp32") -> list[str]:
    """What the estimate took where the user said nothing, and what the other choice gives."""
    per_k = activations * 1000 // max(batch_size * seq_len, 1)
    notes = [f"every sample taken as {seq_len} tokens (packed, or padded to {seq_len}): padded to the longest "
             f"sample of each batch instead, a batch peaks with its longest sample (activations about "
             f"{per_k / 2**20:,.1f} MiB per 1,000 tokens of the batch), and the CUDA allocator keeps the blocks of "
             "shorter steps (the estimate's \"reserved, lengths grow\")"]
    heads = getattr(config, "num_attention_heads", None)
    layers = 1 if checkpointing else getattr(config, "num_hidden_layers", 0)
    if heads and layers:
        # eager attention keeps the fp32 softmax and its copy in the compute dtype for each layer it saves
        compute = (plan.autocast or plan.fsdp_param_dtype or plan.load_dtype).itemsize
        matrix = layers * batch_size * heads * seq_len * seq_len * (4 + compute)
        if plan.attn_implementation == "eager":
            notes.append(f"eager attention, as asked or as the model offers: a fused kernel (flash, memory-"
                         f"efficient) would not keep the attention matrices, about {matrix / 2**30:,.2f} GiB less")
        else:
            notes.append(f"attention in a fused kernel (flash or memory-efficient, as PyTorch picks): eager "
                         f"attention would keep each saved layer's attention matrix, about {matrix / 2**30:,.2f} "
                         "GiB more")
    vocab = getattr(config, "vocab_size", 0)
    if vocab:
        notes.append(loss_note(loss, batch_size * seq_len * vocab,
                                (plan.autocast or plan.fsdp_param_dtype or plan.load_dtype).itemsize,
                                plan.autocast is not None))
    return notes

