"""FSDP2 as ``model.fsdp.shard`` applies it: each rank's shards, and what it gathers and reduces during a step (FSDP1's
flat parameters under ``--fsdp-flat``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from profkit.core.methods import Method
from profkit.core.units import human_bytes
from profkit.model.build import decoder_layers
from profkit.predict.memory.contribution import INSTANTS, Contribution
from profkit.predict.memory.optimizer import optimizer_state_bytes, step_counter_bytes
from profkit.predict.memory.parameters import nf4_bytes
from profkit.predict.stand_ins import Target
from profkit.predict.step_replay import ShardedStep


def _shard_numel(shape: tuple[int, ...], world: int) -> int:
    """Elements each rank holds of a parameter FSDP shards: dim 0 in ``world`` chunks, each padded to the first's
    size (``FSDPParam``: ``torch.chunk``, then a padded copy), so rank 0's is every rank's."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world) * math.prod(shape[1:])


@dataclass
class FsdpStep:
    """What FSDP2 holds per rank: the shards (static), and what it gathers and reduces during a step."""

    static: dict[str, int]  # the parameter categories and optimizer_state, per rank, on the device
    host: dict[str, int]  # what CPU offload keeps in pinned host memory, by category
    gradients: int  # the sharded gradients (padded, as its reduce-scatter writes them)
    root: int  # the root unit gathered: embeddings, final norm, LM head (kept from forward to backward)
    layer: int  # the largest decoder layer gathered
    layers: int  # every decoder layer gathered
    root_grads: int  # the root's unsharded gradients alive through the layers' backward (the LM head's)
    layer_grads: int  # a layer's unsharded gradients and its reduce-scatter input
    reshard: bool
    optimizer_temporaries: int
    unsharded_gradients: int  # every trainable parameter's gradient whole (held between micro-batches by no_sync)
    detail: dict[str, int]
    notes: list[str]
    step: ShardedStep  # the same allocations, for the replay

    def instants(self, forward_activations: int, backward_activations: int, logits_grad: int) -> dict:
        """``logits_grad``: the loss' backward, two gradients of the fp32 logits' size.

        Forward at the loss; backward at the larger of two moments: its start (the loss' gradients beside the LM
        head's) or the last layer's backward (the layer gathered, the one before it prefetched, its gradients
        unsharded and reduce-scattered); the optimizer step on the shards."""
        # FSDP keeps the flat output of its latest all-gather (a layer's size) until the next all-gather's copy-in,
        # so that the host cannot free it under the device: a temporary at every instant of forward and backward.
        held_layers = 0 if self.reshard else self.layers
        gathered = self.root + held_layers
        # The loss' two gradients of the logits' size, then the LM head's: one of those beside its weight's gradient.
        start = {"parameters_unsharded": gathered, "activations": backward_activations,
                 "temporaries": max(logits_grad, logits_grad // 2 + self.root_grads) + self.layer}
        in_layer = {"parameters_unsharded": gathered + (self.layer if self.reshard else 0),
                    "activations": backward_activations,
                    "temporaries": self.root_grads + self.layer_grads + self.layer}
        backward = max(start, in_layer, key=lambda d: sum(d.values()))
        return {
            "forward": {**self.static, "parameters_unsharded": gathered, "activations": forward_activations,
                        "temporaries": self.layer},
            "backward": {**self.static, **backward},
            "optimizer": {**self.static, "gradients": self.gradients, "temporaries": self.optimizer_temporaries},
        }

    def contribution(self) -> Contribution:
        """The detail, notes and host bytes; the step's bytes are ``sharded_step``'s."""
        return Contribution(detail={**self.detail, "adamw_step_temporaries": self.optimizer_temporaries},
                            notes=list(self.notes), host=dict(self.host))

    def sharded_step(self, unsharded: Contribution, logits_grad: int) -> Contribution:
        """The step as FSDP runs it, from what the other parts add to an unsharded one: FSDP keeps their activations
        and KV cache and holds the rest itself (its shards, what it gathers and reduces, the loss' backward)."""
        instants = self.instants(unsharded.at("forward", "activations"), unsharded.at("backward", "activations"),
                                 logits_grad)
        for instant in INSTANTS:
            if "kv_cache" in unsharded.instants.get(instant, {}):
                instants[instant]["kv_cache"] = unsharded.at(instant, "kv_cache")
        return Contribution(instants, unsharded.detail, unsharded.notes, unsharded.host)


@dataclass
class _Shards:
    """Each parameter as FSDP shards it: what the rank keeps, gathers and reduces."""

    static: dict[str, int] = field(default_factory=lambda: {
        "parameters_trainable": 0, "parameters_frozen": 0, "parameters_quantized": 0, "optimizer_state": 0})
    gradients: int = 0
    trainable: list[int] = field(default_factory=list)  # trainable shards' elements, for the optimizer
    unsharded: dict[int, int] = field(default_factory=dict)  # id -> gathered bytes
    grads_unsharded: dict[int, int] = field(default_factory=dict)  # id -> its unsharded gradient and RS input, bytes
    sizes: list[int] = field(default_factory=list)  # each parameter's shard on the device, in load order
    reduced: dict[int, int] = field(default_factory=dict)  # id -> what its reduce-scatter takes in, bytes
    flat_frozen: int = 0  # under FSDP1's flat parameters, the frozen weights' share of the gradients (sharded)

    def add_quantized(self, prm: torch.Tensor, world: int, double_quant: bool, flat: bool) -> None:
        # bitsandbytes packs two 4-bit values per byte into the frozen weights' dtype (the quant storage)
        size = prm.element_size()
        rows = (prm.numel() + 1) // (2 * size)
        packed_shard = math.ceil(rows / world) * size
        state = nf4_bytes(tuple(prm.shape), double_quant) - (prm.numel() + 1) // 2
        self.static["parameters_quantized"] += packed_shard + state  # the quantization state is not sharded
        self.unsharded[id(prm)] = packed_shard * world
        self.sizes.append(packed_shard + state)
        if flat:  # the packed storage is part of the flat parameter, and of its gradient
            self.reduced[id(prm)] = packed_shard * world
            self.grads_unsharded[id(prm)] = packed_shard * world
            self.gradients += packed_shard
            self.flat_frozen += packed_shard

    def add(self, prm: torch.Tensor, world: int, gathered_dtype: torch.dtype | None, flat: bool) -> None:
        reduce_size = 4 if gathered_dtype is not None else None  # its policy reduces in fp32
        numel = _shard_numel(tuple(prm.shape), world)
        size = prm.element_size()
        gathered = (torch.empty((), dtype=gathered_dtype).element_size() if gathered_dtype is not None
                    and prm.is_floating_point() else size)
        self.unsharded[id(prm)] = numel * world * gathered
        self.sizes.append(numel * size)
        if prm.requires_grad or flat:
            self.reduced[id(prm)] = numel * world * (reduce_size or gathered)
            self.gradients += numel * size
            self.grads_unsharded[id(prm)] = numel * world * (gathered + (reduce_size or 0))
        if prm.requires_grad:
            self.static["parameters_trainable"] += numel * size
            self.trainable.append(numel)
        else:
            self.static["parameters_frozen"] += numel * size
            self.flat_frozen += numel * size if flat else 0


def fsdp(model, quantized: set[str], world: int, plan, method: Method, target: Target) -> FsdpStep:
    """FSDP2 as ``model.fsdp.shard`` applies it to ``model`` (the meta-device build, before any dtype change)."""
    names = dict(model.named_parameters())
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    # FSDP1's flat parameters: a unit (a decoder layer, or the root's remainder) with any trainable parameter
    # computes and reduces one gradient over all of its parameters.
    units = [list(layer.parameters()) for layer in layers] + [[p for p in names.values() if id(p) not in in_layers]]
    flat_units = [unit for unit in units if method.fsdp_flat and any(p.requires_grad for p in unit)]
    whole = {id(p) for unit in flat_units for p in unit}
    s = _Shards()
    for name, prm in names.items():
        if name in quantized:
            s.add_quantized(prm, world, method.double_quant, id(prm) in whole)
        else:
            s.add(prm, world, plan.fsdp_param_dtype, id(prm) in whole)
    buffers = [b.numel() * b.element_size() for b in model.buffers()]
    s.static["parameters_frozen"] += sum(buffers)  # not sharded
    trainable_size = next((p.element_size() for p in names.values() if p.requires_grad), 4)
    step_bytes = step_counter_bytes(target) * len(s.trainable) if method.optimizer == "adamw" else 0
    s.static["optimizer_state"] = optimizer_state_bytes(method.optimizer, s.trainable, trainable_size) + step_bytes
    largest = max(s.trainable, default=0) * trainable_size
    optimizer_temporaries = (0 if method.optimizer == "sgd" else s.gradients - s.flat_frozen if target == "cuda" and
                             method.optimizer == "adamw" else 2 * largest)

    per_layer = [sum(s.unsharded[id(p)] for p in layer.parameters()) for layer in layers]
    layer_grads = max((sum(s.grads_unsharded.get(id(p), 0) for p in layer.parameters()) for layer in layers),
                      default=0)
    embedding = model.get_input_embeddings().weight
    tied = embedding is getattr(model.get_output_embeddings(), "weight", None)
    root_grads = sum(b for i, b in s.grads_unsharded.items() if i not in in_layers and (tied or i != id(embedding)))
    detail = {"fsdp_root_gathered": sum(b for i, b in s.unsharded.items() if i not in in_layers),
              "fsdp_layer_gathered": max(per_layer, default=0), "fsdp_sharded_gradients": s.gradients}
    if method.fsdp_flat:
        detail["fsdp_flat_frozen_gradients"] = s.flat_frozen
    notes = _notes(method, plan, world, len(flat_units), s.flat_frozen)
    static, gradients, host = s.static, s.gradients, {}
    offloaded = method.offload != "none"
    if offloaded:
        host = {**static, "parameters_frozen": static["parameters_frozen"] - sum(buffers), "gradients": gradients}
        static = {k: 0 for k in static} | {"parameters_frozen": sum(buffers)}
        gradients, optimizer_temporaries = 0, 0
        notes.append("FSDP CPU offload: the shards, their gradients and the optimizer state are in pinned host "
                     "memory and the optimizer steps there; the GPU holds what is gathered")
    step = ShardedStep(
        shards=([] if offloaded else s.sizes) + buffers, root=detail["fsdp_root_gathered"], layers=per_layer,
        layer_grads=[sum(s.reduced.get(id(p), 0) for p in layer.parameters()) for layer in layers],
        root_grads=sum(b for i, b in s.reduced.items() if i not in in_layers), grad_shards=gradients,
        optimizer_state=static["optimizer_state"], optimizer_temporaries=optimizer_temporaries, world=world,
        reshard=method.reshard_after_forward, staged=offloaded)
    return FsdpStep(static, host, gradients, detail["fsdp_root_gathered"], max(per_layer, default=0), sum(per_layer),
                    root_grads, layer_grads, method.reshard_after_forward, optimizer_temporaries,
                    sum(s.reduced.values()), detail, notes, step)


def _notes(method: Method, plan, world: int, flat_units: int, flat_frozen: int) -> list[str]:
    notes = [f"FSDP2 over {world} rank(s): each rank's shards (dim 0, padded to a multiple of the ranks); the root "
             "unit (embeddings, final norm, LM head) stays gathered from forward to the end of backward (FSDP's "
             "default for the root); in backward a layer is gathered and the one before it prefetched"
             + ("" if method.reshard_after_forward else "; --no-reshard-after-forward: every layer stays gathered "
                "from its forward to its backward")]
    if method.fsdp_flat:
        notes.append(f"--fsdp-flat: FSDP1's flat parameters; {flat_units} unit(s) with a trainable parameter "
                     "hold gradients over all of theirs, "
                     f"{human_bytes(flat_frozen)} per rank for frozen weights (sharded; whole while no_sync holds "
                     "them)")
    gathered_dtype = plan.fsdp_param_dtype
    if gathered_dtype is not None:
        dtype = str(gathered_dtype).removeprefix("torch.")
        notes.append(f"FSDP mixed precision: parameters gathered and computed in {dtype}, gradients reduced in fp32"
                     + (f", and the Trainer's {dtype} autocast beside it (accelerate's)" if plan.autocast else
                        ", no autocast (profkit's loop; through the Trainer, --engine trainer, accelerate also "
                        "autocasts, and its float32 ops, LayerNorm and softmax among them, return fp32)"))
    return notes
