"""Predicted memory by category for a training method, without running a step.

The model is built on the meta device (shapes and dtypes, no memory, no weights) exactly as the workload
builds it: the method's dtypes, peft's LoRA layers, transformers' choice of which Linear layers bitsandbytes
quantizes. From it:

- parameters are counted per tensor (tied weights once); NF4 storage is bitsandbytes' layout: two 4-bit
  values per byte, one absmax per 64-value block, stored as uint8 with double quantization (plus an fp32
  absmax per 256 of those, a 256-entry code and an offset) or fp32 without, and a 16-entry code per layer;
- optimizer state is AdamW's layout: two moment tensors like each trainable parameter, plus a ``step``
  scalar per tensor (a host tensor on CUDA, so not GPU memory); under ZeRO, DeepSpeed's flat fp32 master
  partition and the moments of that partition;
- activations come from one forward pass on the meta device under ``saved_tensors_hooks``: every tensor
  autograd saves for backward, once per storage, attributed to the decoder layer that saved it. Without
  gradient checkpointing that is what is held at the end of forward. With it, only what lies outside the
  checkpointed layers is saved, plus each layer's inputs; during backward one layer is recomputed at a time.
- ZeRO's buffers are DeepSpeed's defaults, or for the Trainer engine Hugging Face's "auto" sizes
  (``model.zero.zero_buffers``), and what ZeRO partitions across
  ``world_size`` ranks: stage 2 gradients and optimizer state, stage 3 parameters too. An unsharded method on
  several ranks is DDP: a whole replica per rank, plus DDP's gradient buckets.

Three things the meta device does not do as the target device would are set by ``predict.stand_ins``: the
attention kernel, CUDA's dropout and autocast. Under autocast, linear layers and attention see 16-bit
copies of their inputs and weights, and autocast's float32 ops (on CUDA norms, softmax, exp, pow, the losses)
return fp32. tests/test_autocast_stand_in.py holds the stand-in to PyTorch's own autocast and dropout kernels,
run without a GPU on fake CUDA tensors (``profkit.model.fake_cuda``); analyses/autocast_stand_in.py does so over
every architecture transformers knows.

Predictions are for three instants of a step: ``forward`` (its end), ``backward`` and ``optimizer``; for
generate(), the prompt's pass (``prefill``) and the last new token's (``decode``). The peak is allocated bytes
(``max_memory_allocated``). Reserved bytes (``max_memory_reserved``) add what the caching allocator reserves
beyond it when the step's allocations are replayed through its policy (``predict.step_replay``); where a step
cannot be replayed, the allocator's overhead measured on real training steps' snapshots, a range.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Callable

import pandas as pd
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache
from transformers.cache_utils import LinearAttentionCacheLayerMixin

from profkit.core.bundled import bundled
from profkit.core.categories import MEMORY_CATEGORIES
from profkit.core.methods import Method, UnsupportedError
from profkit.core.quiet import library_output
from profkit.core.units import human_bytes
from profkit.model.build import check_sequence, decoder_layers, meta_model, model_code_refusal, model_config
from profkit.model.loss import chunked_bytes, gradient_bytes, live_beside_logits, loss_of_logits
from profkit.model.storage import storage_bytes, storage_id
from profkit.model.zero import reduce_dtypes, zero3_linear, zero_buffers
from profkit.predict.stand_ins import Target, TargetDevice, contiguous_batches
from profkit.predict.step_replay import AllocatorReplay, ShardedStep, fixed_lengths, growing_lengths, replay_step

# The breakdown's categories, less the two only a measurement has.
CATEGORIES = tuple(c for c in MEMORY_CATEGORIES if c not in ("allocator_overhead", "unattributed"))
NF4_BLOCK = 64  # bitsandbytes' default 4-bit blocksize, which transformers' BitsAndBytesConfig keeps
NF4_NESTED_BLOCK = 256  # blocksize of double quantization's second level


class EstimateError(ValueError):
    """A method or model the estimator does not model; the message says which and why."""


@dataclass
class Estimate:
    method: str
    settings: dict  # batch_size, seq_len, world_size, device, model
    instants: dict[str, dict[str, int]]  # instant -> category -> bytes
    params: dict[str, int]  # trainable / frozen / quantized element counts
    detail: dict[str, int] = field(default_factory=dict)  # named parts behind the categories, bytes
    notes: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)  # offloaded to pinned host memory, by category, bytes
    # Steps of the given lengths replayed through the caching allocator's policy, run when reserved memory is first
    # asked for (whole steps on meta, several times the estimate's own forward); None where it is not replayed.
    replayer: Callable[..., AllocatorReplay | None] | None = field(default=None, repr=False, compare=False)
    _on_device: dict = field(default_factory=dict, repr=False, compare=False)  # capacity -> its replay

    @functools.cached_property
    def replay(self) -> AllocatorReplay | None:
        return self.replayer(fixed_lengths(self.settings["seq_len"])) if self.replayer is not None else None

    @functools.cached_property
    def growing_replay(self) -> AllocatorReplay | None:
        return self.replayer(growing_lengths(self.settings["seq_len"])) if self.replay is not None else None

    @property
    def peak_instant(self) -> str:
        return max(self.instants, key=lambda i: sum(self.instants[i].values()))

    @property
    def peak_bytes(self) -> int:
        return sum(self.instants[self.peak_instant].values())

    def at_peak(self) -> dict[str, int]:
        return dict(self.instants[self.peak_instant])

    def reserved(self) -> dict | None:
        """CUDA targets: what ``max_memory_reserved`` would show. Where the step was replayed through the caching
        allocator's policy (``predict.step_replay``), the allocated peak plus the reserve the replay found beyond
        its own allocated peak; elsewhere (ZeRO, generation, a step meta kernels cannot run) the allocated
        peak times the reserved/allocated ratios of real training steps (lowest, median, highest). None on CPU,
        which has no caching allocator."""
        if self.settings.get("device") != "cuda":
            return None
        if self.replay is not None:
            value = self.peak_bytes + self.replay.overhead
            return {"low_bytes": value, "bytes": value, "high_bytes": value, "basis": "replay"}
        ratios = reserved_ratios()
        return {"low_bytes": int(self.peak_bytes * min(ratios)), "bytes": int(self.peak_bytes * median(ratios)),
                "high_bytes": int(self.peak_bytes * max(ratios)), "basis": "ratio", "ratios": ratios}

    def reserved_if_lengths_grow(self) -> dict | None:
        """Reserved memory when each batch is padded to its longest sample and the lengths grow to the full one over
        the run (``step_replay.growing_lengths``): the other choice to the packed, fixed-length steps ``reserved``
        assumes. None where the step is not replayed."""
        if self.growing_replay is None:
            return None
        return {"bytes": self.peak_bytes + self.growing_replay.overhead,
                "lengths": list(growing_lengths(self.settings["seq_len"]))}

    def on_device(self, device_bytes: int) -> dict | None:
        """Whether the step fits a GPU of ``device_bytes``: the replay run again with the room the allocator has
        there (the device less what lies outside it, ``outside_allocator``), where it releases its cache when full
        and fails when that is not enough. None where the step is not replayed."""
        if self.replay is None:
            return None
        outside = self.device_used()["outside_allocator"]
        capacity = device_bytes - sum(outside.values())
        replay = self._on_device.get(capacity)
        if replay is None:
            replay = self._on_device[capacity] = self.replayer(fixed_lengths(self.settings["seq_len"]), capacity)
        if replay is None:
            return None
        fits = replay.failed_request is None and self.peak_bytes <= capacity
        return {"device_bytes": device_bytes, "capacity_bytes": capacity, "fits": fits,
                "reserved_bytes": min(self.peak_bytes + replay.overhead, capacity),
                "failed_request_bytes": replay.failed_request}

    def device_used(self) -> dict | None:
        """CUDA targets: what nvidia-smi would show for this process: reserved memory plus what lies outside
        PyTorch's allocator, the CUDA context and, on more than one rank, NCCL's buffers, as sourced in
        ``profkit/data/allocator/outside_allocator.csv``."""
        reserved = self.reserved()
        if reserved is None:
            return None
        ranks = self.settings.get("world_size", 1)
        outside = outside_allocator()
        rows = outside[(outside.min_ranks <= ranks) & (outside.max_ranks.isna() | (outside.max_ranks >= ranks))]
        return {key: reserved[key] + int(rows[key].sum()) for key in ("low_bytes", "bytes", "high_bytes")} | \
            {"outside_allocator": {r.item: int(r.bytes) for r in rows.itertuples()}}

    def to_json(self) -> dict:
        return {"method": self.method, "settings": self.settings, "instants": self.instants,
                "peak_instant": self.peak_instant, "peak_bytes": self.peak_bytes, "reserved": self.reserved(),
                "device_used": self.device_used(), "allocator_replay": self.replay and self.replay.to_json(),
                "reserved_if_lengths_grow": self.reserved_if_lengths_grow(),
                "params": self.params, "detail": self.detail, "notes": self.notes, "host": self.host,
                "host_bytes": sum(self.host.values())}


RESERVED_BASIS = {
    "replay": "reserved: the allocated peak plus what the CUDA caching allocator's policy reserves beyond it when "
              "the step's allocations are replayed through it (profkit/predict/allocator.py)",
    "ratio": "reserved: the predicted allocated peak x the CUDA caching allocator's peak reserved / peak allocated "
             "on real training steps ({ratios}; analyses/allocator_overhead.py)"}
GROWING_BASIS = ("reserved, lengths grow: each batch padded to its longest sample and the lengths growing to the full "
                 "one over the run; steps of {lengths} tokens replayed, the blocks of the shorter ones staying cached")
DEVICE_BASIS = ("nvidia-smi: reserved plus the CUDA context (about 0.4 GB) and, on several ranks, NCCL's buffers "
                "(0.5-0.7 GB), outside PyTorch's counters (profkit/data/allocator/outside_allocator.csv)")


@functools.cache  # read once: every estimate's table and JSON ask for it
def reserved_ratios() -> list[float]:
    """Peak reserved over peak allocated, measured on real allocator snapshots (``profkit/data/allocator``)."""
    return sorted(float(r) for r in pd.read_csv(bundled("allocator/reserved_over_allocated.csv")).ratio)


@functools.cache
def outside_allocator() -> pd.DataFrame:
    """GPU memory a process holds outside PyTorch's caching allocator, with sources."""
    return pd.read_csv(bundled("allocator/outside_allocator.csv"))


BNB_8BIT_BLOCK = 256  # bitsandbytes' 8-bit optimizers: one fp32 absmax per 256 values of each state
BNB_MIN_8BIT_SIZE = 4096  # smaller tensors keep 32-bit state
BNB_QMAPS = 2 * 256 * 4  # the two 256-entry quantization maps, shared by every tensor


def optimizer_state_bytes(optimizer: str, numels: list[int], element_size: int) -> int:
    """State the optimizer holds for tensors of these sizes (AdamW's moments are in the parameters' dtype)."""
    if optimizer == "sgd":
        return 0  # plain SGD, no momentum
    if optimizer == "adamw":
        return sum(2 * n * element_size for n in numels)
    total = 0
    for n in numels:
        if n < BNB_MIN_8BIT_SIZE:
            total += 2 * n * 4
        else:
            total += 2 * n + 2 * math.ceil(n / BNB_8BIT_BLOCK) * 4
    return total + (BNB_QMAPS if any(n >= BNB_MIN_8BIT_SIZE for n in numels) else 0)


def kv_cache_bytes(config, batch_size: int, tokens: int, element_size: int) -> int:
    """What generate()'s KV cache holds for ``tokens`` positions: a key and a value per decoder layer, each
    batch x key-value heads x tokens x head size. (After N new tokens it holds prompt + N - 1: the last token
    is returned, not fed back.)"""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return config.num_hidden_layers * 2 * batch_size * kv_heads * tokens * head_dim * element_size


def nf4_bytes(shape: tuple[int, ...], double_quant: bool, cpu_packed: bool = False) -> int:
    """Bytes bitsandbytes stores for one NF4 weight with its quantization state.

    ``cpu_packed``: the layout bitsandbytes converts a layer to at its first inference pass on a CPU with
    AVX512-BF16 (``_convert_weight_packed_for_cpu``): the same 4-bit values repacked, the absmax
    dequantized to one bf16 per block, the nested state dropped (its offset scalar stays)."""
    numel = math.prod(shape)
    packed = (numel + 1) // 2
    blocks = math.ceil(numel / NF4_BLOCK)
    code = 16 * 4
    if cpu_packed:
        return packed + blocks * 2 + (4 if double_quant else 0) + code
    if not double_quant:
        return packed + blocks * 4 + code
    nested_blocks = math.ceil(blocks / NF4_NESTED_BLOCK)
    return packed + blocks + 4 + nested_blocks * 4 + 256 * 4 + code


# --------------------------------------------------------------------------- activations

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


def saved_for_backward(model, batch_size: int, seq_len: int, target: Target, autocast: torch.dtype | None,
                       gathered: dict[int, int] | None = None, loss: str = "fp32",
                       builds_cache: bool = False) -> SavedForBackward:
    """One training forward on the meta device, the loss computed as ``loss`` computes it (profkit.model.loss);
    every saved tensor counted once per storage. ``builds_cache``: the forward builds a KV cache as transformers 4
    did (``_HandedOverCache``), and what it holds beyond the layers' inputs is counted apart.

    ``gathered``: ids of parameters that ZeRO-3 gathers into a fresh buffer for each use and releases
    after, with that buffer's bytes (a 4-bit weight's packed storage, not its meta stand-in's); when autograd saves
    one of those, the saved tensor is that buffer, so it counts like an activation.
    """
    gathered = gathered or {}
    copies = {storage_id(t): gathered[id(t)] for t in model.parameters() if id(t) in gathered}
    static = {storage_id(t) for t in [*model.parameters(), *model.buffers()] if id(t) not in gathered}
    seen: dict[tuple[str, int], str] = {}  # each counted storage, with the region that saved it
    where = {"region": "before"}
    by_region: dict[str, int] = {"before": 0, "after": 0}
    layer_order: list[str] = []
    inputs: dict[tuple[str, int], int] = {}

    # A meta storage's key is its object's address: a storage freed while the forward runs (a branch whose graph
    # is dropped) could hand its address to a later one, which would then be taken as already counted. Holding
    # every counted tensor keeps each address taken (on meta, holding costs nothing).
    held: list[torch.Tensor] = []
    returned_logits = logits_in_fp32 = 0  # the 16-bit logits the model returns, and an fp32 copy's bytes

    def count(t: torch.Tensor, region: str) -> None:
        storage = t.untyped_storage()
        key = storage_id(t)
        if key in static or key in seen:
            return
        seen[key] = region
        held.append(t)
        by_region[region] = by_region.get(region, 0) + copies.get(key, storage.nbytes())

    def pack(t: torch.Tensor) -> torch.Tensor:
        count(t, where["region"])
        return t

    def enter(module, args, kwargs):
        name = f"layer{len(layer_order)}"
        layer_order.append(name)
        where["region"] = name
        for value in [*args, *kwargs.values()]:
            for t in (value if isinstance(value, (tuple, list)) else (value,)):
                if isinstance(t, torch.Tensor) and storage_id(t) not in static:
                    inputs.setdefault(storage_id(t), t.untyped_storage().nbytes())
                    held.append(t)  # its address stays taken, as the counted tensors' do

    def leave(module, args, kwargs, output):
        where["region"] = "after"

    at_loss: dict[tuple[str, int], int] = {}

    head_input: list[int] = []

    def lm_head_input(module, args, output):
        at_loss.setdefault(storage_id(args[0]), args[0].untyped_storage().nbytes())
        head_input.append(args[0].numel() * args[0].element_size())

    layers = decoder_layers(model)
    if not layers:
        raise EstimateError(f"{type(model).__name__}: no decoder layers that transformers can checkpoint were "
                            "found, so activations cannot be attributed per layer")
    handles = [h for m in layers for h in (m.register_forward_pre_hook(enter, with_kwargs=True),
                                           m.register_forward_hook(leave, with_kwargs=True))]
    handles.append(model.get_output_embeddings().register_forward_hook(lm_head_input))
    batch = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
    count(batch, "before")  # the batch is held through the step (input_ids and labels are one tensor)
    cache = _HandedOverCache(model.config) if builds_cache else None
    if cache is not None and any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in cache.layers):
        architecture = type(model.config).__name__.removesuffix("Config")
        raise EstimateError(f"--keeps-kv-cache: {architecture} caches its state-space layers' states beside "
                            "attention's keys and values; what such a cache holds in training is not modelled")
    caching = {"use_cache": True, "past_key_values": cache} if cache is not None else {}
    try:
        with contiguous_batches(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                TargetDevice(target, autocast):
            if loss == "chunked":  # the decoder only: the loss' chunks are checkpointed, so counted below
                hidden = model.get_decoder()(input_ids=batch, **caching).last_hidden_state
            elif loss == "fp32":  # as the model computes it
                logits = model(input_ids=batch, labels=batch, **caching).logits
            else:
                logits = model(input_ids=batch, **caching).logits
                loss_of_logits(logits, batch, loss)
        if loss == "chunked":
            head = model.get_output_embeddings()
            held_by_loss = chunked_bytes(tuple(hidden.shape), hidden.dtype, head.out_features,
                                         autocast or head.weight.dtype)
            by_region["after"] += held_by_loss["saved"]
            at_loss[("a chunk's logits", 0)] = held_by_loss["at_loss"]
            # A trainable LM head's weight gradient builds up chunk by chunk through the loss' backward: the sum so
            # far beside the latest chunk's.
            head_grad = head.weight.numel() * head.weight.element_size() if head.weight.requires_grad else 0
            loss_backward = held_by_loss["backward"] + 2 * head_grad
            del hidden
        else:
            # The logits the loss reads: the LM head's output, or what the model makes of it (Gemma 2 soft-caps
            # them).
            at_loss.setdefault(storage_id(logits), logits.untyped_storage().nbytes())
            if logits.dtype in (torch.float16, torch.bfloat16) and storage_id(logits) not in seen:
                returned_logits, logits_in_fp32 = logits.untyped_storage().nbytes(), logits.numel() * 4
            for name, size in live_beside_logits(tuple(logits.shape), logits.dtype, loss).items():
                at_loss[(name, 0)] = size
            loss_backward = gradient_bytes(tuple(logits.shape), logits.dtype, loss, target if autocast else None)
            if loss == "sum":
                # The summed logits' gradient is the logits' size once, not twice as cross-entropy's: the peak is
                # then the LM head's backward, which makes the head's weight gradient (trainable) and its input's
                # beside that gradient.
                head = model.get_output_embeddings().weight
                loss_backward += sum(head_input) + (head.numel() * head.element_size() if head.requires_grad else 0)
            del logits
    finally:
        for h in handles:
            h.remove()
    live_at_loss = sum(b for key, b in at_loss.items() if key not in seen)
    # Under checkpointing a layer's saved tensors are dropped when it returns; the cache keeps what it was handed,
    # unless that is a layer input or saved outside the layers (counted already).
    cached = {storage_id(t): t.untyped_storage().nbytes() for t in (cache.handed_over if cache is not None else [])}
    cache_held = sum(b for key, b in cached.items()
                     if key not in static and key not in inputs and seen.get(key) not in ("before", "after"))
    return SavedForBackward(by_region["before"], [by_region.get(n, 0) for n in layer_order],
                            sum(inputs.values()), by_region["after"], live_at_loss, loss_backward, cache_held,
                            returned_logits, logits_in_fp32)


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


def _zero3_storage_bytes(p: torch.Tensor, quantized: bool) -> int:
    """The bytes of the storage DeepSpeed partitions for one parameter: a 4-bit weight's packed values (bitsandbytes'
    uint8 storage, two values a byte), anything else whole."""
    return (p.numel() + 1) // 2 if quantized else p.numel() * p.element_size()


def _parameters(model, quantized: set[str], double_quant: bool, cpu_packed: bool = False) -> tuple[dict, dict, list]:
    """Element counts and bytes of the parameters, once per tensor (tied embeddings are one tensor), NF4 ones
    as bitsandbytes stores them; buffers count as frozen. Also the trainable tensors."""
    params = {"trainable": 0, "frozen": 0, "quantized": 0}
    parts = {"parameters_trainable": 0, "parameters_frozen": 0, "parameters_quantized": 0}
    trainable: list[torch.Tensor] = []
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            continue
        seen.add(id(p))
        if name in quantized:
            params["quantized"] += p.numel()
            parts["parameters_quantized"] += nf4_bytes(tuple(p.shape), double_quant, cpu_packed)
        elif p.requires_grad:
            params["trainable"] += p.numel()
            parts["parameters_trainable"] += p.numel() * p.element_size()
            trainable.append(p)
        else:
            params["frozen"] += p.numel()
            parts["parameters_frozen"] += p.numel() * p.element_size()
    parts["parameters_frozen"] += sum(b.numel() * b.element_size() for b in model.buffers())
    return params, parts, trainable


def _loss_note(loss: str, logits: int, itemsize: int, autocast: bool = False) -> str:
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


def _assumptions(config, plan, batch_size: int, seq_len: int, checkpointing: bool, activations: int,
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
        notes.append(_loss_note(loss, batch_size * seq_len * vocab,
                                (plan.autocast or plan.fsdp_param_dtype or plan.load_dtype).itemsize,
                                plan.autocast is not None))
    return notes


# --------------------------------------------------------------------------- FSDP2

def _shard_numel(shape: tuple[int, ...], world: int) -> int:
    """Elements each rank holds of a parameter FSDP shards: dim 0 in ``world`` chunks, each padded to the first's
    size (``FSDPParam``: ``torch.chunk``, then a padded copy), so rank 0's is every rank's."""
    if not shape:
        return 1
    return math.ceil(shape[0] / world) * math.prod(shape[1:])


@dataclass
class _Fsdp:
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
        """``logits_grad``: the loss' backward, two gradients of the fp32 logits' size."""
        """Forward at the loss; backward at the larger of two moments: its start (the loss' gradients beside the LM
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


def _fsdp(model, quantized: set[str], world: int, plan, method: Method, target: Target) -> _Fsdp:
    """FSDP2 as ``model.fsdp.shard`` applies it to ``model`` (the meta-device build, before any dtype change)."""
    gathered_dtype = plan.fsdp_param_dtype
    reduce_size = 4 if gathered_dtype is not None else None  # its policy reduces in fp32
    names = dict(model.named_parameters())
    static = {"parameters_trainable": 0, "parameters_frozen": 0, "parameters_quantized": 0, "optimizer_state": 0}
    gradients = 0
    shards: list[int] = []  # trainable shards' elements, for the optimizer
    unsharded: dict[int, int] = {}  # id -> gathered bytes
    grads_unsharded: dict[int, int] = {}  # id -> its unsharded gradient and reduce-scatter input, bytes
    shard_sizes: list[int] = []  # each parameter's shard on the device, then the buffers, in load order
    reduced: dict[int, int] = {}  # id -> what its reduce-scatter takes in, bytes
    layers = decoder_layers(model)
    in_layers = {id(p) for layer in layers for p in layer.parameters()}
    # FSDP1's flat parameters: a unit (a decoder layer, or the root's remainder) with any trainable parameter
    # computes and reduces one gradient over all of its parameters.
    units = [list(layer.parameters()) for layer in layers] + [[p for p in names.values() if id(p) not in in_layers]]
    flat_units = [unit for unit in units if method.fsdp_flat and any(p.requires_grad for p in unit)]
    whole = {id(p) for unit in flat_units for p in unit}
    flat_frozen = 0  # the frozen weights' share of those gradients (sharded)
    for name, prm in names.items():
        if name in quantized:
            # bitsandbytes packs two 4-bit values per byte into the frozen weights' dtype (the quant storage)
            size = prm.element_size()
            rows = (prm.numel() + 1) // (2 * size)
            packed_shard = math.ceil(rows / world) * size
            state = nf4_bytes(tuple(prm.shape), method.double_quant) - (prm.numel() + 1) // 2
            static["parameters_quantized"] += packed_shard + state  # the quantization state is not sharded
            unsharded[id(prm)] = packed_shard * world
            shard_sizes.append(packed_shard + state)
            if id(prm) in whole:  # the packed storage is part of the flat parameter, and of its gradient
                reduced[id(prm)] = packed_shard * world
                grads_unsharded[id(prm)] = packed_shard * world
                gradients += packed_shard
                flat_frozen += packed_shard
            continue
        numel = _shard_numel(tuple(prm.shape), world)
        size = prm.element_size()
        gathered = (torch.empty((), dtype=gathered_dtype).element_size() if gathered_dtype is not None
                    and prm.is_floating_point() else size)
        unsharded[id(prm)] = numel * world * gathered
        shard_sizes.append(numel * size)
        if prm.requires_grad or id(prm) in whole:
            reduced[id(prm)] = numel * world * (reduce_size or gathered)
            gradients += numel * size
            grads_unsharded[id(prm)] = numel * world * (gathered + (reduce_size or 0))
        if prm.requires_grad:
            static["parameters_trainable"] += numel * size
            shards.append(numel)
        else:
            static["parameters_frozen"] += numel * size
            flat_frozen += numel * size if id(prm) in whole else 0
    static["parameters_frozen"] += sum(b.numel() * b.element_size() for b in model.buffers())  # not sharded
    trainable_size = next((p.element_size() for p in names.values() if p.requires_grad), 4)
    step_bytes = (4 if target == "cpu" else 0) * len(shards) if method.optimizer == "adamw" else 0
    static["optimizer_state"] = optimizer_state_bytes(method.optimizer, shards, trainable_size) + step_bytes
    largest = max(shards, default=0) * trainable_size
    optimizer_temporaries = (0 if method.optimizer == "sgd" else gradients - flat_frozen if target == "cuda" and
                             method.optimizer == "adamw" else 2 * largest)

    per_layer = [sum(unsharded[id(p)] for p in layer.parameters()) for layer in layers]
    layer_grads = max((sum(grads_unsharded.get(id(p), 0) for p in layer.parameters()) for layer in layers), default=0)
    embedding = model.get_input_embeddings().weight
    tied = embedding is getattr(model.get_output_embeddings(), "weight", None)
    root_grads = sum(b for i, b in grads_unsharded.items() if i not in in_layers and (tied or i != id(embedding)))
    detail = {"fsdp_root_gathered": sum(b for i, b in unsharded.items() if i not in in_layers),
              "fsdp_layer_gathered": max(per_layer, default=0), "fsdp_sharded_gradients": gradients}
    if method.fsdp_flat:
        detail["fsdp_flat_frozen_gradients"] = flat_frozen
    notes = [f"FSDP2 over {world} rank(s): each rank's shards (dim 0, padded to a multiple of the ranks); the root "
             "unit (embeddings, final norm, LM head) stays gathered from forward to the end of backward (FSDP's "
             "default for the root); in backward a layer is gathered and the one before it prefetched"
             + ("" if method.reshard_after_forward else "; --no-reshard-after-forward: every layer stays gathered "
                "from its forward to its backward")]
    if method.fsdp_flat:
        notes.append(f"--fsdp-flat: FSDP1's flat parameters; {len(flat_units)} unit(s) with a trainable parameter "
                     "hold gradients over all of theirs, "
                     f"{human_bytes(flat_frozen)} per rank for frozen weights (sharded; whole while no_sync holds "
                     "them)")
    if gathered_dtype is not None:
        dtype = str(gathered_dtype).removeprefix("torch.")
        notes.append(f"FSDP mixed precision: parameters gathered and computed in {dtype}, gradients reduced in fp32"
                     + (f", and the Trainer's {dtype} autocast beside it (accelerate's)" if plan.autocast else
                        ", no autocast (profkit's loop; through the Trainer, --engine trainer, accelerate also "
                        "autocasts, and its float32 ops, LayerNorm and softmax among them, return fp32)"))
    host: dict[str, int] = {}
    if method.offload != "none":
        buffers = sum(b.numel() * b.element_size() for b in model.buffers())
        host = {**static, "parameters_frozen": static["parameters_frozen"] - buffers, "gradients": gradients}
        static = {k: 0 for k in static} | {"parameters_frozen": buffers}
        gradients, optimizer_temporaries = 0, 0
        notes.append("FSDP CPU offload: the shards, their gradients and the optimizer state are in pinned host "
                     "memory and the optimizer steps there; the GPU holds what is gathered")
    offloaded = method.offload != "none"
    step = ShardedStep(
        shards=([] if offloaded else shard_sizes) + [b.numel() * b.element_size() for b in model.buffers()],
        root=detail["fsdp_root_gathered"], layers=per_layer,
        layer_grads=[sum(reduced.get(id(p), 0) for p in layer.parameters()) for layer in layers],
        root_grads=sum(b for i, b in reduced.items() if i not in in_layers), grad_shards=gradients,
        optimizer_state=static["optimizer_state"], optimizer_temporaries=optimizer_temporaries, world=world,
        reshard=method.reshard_after_forward, staged=offloaded)
    return _Fsdp(static, host, gradients, detail["fsdp_root_gathered"], max(per_layer, default=0), sum(per_layer),
                 root_grads, layer_grads, method.reshard_after_forward, optimizer_temporaries, sum(reduced.values()),
                 detail, notes, step)


# --------------------------------------------------------------------------- the estimate

def estimate(method: Method, config, batch_size: int, seq_len: int, world_size: int = 1,
             target: Target = "cuda", model_name: str = "", engine: str = "loop", new_tokens: int = 1) -> Estimate:
    """Training: one step at ``batch_size`` x ``seq_len``. Inference: generate() of ``new_tokens`` after a prompt
    of ``batch_size`` x ``seq_len`` tokens. ``engine``: ``loop`` (profkit's own), ``trainer`` (transformers'
    Trainer through accelerate) or ``session`` (someone else's loop: as profkit's, without the DeepSpeed config
    profkit's loop writes)."""
    # peft, bitsandbytes and DeepSpeed announce themselves at import and warn about their own deprecations.
    with library_output():
        try:
            if method.kind == "infer":
                return _estimate_inference(method, config, batch_size, seq_len, new_tokens, world_size, target,
                                           model_name)
            return _estimate(method, config, batch_size, seq_len, world_size, target, model_name, engine)
        except UnsupportedError as exc:  # the model or the method's settings, said before anything runs
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: {exc}") from None
        except (RuntimeError, NotImplementedError) as exc:  # torch's meta kernels refuse what they cannot model
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: the meta-device forward "
                                f"that counts what autograd saves failed ({type(exc).__name__}: {first})") from None
        except Exception as exc:  # the model's own code refusing this config (a default it leaves unset)
            refusal = model_code_refusal(exc)
            if refusal is None:
                raise
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: {refusal}") from None


def _estimate(method: Method, config, batch_size: int, seq_len: int, world_size: int, target: Target,
              model_name: str, engine: str) -> Estimate:
    if method.zero_stage and method.optimizer != "adamw" and engine == "trainer":
        raise EstimateError(f"{method.label}: the Trainer engine with ZeRO and {method.optimizer} is not modelled")
    if world_size < 1:
        raise EstimateError(f"world size must be at least 1, got {world_size}")
    model, quantized, plan = meta_model(method, config, target, torch.bfloat16 if target == "cuda" else None,
                                          engine)
    check_sequence(model, seq_len)
    notes: list[str] = list(plan.notes)
    if target == "cuda" and method.precision == "auto" and not method.fsdp:
        notes.append("CUDA target: bf16 autocast and bf16 frozen weights (a GPU with bf16 support); flash "
                     "attention where PyTorch would pick it")

    params, parts, trainable = _parameters(model, quantized, method.double_quant if quantized else False)
    if not trainable:
        raise EstimateError(f"{method.name}: no trainable parameters in this model")

    trainable_bytes = sum(p.numel() * p.element_size() for p in trainable)
    largest = max(p.numel() * p.element_size() for p in trainable)
    n_trainable = params["trainable"]
    step_bytes = 4 if target == "cpu" else 0  # AdamW's step counter lives on the host for CUDA parameters
    detail: dict[str, int] = {}
    persistent_grads = 0
    backward_temporaries = 0
    forward_temporaries = 0  # ZeRO-3: the parameters gathered in flight, in forward as in backward
    gathered: dict[int, int] = {}  # ZeRO-3 on several ranks: id -> the fresh buffer each use gathers it into
    partitioned_bytes: dict[str, int] = {}  # ZeRO-3: each owner's partitions on this rank
    zero3_linear_saves = False
    if method.zero_stage:
        buffers = zero_buffers(method.zero_stage, model, engine)
        part = math.ceil(n_trainable / world_size)
        trainable_elem = trainable[0].element_size()
        # One reduce buffer per dtype DeepSpeed communicates in (profkit's loop keeps autocast inside the engine
        # through its torch_autocast section, which reduces Linear layers' gradients in the autocast dtype;
        # another loop's config is not known to have it).
        comm = reduce_dtypes(model, trainable, plan.autocast if engine == "loop" else None)
        bucket = buffers["reduce_bucket_size"] * (sum(d.itemsize for d in comm) if method.zero_stage == 3
                                                  else trainable_elem * len(comm))
        detail["zero_fp32_master_partition"] = part * 4
        # The fp32 master partition and the optimizer's state of that one flat tensor.
        optimizer_state = part * 4 + optimizer_state_bytes(method.optimizer, [part], 4) + step_bytes
        grads_partition = part * 4
        # DeepSpeed sums each micro-batch's reduced gradients into a partition in the engine's model dtype (the
        # trainable weights' here); on the host under offload.
        accumulated = 0 if method.offload != "none" else part * trainable_elem
        if method.zero_stage == 3:
            # Stage 3 allocates that partition once, at initialisation, and keeps it: alive at every instant
            # (measured: a CPU recording of micro's full_zero3 holds it through forward and backward).
            persistent_grads = bucket + accumulated
            detail["zero3_reduce_bucket"] = bucket
            detail["zero3_gradient_partition"] = accumulated
            # Stage 3 partitions every parameter whose storage holds more elements than DeepSpeed's persistence
            # threshold (smaller ones stay whole on every rank) and, on more than one rank, gathers it into a fresh
            # buffer for each use: what ZeRO-3's linear saves of such a weight is that copy, held until backward.
            # A 4-bit weight is partitioned like any other by its packed storage (one byte per two values; its
            # quantization state is no parameter and stays whole), and bitsandbytes' matmul saves the gathered
            # packed weight for backward. On one rank the partition is the whole weight, and nothing is copied.
            threshold = buffers["param_persistence_threshold"]
            names = dict(model.named_parameters())
            stored = {n: _zero3_storage_bytes(p, n in quantized) for n, p in names.items()}
            partitioned = {n for n, p in names.items()
                           if stored[n] // (1 if n in quantized else p.element_size()) > threshold}
            if world_size > 1:
                gathered = {id(names[n]): stored[n] for n in partitioned}
            zero3_linear_saves = bool(buffers["memory_efficient_linear"])
            shard_bytes = {n: stored[n] - math.ceil(stored[n] / world_size) for n in partitioned}
            for key, owner in (("parameters_trainable", lambda n: names[n].requires_grad and n not in quantized),
                               ("parameters_frozen", lambda n: not names[n].requires_grad and n not in quantized),
                               ("parameters_quantized", lambda n: n in quantized)):
                parts[key] -= sum(b for n, b in shard_bytes.items() if owner(n))
                partitioned_bytes[key] = sum(math.ceil(stored[n] / world_size) for n in partitioned if owner(n))
            if world_size > 1:
                by_id = {id(p): stored[n] for n, p in names.items()}
                per_layer = max((sum(by_id[id(p)] for p in m.parameters()) for m in decoder_layers(model)), default=0)
                # One layer gathered whole, plus DeepSpeed's prefetch bucket (elements, bf16).
                in_flight = min(per_layer + buffers["prefetch_bucket_size"] * 2, sum(parts.values()) * world_size)
                detail["zero3_gathered_parameters"] = in_flight
                backward_temporaries += in_flight
                forward_temporaries = in_flight
        else:
            detail["zero2_reduce_bucket"] = bucket
            backward_temporaries += bucket
        optimizer_grads = (bucket if method.zero_stage == 3 else 0) + grads_partition
        # DeepSpeed steps AdamW on one flat partition: the foreach path on CUDA makes one temporary of its
        # size, the single-tensor path on CPU two.
        optimizer_temporaries = part * 4 * (1 if target == "cuda" else 2)
    else:
        optimizer_state = optimizer_state_bytes(method.optimizer, [p.numel() for p in trainable],
                                                trainable[0].element_size()) + \
            (step_bytes * len(trainable) if method.optimizer == "adamw" else 0)
        optimizer_grads = trainable_bytes
        accumulated = trainable_bytes
        optimizer_temporaries = (0 if method.optimizer == "sgd" else
                                 trainable_bytes if target == "cuda" and method.optimizer == "adamw" else 2 * largest)
    host: dict[str, int] = {}
    if method.offload != "none" and method.zero_stage:
        notes.append(f"ZeRO-Offload ({method.offload}): the optimizer state, the fp32 master partition and the fp32 "
                     "gradient partition the host optimizer steps on are in pinned host memory; the GPU keeps the "
                     "reduce bucket" + ("; the parameters' partitions are on the host too, gathered to the GPU "
                                       "for use" if method.offload == "optimizer+params" else ""))
        host.update(optimizer_state=optimizer_state, gradients=grads_partition)
        optimizer_grads -= grads_partition
        optimizer_state, optimizer_temporaries = 0, 0
        if method.offload == "optimizer+params":
            # The partitions live on the host; what stays whole on every rank (below the persistence threshold)
            # and the 4-bit weights' quantization state stay on the device.
            for key, moved in partitioned_bytes.items():
                host[key] = moved
                parts[key] -= moved
    if method.optimizer == "paged-adamw-8bit" and target == "cuda":
        notes.append("paged 8-bit AdamW: its state is in CUDA unified memory (cudaMallocManaged), outside PyTorch's "
                     "allocator: max_memory_allocated does not count it, nvidia-smi does until the driver pages it out")
    detail["adamw_step_temporaries"] = optimizer_temporaries

    four_bit = frozenset(id(p) for n, p in model.named_parameters() if n in quantized)
    fsdp = _fsdp(model, quantized, world_size, plan, method, target) if method.fsdp else None
    if plan.fsdp_param_dtype is not None:
        # FSDP's mixed precision: each unit computes with its gathered parameters in the half dtype (no autocast)
        for prm in model.parameters():
            if prm.is_floating_point() and id(prm) not in four_bit:
                prm.data = prm.data.to(plan.fsdp_param_dtype)
    with zero3_linear(zero3_linear_saves, unless=four_bit):
        saved = saved_for_backward(model, batch_size, seq_len, target, plan.autocast, gathered, method.loss,
                                   builds_cache=method.keeps_kv_cache)
    # What a 4-bit layer keeps on its autograd context (--bnb-keeps-inputs) outlives backward while the loop holds
    # the step's logits (--keeps-previous-logits): its inputs, counted once per storage.
    kept_inputs = [m.kept_input for m in model.modules() if getattr(m, "kept_input", None) is not None]
    checkpointing = method.gradient_checkpointing
    forward_activations = saved.end_of_forward(checkpointing)
    if engine == "trainer" and plan.autocast is not None and saved.logits_in_fp32:
        # accelerate's mixed precision wraps the forward in convert_outputs_to_fp32: its outputs leave it in fp32
        converted = saved.outputs_converted(checkpointing)
        detail["logits_converted_to_fp32"] = saved.logits_in_fp32
        notes.append(f"the Trainer's mixed precision (accelerate) returns the forward's outputs in fp32: an fp32 copy "
                     f"of the logits ({human_bytes(saved.logits_in_fp32)}) beside the 16-bit ones when the forward "
                     "returns, freed before backward")
        forward_activations = max(forward_activations, converted)
    backward_activations = saved.during_backward(checkpointing)
    detail.update(saved_before_layers=saved.before_layers, saved_per_layer_max=max(saved.layers),
                  saved_layers_total=sum(saved.layers), saved_after_layers=saved.after_layers,
                  layer_inputs=saved.layer_inputs, live_at_loss=saved.at_loss)
    # The loss' backward: nll_loss' gradient and log_softmax's, live together (measured: a CPU recording of micro
    # LoRA holds both at its backward peak).
    logits_grad = saved.loss_backward
    detail["loss_backward"] = logits_grad
    notes += _assumptions(config, plan, batch_size, seq_len, checkpointing, forward_activations, method.loss)

    # What the forward computes in: the autocast dtype, or the weights' own (the LM head's).
    compute_size = (plan.autocast or model.get_output_embeddings().weight.dtype).itemsize
    if method.keeps_previous_logits:
        # The loop's name for the logits keeps them bound: through this step's backward, and until the next
        # forward returns, so at its end beside the new step's own.
        head = model.get_output_embeddings().weight
        logits_size = compute_size if method.loss != "chunked" else 0
        own_logits = batch_size * seq_len * head.shape[0] * logits_size
        previous = own_logits + storage_bytes(kept_inputs)
        detail.update(previous_step_held=previous, logits_held_in_backward=own_logits)
        forward_activations += previous
        backward_activations += own_logits
        inputs = " and its 4-bit layer inputs" if kept_inputs else ""
        notes.append(f"--keeps-previous-logits: the loop keeps each step's logits ({human_bytes(own_logits)}) through "
                     f"its backward, and the previous step's logits{inputs} ({human_bytes(previous)}) until the next "
                     "forward returns, beside its own")
    held_cache: dict[str, int] = {}
    if method.keeps_kv_cache:
        # The cache the forward builds (saved_for_backward measures what it holds): transformers 4's tuples held
        # every position of every layer, and nothing else holds them under checkpointing. Alive from the forward to
        # the loop's release of the outputs; with --keeps-previous-logits through backward and, the previous step's,
        # to the next forward's end.
        cache = saved.cache_held
        detail["kv_cache_held"] = cache
        held_cache = {"forward": cache * (2 if method.keeps_previous_logits else 1),
                      "backward": cache if method.keeps_previous_logits else 0}
        notes.append(f"--keeps-kv-cache: the forward's outputs hold every layer's keys and values, with the storage "
                     f"they are views of ({human_bytes(cache)}), until the loop releases them: "
                     + ("through backward, and the previous step's until the next forward returns"
                        if method.keeps_previous_logits else "at the loss, freed before backward"))
    if method.quantize_head and target == "cuda" and method.quantization:
        # Each use of the 4-bit head (its forward at the loss, its backward first) dequantizes it into fp16, the
        # dtype it was quantized from, and casts that to the compute dtype: both alive for the matmul.
        head = model.get_output_embeddings().weight
        compute = plan.quantization.bnb_4bit_compute_dtype.itemsize
        dequantized = head.numel() * (2 + (compute if plan.quantization.bnb_4bit_compute_dtype != torch.float16 else 0))
        detail["head_dequantized"] = dequantized
        forward_temporaries += dequantized
        backward_temporaries += dequantized
        notes.append(f"--quantize-head: the 4-bit LM head dequantized into fp16 and cast for each use "
                     f"({human_bytes(dequantized)}, at the loss and at the start of backward)")
    if world_size > 1 and not method.sharded:
        # DDP: a whole replica per rank, and the reducer's buckets, flat copies of the trainable gradients it
        # all-reduces, allocated when the model is wrapped and kept (torch's default gradient_as_bucket_view=False
        # copies each gradient in and back out).
        persistent_grads = trainable_bytes
        optimizer_grads += trainable_bytes
        detail["ddp_gradient_buckets"] = trainable_bytes
        notes.append(f"DDP over {world_size} ranks: each rank holds the whole model, and DDP's gradient buckets, a "
                     f"second copy of the trainable gradients ({human_bytes(trainable_bytes)}), from the wrap on; "
                     "gradient_as_bucket_view=True makes the gradients views into the buckets and saves that copy")
    static = {**parts, "optimizer_state": optimizer_state}
    instants = {
        "forward": {**static, "gradients": persistent_grads, "activations": forward_activations,
                    "temporaries": forward_temporaries},
        "backward": {**static, "gradients": persistent_grads, "activations": backward_activations,
                     "temporaries": logits_grad + backward_temporaries},
        "optimizer": {**static, "gradients": optimizer_grads, "activations": 0,
                      "temporaries": optimizer_temporaries},
    }
    if fsdp is not None:
        instants = fsdp.instants(forward_activations, backward_activations, logits_grad)
        detail.update(fsdp.detail, adamw_step_temporaries=fsdp.optimizer_temporaries)
        notes += fsdp.notes
        host = fsdp.host
    for name, held in held_cache.items():  # counted as what it is, the KV cache, not saved activations
        instants[name]["kv_cache"] = held
    if method.grad_accum > 1:
        unsynced = fsdp is not None and method.grad_sync == "last"
        held = (fsdp.unsharded_gradients if unsynced else fsdp.gradients) if fsdp else accumulated
        detail["accumulated_gradients"] = held
        if method.zero_stage != 3:  # ZeRO-3's partition is counted at every instant already
            for name in ("forward", "backward"):
                instants[name]["gradients"] = instants[name].get("gradients", 0) + held
        where = ("" if not (fsdp or method.zero_stage) else
                 f", unsharded until the last micro-batch reduces them (--grad-sync last: no_sync, as accelerate "
                 f"and Lightning accumulate; reduced into the shards each micro-batch, --grad-sync each, "
                 f"{human_bytes(fsdp.gradients)})" if unsynced else
                 f", each micro-batch's reduced into the shards (--grad-sync each, as torchtitan and torchtune "
                 f"accumulate; held unsharded until the last, --grad-sync last as accelerate's no_sync, "
                 f"{human_bytes(fsdp.unsharded_gradients)})" if fsdp else
                 " (ZeRO-3 keeps its gradient partition at every instant in any case)" if method.zero_stage == 3 else
                 ", each micro-batch's reduced into ZeRO's partition")
        notes.append(f"gradient accumulation over {method.grad_accum} micro-batches: from the second on, the "
                     f"summed gradients ({human_bytes(held)} per rank on the device) are alive through forward and "
                     f"backward{where}")
    instants = {name: {c: int(v.get(c, 0)) for c in CATEGORIES} for name, v in instants.items()}
    replayer = None
    if target == "cuda" and not method.zero_stage:
        replayer = functools.partial(_replay, model, quantized, method, plan, batch_size, target, notes,
                                     fsdp.step if fsdp else None)
    settings = {"batch_size": batch_size, "seq_len": seq_len, "world_size": world_size, "device": target,
                "model": model_name, "precision": plan.precision, "engine": engine,
                "method": method.settings()}
    return Estimate(method.label, settings, instants, params, detail, notes, {k: int(v) for k, v in host.items() if v},
                    replayer)


def _replay(model, quantized: set[str], method: Method, plan, batch_size: int, target: Target, notes: list[str],
            sharding: ShardedStep | None, lengths: tuple[int, ...], capacity: int | None = None
            ) -> AllocatorReplay | None:
    """The step replayed through the caching allocator's policy (``predict.step_replay``), or None, with the
    reason in ``notes``, where an op of the model has no meta kernel for its backward."""
    double_quant = method.double_quant and bool(quantized)
    sizes = [(t, nf4_bytes(tuple(t.shape), double_quant) if n in quantized else t.untyped_storage().nbytes())
             for n, t in [*model.named_parameters(), *model.named_buffers()]]
    compute = plan.quantization.bnb_4bit_compute_dtype if plan.quantization is not None else torch.bfloat16
    try:
        return replay_step(model, sizes, quantized, method, batch_size, lengths, target, plan.autocast, compute,
                           sharding, capacity)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        notes.append(f"reserved memory from the measured reserved/allocated ratio: the step could not be replayed "
                     f"on the meta device ({type(exc).__name__}: {first[:160]})")
        return None


# --------------------------------------------------------------------------- generation

class _LiveStorages(TorchDispatchMode):
    """Live bytes on the meta device beside the weights, op by op: every op's outputs are new storages until Python
    frees them (CPython frees at once, as on a device). torch's ``MemTracker`` reports a peak by its own categories but
    not which storages were live at it; the estimate needs that to tell the KV cache from the transients."""

    def __init__(self, static: list[torch.Tensor], existing: list[torch.Tensor]):
        """``static``: tensors alive throughout (weights), left out of the count; ``existing``: others alive at the
        start (the cache so far)."""
        super().__init__()
        self.static = {storage_id(t) for t in static}
        self.live: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}
        for t in existing:
            self._add(t)
        self.peak, self.at_peak = 0, {}
        self._measure()

    def _add(self, t: torch.Tensor) -> None:
        storage, key = t.untyped_storage(), storage_id(t)
        if key not in self.live and key not in self.static:
            self.live[key] = (StorageWeakRef(storage), storage.nbytes())

    def _measure(self) -> None:
        total = sum(n for _, n in self.live.values())
        if total > self.peak:
            self.peak, self.at_peak = total, {k: n for k, (_, n) in self.live.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:  # freed since the last op
            del self.live[key]
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._measure()
        return out


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]


def _generate_pass(model, input_ids, cache, target: Target, autocast, static: list[torch.Tensor],
                   method: Method):
    """One forward pass as generate() makes it, under a live-storage tracker: the logits ``method.prefill_logits``
    says (the last position's; or every position's, in the model's dtype or upcast to fp32 in the forward), then
    the last position's fp32 copy and the min-new-tokens processor's copy. Under ``kv_cache`` "tuples" the cache the
    pass was given stays alive beside the one it returns, as transformers' tuples were until the pass ended. Returns
    the tracker and the cache."""
    cache = cache if cache is not None else DynamicCache(config=model.config)
    previous = _cache_tensors(cache) if method.kv_cache == "tuples" else []
    with torch.inference_mode(), _LiveStorages(static, [input_ids, *_cache_tensors(cache)]) as live, \
            TargetDevice(target, autocast):
        out = model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                    logits_to_keep=1 if method.prefill_logits == "last" else 0)  # 0: every position
        cache, logits = out.past_key_values, out.logits
        del out
        if method.prefill_logits == "all-fp32":
            logits = logits.float()  # the model's own upcast: only the fp32 logits stay referenced
        scores = logits[:, -1, :].to(copy=True, dtype=torch.float32)
        processed = torch.where(torch.zeros_like(scores, dtype=torch.bool), -math.inf, scores)
        processed.argmax(dim=-1)
        del logits, scores, processed, previous
    return live, cache


def _estimate_inference(method: Method, config, batch_size: int, prompt: int, new_tokens: int, world_size: int,
                        target: Target, model_name: str) -> Estimate:
    """generate(): the prompt's forward pass (prefill) and the last new token's (decode, the largest cache),
    each simulated on the meta device with every storage's lifetime followed. The KV cache at each instant is
    the cache as that pass leaves it, as the breakdown measures it."""
    if world_size != 1:
        raise EstimateError(f"{method.name}: generation is estimated on one device (world size 1)")
    model, quantized, plan = meta_model(method, config, target, torch.bfloat16 if target == "cuda" else None)
    check_sequence(model, prompt + new_tokens - 1)  # the last new token is never fed
    model.config.use_cache = True
    cpu_packed = bool(quantized) and target == "cpu" and _bnb_packs_for_this_cpu()
    params, parts, _ = _parameters(model, quantized, method.double_quant if quantized else False, cpu_packed)
    static = [*model.parameters(), *model.buffers()]
    weights = {k: v for k, v in parts.items() if k != "parameters_trainable"}

    def instant(live: _LiveStorages, cache_after: int) -> dict[str, int]:
        # Everything live at the pass's peak that is neither a weight nor the cache as the pass leaves it: the
        # transients, and while a layer's cache grows (a concatenation), its old copy beside the new one.
        transient = sum(live.at_peak.values()) - cache_after
        return {**{c: 0 for c in CATEGORIES}, **weights, "kv_cache": cache_after, "activations": max(transient, 0)}

    with contiguous_batches():
        live, cache = _generate_pass(model, torch.zeros(batch_size, prompt, dtype=torch.long, device="meta"),
                                     None, target, plan.autocast, static, method)
        prefill = instant(live, storage_bytes(_cache_tensors(cache)))
        kv_dtype = _cache_tensors(cache)[0].dtype
        decode = None
        if new_tokens > 1:
            # The cache before the last pass (prompt + new_tokens - 2 positions): the prefill's, each layer's keys
            # and values lengthened on the meta device (a forward pass to build it would cost as much as the rest).
            cache = _lengthened(cache, prompt + new_tokens - 2)
            live, cache = _generate_pass(model, torch.zeros(batch_size, 1, dtype=torch.long, device="meta"),
                                         cache, target, plan.autocast, static, method)
            decode = instant(live, storage_bytes(_cache_tensors(cache)))
    element = torch.empty((), dtype=kv_dtype).element_size()
    kv_final = kv_cache_bytes(config, batch_size, prompt + new_tokens - 1, element)
    notes = list(plan.notes)
    if decode is not None and decode["kv_cache"] != kv_final:
        notes.append(f"the simulated cache holds {decode['kv_cache']:,} bytes, the configuration's formula "
                     f"{kv_final:,}: this model's cache is not one key and value per layer and position")
    notes.append(_generate_note(method, batch_size * prompt * model.get_output_embeddings().weight.shape[0],
                                plan.load_dtype.itemsize, kv_cache_bytes(config, batch_size, prompt + new_tokens - 2,
                                                                         element) if new_tokens > 1 else 0))
    if cpu_packed:
        notes.append("CPU target with AVX512-BF16: bitsandbytes repacks each 4-bit layer at its first inference pass "
                     "(bf16 absmax per block, no nested quantization state)")
    if target == "cuda" and quantized:
        # bitsandbytes multiplies by a 4-bit weight through a dequantized copy in the compute dtype, except for a
        # single row (batch-1 decoding), which its gemv kernel reads in 4 bits.
        names = dict(model.named_parameters())
        dequantized = max(names[n].numel() for n in quantized) * plan.quantization.bnb_4bit_compute_dtype.itemsize
        prefill["temporaries"] = dequantized
        if decode is not None and batch_size > 1:
            decode["temporaries"] = dequantized
        notes.append("CUDA target: bitsandbytes dequantizes each 4-bit weight into the compute dtype for its "
                     "matmul (the largest is a temporary), except for batch-1 decoding (its gemv kernel)")
    instants = {"prefill": prefill, **({"decode": decode} if decode is not None else {})}
    detail = {"kv_cache_bytes_per_token": kv_final // max(batch_size * (prompt + new_tokens - 1), 1),
              "kv_cache_final": kv_final}
    settings = {"batch_size": batch_size, "seq_len": prompt, "max_new_tokens": new_tokens, "world_size": 1,
                "device": target, "model": model_name, "precision": plan.precision, "method": method.settings(),
                "kv_cache_dtype": str(kv_dtype).removeprefix("torch.")}
    return Estimate(method.label, settings, instants, params, detail, notes)


def _generate_note(method: Method, prompt_logits: int, itemsize: int, previous_cache: int) -> str:
    """Which of transformers' ways of running generate() the estimate took, and what the others hold
    (``prompt_logits``: elements of every prompt position's logits; ``previous_cache``: the cache's bytes before the
    last pass)."""
    every = {"all": prompt_logits * itemsize, "all-fp32": prompt_logits * (itemsize + 4)}
    logits = {"last": "the prompt pass computes logits at its last position only (--prefill-logits last, "
                      "transformers >= 4.45)",
              "all": "the prompt pass computes logits at every position, in the model's dtype (--prefill-logits all)",
              "all-fp32": "the prompt pass computes logits at every position and upcasts them to fp32 in the forward "
                          "(--prefill-logits all-fp32, Llama-family models before transformers 4.45)"}
    logits = logits[method.prefill_logits]
    if method.prefill_logits == "last":
        logits += (f"; before 4.45 every position's, {human_bytes(every['all'])} more at the prompt pass "
                   f"({human_bytes(every['all-fp32'])} where the model upcast them to fp32)")
    cache = ("the KV cache is updated in place, layer by layer (--kv-cache dynamic, transformers >= 4.36)"
             if method.kv_cache == "dynamic" else
             "each pass returns new key and value tuples while the previous pass's stay alive until it ends "
             "(--kv-cache tuples, transformers before 4.36)")
    if method.kv_cache == "dynamic" and previous_cache:
        cache += f"; before 4.36 the previous pass's tuples, {human_bytes(previous_cache)}, were alive beside them"
    return f"generate(): {logits}; {cache}"


def _lengthened(cache, positions: int):
    """A transformers cache like ``cache`` that has seen ``positions`` positions (meta tensors): every layer holds
    them, a sliding-window layer the last of them its window keeps, and counts them all (its attention mask is
    built from that count)."""
    for layer in cache.layers:
        kept = min(positions, layer.sliding_window - 1) if getattr(layer, "is_sliding", False) else positions
        for name in ("keys", "values"):
            t = getattr(layer, name)
            setattr(layer, name, t.new_empty((*t.shape[:-2], kept, t.shape[-1])))
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = positions
    return cache


def _bnb_packs_for_this_cpu() -> bool:
    """Whether bitsandbytes takes its packed CPU inference path here (it asks the CPU for AVX512-BF16)."""
    try:
        from bitsandbytes.functional import has_avx512bf16  # optional: absent, the CPU path is not taken
    except Exception:  # no bitsandbytes, or an older one without the CPU path
        return False
    return bool(has_avx512bf16())


def estimate_run(method: Method, settings, target: Target, world_size: int = 1) -> Estimate:
    """The estimate for what ``RunSettings`` describe (preset or local model, batch and length)."""
    settings = replace(settings, method=method.name).resolved()  # the method decides the default batch
    return estimate(method, model_config(settings), settings.batch_size, settings.seq_len, world_size,
                    target, settings.model_path or settings.preset, settings.engine, settings.max_new_tokens)


def estimate_methods(methods: list[Method], settings, target: Target, world_size: int = 1) -> list[Estimate]:
    return [estimate_run(m, settings, target, world_size) for m in methods]


def frame(estimates: list[Estimate]) -> pd.DataFrame:
    """Long format: method, instant, category, bytes; plus one ``peak`` row per method (at its peak instant)."""
    rows = [{"method": e.method, "instant": instant, "category": c, "bytes": b}
            for e in estimates for instant, cats in e.instants.items() for c, b in cats.items()]
    rows += [{"method": e.method, "instant": e.peak_instant, "category": "peak", "bytes": e.peak_bytes}
             for e in estimates]
    return pd.DataFrame(rows, columns=["method", "instant", "category", "bytes"])


def at_peak(estimates: list[Estimate]) -> pd.DataFrame:
    """Rows: categories, ``peak`` (allocated), for CUDA targets ``reserved``, ``nvidia_smi`` and, where the step is
    replayed, ``reserved_lengths_grow`` (see ``Estimate.reserved``, ``device_used`` and ``reserved_if_lengths_grow``)
    and, where
    a method offloads, ``host_offloaded`` (pinned host memory); columns: methods; bytes at each method's peak."""
    host = any(e.host for e in estimates)
    return pd.DataFrame({e.method: {**e.at_peak(), "peak": e.peak_bytes,
                                    **({"reserved": e.reserved()["bytes"]} if e.reserved() else {}),
                                    **({"nvidia_smi": e.device_used()["bytes"]} if e.device_used() else {}),
                                    **({"reserved_lengths_grow": e.reserved_if_lengths_grow()["bytes"]}
                                       if e.reserved_if_lengths_grow() else {}),
                                    **({"host_offloaded": sum(e.host.values())} if host else {})}
                         for e in estimates})
