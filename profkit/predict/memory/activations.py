"""Activations: one training forward on the meta device under ``saved_tensors_hooks``, every tensor autograd saves for
backward counted once per storage and attributed to the decoder layer that saved it. Without gradient checkpointing
that is what is held at the end of forward. With it, only what lies outside the checkpointed layers is saved, plus each
layer's inputs; during backward one layer is recomputed at a time."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from profkit.core.methods import Method
from profkit.core.units import human_bytes
from profkit.model.build import decoder_layers
from profkit.model.loss import chunked_bytes, gradient_bytes, live_beside_logits, loss_of_logits
from profkit.model.storage import storage_id
from profkit.predict.memory.assumptions import assumptions
from profkit.predict.memory.contribution import Contribution
from profkit.predict.memory.result import EstimateError
from profkit.predict.stand_ins import Target, TargetDevice, contiguous_batches


@dataclass
class SavedForBackward:
    """Bytes autograd holds for backward, by where they were saved."""

    before_layers: int  # embeddings, rotary tables, the batch itself
    layers: list[int]  # per checkpointable decoder layer
    layer_inputs: int  # what a checkpointed layer keeps: its input tensors (unique storages)
    after_layers: int  # final norm, LM head, loss
    at_loss: int  # live while the loss is computed but not saved: the LM head's input, the logits the loss
    # reads, and the copies of them the loss makes (profkit.model.loss)
    loss_backward: int  # the loss' two gradients of the logits' size, live together at the start of backward
    cache_held: int = 0  # what a KV cache built in the forward holds that checkpointing keeps nothing else of
    returned_logits: int = 0  # the 16-bit logits the model returns, where nothing saves them
    logits_in_fp32: int = 0  # an fp32 copy of those

    def _saved_by_the_forward(self, checkpointing: bool) -> int:
        layers = self.layer_inputs if checkpointing else sum(self.layers)
        return self.before_layers + layers + self.after_layers

    def end_of_forward(self, checkpointing: bool) -> int:
        """The forward's high point: at the loss, where the logits are live beside everything saved."""
        return self._saved_by_the_forward(checkpointing) + self.at_loss

    def outputs_converted(self, checkpointing: bool) -> int:
        """After the forward, under accelerate's mixed precision (convert_outputs_to_fp32): the model's 16-bit
        logits beside the fp32 copy made of them for its outputs; the loss' own copies are freed by then."""
        return self._saved_by_the_forward(checkpointing) + self.returned_logits + self.logits_in_fp32

    def during_backward(self, checkpointing: bool) -> int:
        """Without checkpointing, backward starts from everything saved. With it, the high point is either
        the start (what was saved outside the layers, and the layer inputs) or the recomputation of a layer
        (the layer inputs, what was saved before the layers and one layer's tensors; the LM head's and the
        loss' are freed by then)."""
        if not checkpointing:
            return self.before_layers + sum(self.layers) + self.after_layers
        return max(self.before_layers + self.layer_inputs + self.after_layers,
                   self.before_layers + self.layer_inputs + max(self.layers, default=0))



class _SavedCounter:
    """What autograd saves in one forward, counted once per storage by the region that saved it (``before`` the
    decoder layers, ``layer<i>``, ``after`` them), the layers' inputs, and what is live at the loss.

    ``gathered``: ids of parameters that ZeRO-3 gathers into a fresh buffer for each use and releases after, with that
    buffer's bytes (a 4-bit weight's packed storage, not its meta stand-in's); when autograd saves one of those, the
    saved tensor is that buffer, so it counts like an activation."""

    def __init__(self, model, gathered: dict[int, int]):
        self.copies = {storage_id(t): gathered[id(t)] for t in model.parameters() if id(t) in gathered}
        self.static = {storage_id(t) for t in [*model.parameters(), *model.buffers()] if id(t) not in gathered}
        self.seen: dict[tuple[str, int], str] = {}  # each counted storage, with the region that saved it
        self.region = "before"
        self.by_region: dict[str, int] = {"before": 0, "after": 0}
        self.layer_order: list[str] = []
        self.inputs: dict[tuple[str, int], int] = {}
        self.at_loss: dict[tuple[str, int], int] = {}
        self.head_input: list[int] = []
        # A meta storage's key is its object's address: a storage freed while the forward runs (a branch whose graph
        # is dropped) could hand its address to a later one, which would then be taken as already counted. Holding
        # every counted tensor keeps each address taken (on meta, holding costs nothing).
        self.held: list[torch.Tensor] = []

    def count(self, t: torch.Tensor, region: str) -> None:
        key = storage_id(t)
        if key in self.static or key in self.seen:
            return
        self.seen[key] = region
        self.held.append(t)
        self.by_region[region] = self.by_region.get(region, 0) + self.copies.get(key, t.untyped_storage().nbytes())

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.count(t, self.region)
        return t

    def enter(self, module, args, kwargs) -> None:
        name = f"layer{len(self.layer_order)}"
        self.layer_order.append(name)
        self.region = name
        for value in [*args, *kwargs.values()]:
            for t in (value if isinstance(value, (tuple, list)) else (value,)):
                if isinstance(t, torch.Tensor) and storage_id(t) not in self.static:
                    self.inputs.setdefault(storage_id(t), t.untyped_storage().nbytes())
                    self.held.append(t)  # its address stays taken, as the counted tensors' do

    def leave(self, module, args, kwargs, output) -> None:
        self.region = "after"

    def lm_head_input(self, module, args, output) -> None:
        self.at_loss.setdefault(storage_id(args[0]), args[0].untyped_storage().nbytes())
        self.head_input.append(args[0].numel() * args[0].element_size())
        self.held.append(args[0])  # counted by its address, which must stay taken as the saved tensors' do

    def hook(self, model, layers) -> list:
        handles = [h for m in layers for h in (m.register_forward_pre_hook(self.enter, with_kwargs=True),
                                               m.register_forward_hook(self.leave, with_kwargs=True))]
        handles.append(model.get_output_embeddings().register_forward_hook(self.lm_head_input))
        return handles

    def live_at_loss(self) -> int:
        return sum(b for key, b in self.at_loss.items() if key not in self.seen)

    def held_by_cache(self, cache) -> int:
        """Under checkpointing a layer's saved tensors are dropped when it returns; the cache keeps what it was
        handed, unless that is a layer input or saved outside the layers (counted already)."""
        cached = {storage_id(t): t.untyped_storage().nbytes() for t in (cache.handed_over if cache is not None else [])}
        return sum(b for key, b in cached.items()
                   if key not in self.static and key not in self.inputs and self.seen.get(key) not in ("before", "after"))


def saved_for_backward(model, batch_size: int, seq_len: int, target: Target, autocast: torch.dtype | None,
                       gathered: dict[int, int] | None = None, loss: str = "fp32",
                       builds_cache: bool = False) -> SavedForBackward:
    """One training forward on the meta device, the loss computed as ``loss`` computes it (profkit.model.loss);
    every saved tensor counted once per storage (``_SavedCounter``, which says what ``gathered`` is).
    ``builds_cache``: the forward builds a KV cache as transformers 4 did (``_HandedOverCache``), and what it holds
    beyond the layers' inputs is counted apart."""
    counter = _SavedCounter(model, gathered or {})
    layers = decoder_layers(model)
    if not layers:
        raise EstimateError(f"{type(model).__name__}: no decoder layers that transformers can checkpoint were "
                            "found, so activations cannot be attributed per layer")
    handles = counter.hook(model, layers)
    batch = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
    counter.count(batch, "before")  # the batch is held through the step (input_ids and labels are one tensor)
    cache = _training_cache(model) if builds_cache else None
    caching = {"use_cache": True, "past_key_values": cache} if cache is not None else {}
    try:
        with contiguous_batches(), torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t), \
                TargetDevice(target, autocast):
            if loss == "chunked":  # the decoder only: the loss' chunks are checkpointed, so counted below
                output = model.get_decoder()(input_ids=batch, **caching).last_hidden_state
            elif loss == "fp32":  # as the model computes it
                output = model(input_ids=batch, labels=batch, **caching).logits
            else:
                output = model(input_ids=batch, **caching).logits
                loss_of_logits(output, batch, loss)
        if loss == "chunked":
            loss_backward, returned = _chunked_loss(counter, model, output, autocast), (0, 0)
        else:
            loss_backward, returned = _loss_of_logits(counter, model, output, loss, target, autocast)
        del output
    finally:
        for h in handles:
            h.remove()
    return SavedForBackward(counter.by_region["before"], [counter.by_region.get(n, 0) for n in counter.layer_order],
                            sum(counter.inputs.values()), counter.by_region["after"], counter.live_at_loss(),
                            loss_backward, counter.held_by_cache(cache), *returned)


def _training_cache(model) -> _HandedOverCache:
    cache = _HandedOverCache(model.config)
    if any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers):
        architecture = type(model.config).__name__.removesuffix("Config")
        raise EstimateError(f"--keeps-kv-cache: {architecture} caches its state-space layers' states beside "
                            "attention's keys and values; what such a cache holds in training is not modelled")
    return cache


def _chunked_loss(counter: _SavedCounter, model, hidden: torch.Tensor, autocast: torch.dtype | None) -> int:
    """A fused linear cross-entropy over the decoder's output: what its checkpointed chunks save and hold at the loss;
    returns the loss' backward."""
    head = model.get_output_embeddings()
    held_by_loss = chunked_bytes(tuple(hidden.shape), hidden.dtype, head.out_features, autocast or head.weight.dtype)
    counter.by_region["after"] += held_by_loss["saved"]
    counter.at_loss[("a chunk's logits", 0)] = held_by_loss["at_loss"]
    # A trainable LM head's weight gradient builds up chunk by chunk through the loss' backward: the sum so far beside
    # the latest chunk's.
    head_grad = head.weight.numel() * head.weight.element_size() if head.weight.requires_grad else 0
    return held_by_loss["backward"] + 2 * head_grad


def _loss_of_logits(counter: _SavedCounter, model, logits: torch.Tensor, loss: str, target: Target,
                    autocast: torch.dtype | None) -> tuple[int, tuple[int, int]]:
    """The loss over the logits: what is live beside them at the loss; returns the loss' backward, and the bytes of
    the 16-bit logits the model returns where nothing saves them with an fp32 copy's."""
    # The logits the loss reads: the LM head's output, or what the model makes of it (Gemma 2 soft-caps them).
    counter.at_loss.setdefault(storage_id(logits), logits.untyped_storage().nbytes())
    returned = (0, 0)
    if logits.dtype in (torch.float16, torch.bfloat16) and storage_id(logits) not in counter.seen:
        returned = (logits.untyped_storage().nbytes(), logits.numel() * 4)
    for name, size in live_beside_logits(tuple(logits.shape), logits.dtype, loss).items():
        counter.at_loss[(name, 0)] = size
    loss_backward = gradient_bytes(tuple(logits.shape), logits.dtype, loss, target if autocast else None)
    if loss == "sum":
        # The summed logits' gradient is the logits' size once, not twice as cross-entropy's: the peak is then the
        # LM head's backward, which makes the head's weight gradient (trainable) and its input's beside that gradient.
        head = model.get_output_embeddings().weight
        loss_backward += sum(counter.head_input) + (head.numel() * head.element_size() if head.requires_grad else 0)
    return loss_backward, returned


class _HandedOverCache(DynamicCache):
    """The KV cache of a training forward as transformers 4 kept it: each layer's keys and values as the layer
    handed them over, not copied (its tuples held the tensors themselves, and a view holds its whole storage:
    GPTBigCode's and GPT-2's keys are views of the fused QKV projection's output). Today's cache copies them."""

    def __init__(self, config):
        super().__init__(config=config)  # the layers the model's own cache would have (state-space ones too)
        self.handed_over: list[torch.Tensor] = []

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.handed_over += [key_states, value_states]
        return key_states, value_states



def forward_and_loss(saved: SavedForBackward, method: Method, config, plan, engine: str, batch_size: int,
                     seq_len: int) -> Contribution:
    """What the forward saves and the loss holds, at the forward's end and through backward; the loss' backward (two
    gradients of the logits' size for cross-entropy: nll_loss' and log_softmax's, live together, as a CPU recording of
    micro LoRA holds them at its backward peak) as a temporary."""
    checkpointing = method.gradient_checkpointing
    forward = saved.end_of_forward(checkpointing)
    part = Contribution()
    if engine == "trainer" and plan.autocast is not None and saved.logits_in_fp32:
        # accelerate's mixed precision wraps the forward in convert_outputs_to_fp32: its outputs leave it in fp32
        part.detail["logits_converted_to_fp32"] = saved.logits_in_fp32
        part.notes.append(f"the Trainer's mixed precision (accelerate) returns the forward's outputs in fp32: an fp32 "
                          f"copy of the logits ({human_bytes(saved.logits_in_fp32)}) beside the 16-bit ones when the "
                          "forward returns, freed before backward")
        forward = max(forward, saved.outputs_converted(checkpointing))
    part.detail.update(saved_before_layers=saved.before_layers, saved_per_layer_max=max(saved.layers),
                       saved_layers_total=sum(saved.layers), saved_after_layers=saved.after_layers,
                       layer_inputs=saved.layer_inputs, live_at_loss=saved.at_loss, loss_backward=saved.loss_backward)
    part.notes += assumptions(config, plan, batch_size, seq_len, checkpointing, forward, method.loss)
    part.add("activations", forward, saved.during_backward(checkpointing))
    part.add("temporaries", backward=saved.loss_backward)
    return part
