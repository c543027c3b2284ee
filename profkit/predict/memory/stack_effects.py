"""What another loop or an older library keeps that profkit's loop with today's libraries does not: the previous step's
logits (litgpt's loop), the KV cache a training forward builds (transformers 4 under an outside checkpoint wrapper),
the LM head stored in 4 bits (Lightning's bitsandbytes plugin)."""

from __future__ import annotations

import torch

from profkit.core.methods import Method
from profkit.core.units import human_bytes
from profkit.model.storage import storage_bytes
from profkit.predict.memory.activations import SavedForBackward
from profkit.predict.memory.contribution import Contribution
from profkit.predict.stand_ins import Target


def stack_effects(method: Method, model, plan, saved: SavedForBackward, batch_size: int, seq_len: int,
                  target: Target) -> Contribution:
    """Called after the forward that ``saved`` counts: 4-bit layers that keep their inputs have them by then."""
    part = Contribution()
    if method.keeps_previous_logits:
        _previous_logits(part, method, model, plan, batch_size, seq_len)
    if method.keeps_kv_cache:
        _kv_cache(part, method, saved.cache_held)
    if method.quantize_head and target == "cuda" and method.quantization:
        _head_dequantized(part, model, plan)
    return part


def _previous_logits(part: Contribution, method: Method, model, plan, batch_size: int, seq_len: int) -> None:
    """The loop's name for the logits keeps them bound: through this step's backward, and until the next forward
    returns, so at its end beside the new step's own. What a 4-bit layer keeps on its autograd context
    (--bnb-keeps-inputs) outlives backward with them: its inputs, counted once per storage."""
    kept_inputs = [m.kept_input for m in model.modules() if getattr(m, "kept_input", None) is not None]
    head = model.get_output_embeddings().weight
    # What the forward computes in: the autocast dtype, or the weights' own (the LM head's).
    logits_size = (plan.autocast or head.dtype).itemsize if method.loss != "chunked" else 0
    own_logits = batch_size * seq_len * head.shape[0] * logits_size
    previous = own_logits + storage_bytes(kept_inputs)
    part.detail.update(previous_step_held=previous, logits_held_in_backward=own_logits)
    part.add("activations", previous, own_logits)
    inputs = " and its 4-bit layer inputs" if kept_inputs else ""
    part.notes.append(f"--keeps-previous-logits: the loop keeps each step's logits ({human_bytes(own_logits)}) "
                      f"through its backward, and the previous step's logits{inputs} ({human_bytes(previous)}) until "
                      "the next forward returns, beside its own")


def _kv_cache(part: Contribution, method: Method, cache: int) -> None:
    """The cache the forward builds (``saved_for_backward`` measures what it holds): transformers 4's tuples held every
    position of every layer, and nothing else holds them under checkpointing. Alive from the forward to the loop's
    release of the outputs; with --keeps-previous-logits through backward and, the previous step's, to the next
    forward's end. Counted as what it is, the KV cache, not saved activations."""
    part.detail["kv_cache_held"] = cache
    part.add("kv_cache", cache * (2 if method.keeps_previous_logits else 1),
             cache if method.keeps_previous_logits else 0)
    part.notes.append(f"--keeps-kv-cache: the forward's outputs hold every layer's keys and values, with the storage "
                      f"they are views of ({human_bytes(cache)}), until the loop releases them: "
                      + ("through backward, and the previous step's until the next forward returns"
                         if method.keeps_previous_logits else "at the loss, freed before backward"))


def _head_dequantized(part: Contribution, model, plan) -> None:
    """Each use of the 4-bit head (its forward at the loss, its backward first) dequantizes it into fp16, the dtype it
    was quantized from, and casts that to the compute dtype: both alive for the matmul."""
    head = model.get_output_embeddings().weight
    compute = plan.quantization.bnb_4bit_compute_dtype
    dequantized = head.numel() * (2 + (compute.itemsize if compute != torch.float16 else 0))
    part.detail["head_dequantized"] = dequantized
    part.add("temporaries", dequantized, dequantized)
    part.notes.append(f"--quantize-head: the 4-bit LM head dequantized into fp16 and cast for each use "
                      f"({human_bytes(dequantized)}, at the loss and at the start of backward)")
