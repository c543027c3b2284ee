"""Training steps run on the meta device, every allocation and free fed to the caching allocator's policy.

The estimator's allocated peak is counted from what autograd saves (``predict.estimate``); what the caching
allocator reserves beyond it depends on the order and sizes of every allocation of the step, temporaries
included. Here the step itself runs on the meta device (no memory), under the same stand-ins for the target's
kernels: each storage an op returns is an allocation, the end of that storage object its free. The calls are
recorded once (``AllocationTrace``) and then go through ``predict.allocator.CachingAllocator``, unbounded or with
a device's room. Two steps are replayed (``fixed_lengths``), so that the second finds the segments the first left
cached, as a real run's steady state does, and the optimizer's state (made at the first step) sits where it lands;
the second is the first's calls again less that state, not a second meta step. Or steps of growing lengths
(``growing_lengths``), for batches padded to their longest sample.

FSDP's step (``ShardedStep``) is the same compute with FSDP2's allocations around it: each rank's shards; a
unit's gathered parameters (the all-gather's flat output on its own stream, FSDP keeping the latest until the
next, and the unsharded parameters) from its pre-forward to its post-forward and again from its pre-backward,
with the next unit prefetched, to its post-backward; there its unsharded gradients are reduce-scattered (the
reduce-scatter's input and output on another stream) and freed. The root unit (embeddings, final norm, LM head)
stays gathered from forward to the end of backward. The optimizer steps on the shards (under CPU offload, on the
host: each shard is then copied to the device for its all-gather, and nothing else of it stays). The caching
allocator keeps a pool per stream, so what one stream frees the others cannot take.

What the stream does not see: kernels' internal workspaces (cuBLAS' is cached, a few MiB), and bitsandbytes'
dequantized weights, added here by hand: a 4-bit layer dequantizes its weight into a temporary of the compute
dtype for its forward and again for its backward.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from dataclasses import dataclass
from fractions import Fraction

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from profkit.core.methods import Method
from profkit.core.quiet import library_output
from profkit.model.build import decoder_layers
from profkit.model.loss import chunked_loss, loss_of_logits
from profkit.predict.allocator import CachingAllocator, OutOfMemory
from profkit.predict.stand_ins import Target, TargetDevice, contiguous_batches


def fixed_lengths(seq_len: int) -> tuple[int, ...]:
    """Two steps of the full length: the second finds what the first left cached, as a real run's steady state."""
    return seq_len, seq_len


def growing_lengths(seq_len: int) -> tuple[int, ...]:
    """Batches padded to their longest sample, the lengths growing to ``seq_len``: the blocks of shorter steps stay
    cached and rarely fit a longer step's requests, the most a run of varying lengths reserves."""
    return tuple(sorted({max(1, seq_len * k // 4) for k in (1, 2, 3, 4)}))


@dataclass(frozen=True)
class AllocatorReplay:
    peak_allocated: int  # the replayed stream's own allocated peak (rounded blocks)
    peak_reserved: int
    segments: int
    failed_request: int | None = None  # with a capacity: the request that found no room (out of memory)

    @property
    def overhead(self) -> int:
        """Reserved beyond allocated at their peaks: what the predicted allocated peak is short of reserved."""
        return self.peak_reserved - self.peak_allocated

    def to_json(self) -> dict:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "segments": self.segments, "overhead": self.overhead, "failed_request": self.failed_request}


@dataclass(frozen=True)
class ShardedStep:
    """FSDP2's allocations on one rank, bytes: ``shards`` (each parameter's shard and the buffers, in load order),
    ``root`` (the root unit gathered), ``layers`` (each decoder layer gathered), ``layer_grads`` and ``root_grads``
    (what each reduce-scatter takes in), ``grad_shards`` (the sharded gradients), ``optimizer_state`` and
    ``optimizer_temporaries`` (its step on the shards)."""

    shards: list[int]
    root: int
    layers: list[int]
    layer_grads: list[int]
    root_grads: int
    grad_shards: int
    optimizer_state: int
    optimizer_temporaries: int
    world: int
    reshard: bool
    staged: bool = False  # CPU offload: each shard is copied to the device before its all-gather


COMPUTE, ALL_GATHER, REDUCE_SCATTER = 0, 1, 2  # the streams FSDP allocates on


MALLOC, FREE = 0, 1


@dataclass(frozen=True)
class AllocationTrace:
    """Every allocation and free of replayed steps, in order: ``(MALLOC, handle, bytes, stream)`` or
    ``(FREE, handle, 0, stream)``; ``steps``: where each step's events begin (what comes before the first is the
    weights' loading). Recorded once with no bound on the device, then run through the allocator's policy with any
    capacity (``through``): up to the request that finds no room, a bounded run makes exactly these calls."""

    events: tuple[tuple[int, int, int, int], ...]
    steps: tuple[int, ...]

    def through(self, capacity: int | None = None) -> AllocatorReplay:
        allocator = CachingAllocator(capacity)
        try:
            for kind, handle, nbytes, stream in self.events:
                if kind == MALLOC:
                    allocator.malloc(handle, nbytes, stream)
                else:
                    allocator.free(handle)
        except OutOfMemory as exc:
            return AllocatorReplay(allocator.peak_allocated, allocator.peak_reserved, len(allocator.segments),
                                   exc.requested)
        return AllocatorReplay(allocator.peak_allocated, allocator.peak_reserved, len(allocator.segments))

    def canonical(self) -> list[tuple[int, int, int, int]]:
        """The calls with each handle named by the order in which it was first allocated: two traces of the same
        step compare equal whatever handles their recordings drew."""
        names: dict[int, int] = {}
        return [(kind, names.setdefault(handle, len(names)), nbytes, stream)
                for kind, handle, nbytes, stream in self.events]

    def first_step(self) -> AllocationTrace:
        """The weights' loading and the first step alone."""
        end = self.steps[1] if len(self.steps) > 1 else len(self.events)
        return AllocationTrace(self.events[:end], self.steps[:1])

    def then(self, other: AllocationTrace) -> AllocationTrace:
        """These steps, then ``other``'s last step (a step of another length, say) run as the next one: its calls
        less what it made to keep (allocated in it and live at its end: the optimizer's state, made at the first
        step and kept by every later one)."""
        step = other.events[other.steps[-1]:]
        made = {handle for kind, handle, _, _ in step if kind == MALLOC}
        freed = {handle for kind, handle, _, _ in step if kind == FREE}
        offset = 1 + max(handle for _, handle, _, _ in self.events)
        again = tuple((kind, handle + offset, nbytes, stream) for kind, handle, nbytes, stream in step
                      if handle in made and handle in freed)
        return AllocationTrace(self.events + again, self.steps + (len(self.events),))

    def repeated(self) -> AllocationTrace:
        """The last step run once more, as the next step of the same lengths runs it."""
        return self.then(self)


def lagrange_weights(xs: list[int], x: int) -> list[Fraction]:
    """The weights that make the polynomial through values at ``xs`` its value at ``x``, exactly."""
    weights = []
    for i, xi in enumerate(xs):
        w = Fraction(1)
        for j, xj in enumerate(xs):
            if j != i:
                w *= Fraction(x - xj, xi - xj)
        weights.append(w)
    return weights


def interpolated(samples: dict[int, AllocationTrace], x: int) -> AllocationTrace | None:
    """The trace at length ``x`` from traces at other lengths whose calls agree in order, kind and stream: each
    size the polynomial through the samples' sizes (sizes are products of dimensions: at most quadratic in the
    length with three samples), exactly; None where the calls differ or a size is not a whole number of bytes."""
    xs = sorted(samples)
    calls = {n: samples[n].canonical() for n in xs}
    shape = [(k, h, st) for k, h, _, st in calls[xs[0]]]
    if any([(k, h, st) for k, h, _, st in calls[n]] != shape for n in xs[1:]) or \
            any(samples[n].steps != samples[xs[0]].steps for n in xs[1:]):
        return None
    weights = lagrange_weights(xs, x)
    events = []
    for n, (kind, handle, _, stream) in enumerate(calls[xs[0]]):
        size = sum(w * calls[xi][n][2] for w, xi in zip(weights, xs))
        if size.denominator != 1 or size < 0:
            return None
        events.append((kind, handle, int(size), stream))
    return AllocationTrace(tuple(events), samples[xs[0]].steps)


class _Recorder:
    """The allocator's interface, recording the calls (``AllocationTrace``) instead of placing blocks."""

    def __init__(self):
        self.events: list[tuple[int, int, int, int]] = []
        self.steps: list[int] = []
        self._live: dict[int, int] = {}  # handle -> stream

    def malloc(self, handle: int, nbytes: int, stream: int = COMPUTE) -> None:
        self._live[handle] = stream
        self.events.append((MALLOC, handle, nbytes, stream))

    def free(self, handle: int) -> None:
        self.events.append((FREE, handle, 0, self._live.pop(handle)))

    def live(self, handle: int) -> bool:
        return handle in self._live

    def step(self) -> None:
        self.steps.append(len(self.events))

    def trace(self) -> AllocationTrace:
        return AllocationTrace(tuple(self.events), tuple(self.steps))


class _AllocationStream(TorchDispatchMode):
    """Feeds ``allocator`` every storage an op returns that it has not seen, and frees it when the storage dies."""

    def __init__(self, allocator: _Recorder):
        super().__init__()
        self.allocator = allocator
        self._handles = 0
        self._live: set[int] = set()

    def allocate(self, storage: torch.UntypedStorage, nbytes: int | None = None) -> None:
        key = storage._cdata
        if key in self._live:
            return
        self._handles += 1
        handle = self._handles
        self._live.add(key)
        self.allocator.malloc(handle, storage.nbytes() if nbytes is None else nbytes)
        weakref.finalize(storage, self._free, key, handle)

    def _free(self, key: int, handle: int) -> None:
        self._live.discard(key)
        self.allocator.free(handle)

    def ignore(self, storage: torch.UntypedStorage) -> None:
        """A storage the step uses but the target holds otherwise (a parameter FSDP keeps as shards)."""
        self._live.add(storage._cdata)

    def hold(self, nbytes: int, stream: int = COMPUTE) -> int:
        """A block the target allocates outside the meta step (FSDP's buffers): its handle, for ``release``."""
        self._handles += 1
        if nbytes:
            self.allocator.malloc(self._handles, nbytes, stream)
        return self._handles

    def release(self, handle: int) -> None:
        if self.allocator.live(handle):
            self.allocator.free(handle)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                self.allocate(t.untyped_storage())
        return out


def _dequantizing(model, quantized: set[str], dtype: torch.dtype) -> list:
    """Hooks that hold a weight-sized temporary in ``dtype`` while each 4-bit layer's forward and backward run,
    as bitsandbytes' 4-bit matmul does for inputs of more than one token. (A parametrized expert tensor,
    --quantize-experts, is dequantized by the meta forward itself.)"""
    names = {n.removesuffix(".weight") for n in quantized if n.endswith(".weight")}
    handles = []
    for name, module in model.named_modules():
        if name not in names:
            continue

        def hold(module, *_):
            module._profkit_dequantized = torch.empty(module.weight.shape, dtype=dtype, device="meta")

        def drop(module, *_):
            module.__dict__.pop("_profkit_dequantized", None)

        handles += [module.register_forward_pre_hook(hold), module.register_forward_hook(drop),
                    module.register_full_backward_pre_hook(hold), module.register_full_backward_hook(drop)]
    return handles


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class _ShardedAllocations:
    """FSDP2's allocations around the meta step (see the module docstring), made by module hooks."""

    def __init__(self, stream: _AllocationStream, model, sharding: ShardedStep):
        self.stream, self.sharding = stream, sharding
        self.layers = decoder_layers(model)
        self.flat: int | None = None  # the latest all-gather's flat output, kept until the next
        self.gathered: dict[int, int] = {}  # layer -> its unsharded parameters
        self.root: int | None = None
        self.grad_shards: int | None = None
        self.done: list[torch.nn.Module] = []  # layers whose gradients were reduce-scattered this step
        self.optimizer_state: int | None = None
        self.reduce = True  # False: a micro-batch under no_sync, whose unsharded gradients stay for the next
        self.handles = [h for i, layer in enumerate(self.layers) for h in (
            layer.register_forward_pre_hook(functools.partial(self._pre_forward, i)),
            layer.register_forward_hook(functools.partial(self._post_forward, i)),
            layer.register_full_backward_pre_hook(functools.partial(self._pre_backward, i)),
            layer.register_full_backward_hook(functools.partial(self._post_backward, i)))]

    def _all_gather(self, nbytes: int) -> int:
        staged = self.stream.hold(-(-nbytes // self.sharding.world)) if self.sharding.staged else None
        flat = self.stream.hold(nbytes, ALL_GATHER)
        if staged is not None:
            self.stream.release(staged)
        if self.flat is not None:
            self.stream.release(self.flat)
        self.flat = flat
        return self.stream.hold(nbytes, COMPUTE)

    def _unshard(self, i: int) -> None:
        if 0 <= i < len(self.layers) and i not in self.gathered:
            self.gathered[i] = self._all_gather(self.sharding.layers[i])

    def _reduce_scatter(self, nbytes: int) -> None:
        if self.grad_shards is None:
            self.grad_shards = self.stream.hold(self.sharding.grad_shards, REDUCE_SCATTER)
        self.stream.release(self.stream.hold(nbytes, REDUCE_SCATTER))

    def start_forward(self) -> None:
        self.root = self._all_gather(self.sharding.root)

    def _pre_forward(self, i, module, args):
        if not _in_backward():  # in a recomputation the pre-backward has gathered it
            self._unshard(i)

    def _post_forward(self, i, module, args, output):
        if self.sharding.reshard and not _in_backward():
            self.stream.release(self.gathered.pop(i))

    def _pre_backward(self, i, module, grad_output):
        self._unshard(i)
        self._unshard(i - 1)  # FSDP2 prefetches the next layer backward runs

    def _post_backward(self, i, module, grad_input, grad_output):
        if not self.reduce:
            self.stream.release(self.gathered.pop(i))
            return
        self._reduce_scatter(self.sharding.layer_grads[i])
        self.done.append(module)
        # the unsharded gradients, freed once reduced; the layers done before too, as autograd may accumulate a
        # weight's gradient after its layer's hook ran
        for layer in self.done:
            for p in layer.parameters():
                p.grad = None
        self.stream.release(self.gathered.pop(i))

    def end_backward(self, trainable: list) -> None:
        if self.reduce:
            self._reduce_scatter(self.sharding.root_grads)
            for p in trainable:
                p.grad = None
        for handle in [self.root, self.flat, *self.gathered.values()]:
            if handle is not None:
                self.stream.release(handle)
        self.root = self.flat = None
        self.gathered.clear()
        self.done.clear()

    def optimizer_step(self) -> None:
        if self.optimizer_state is None:  # made at the first step, as torch's optimizers do
            self.optimizer_state = self.stream.hold(self.sharding.optimizer_state)
        self.stream.release(self.stream.hold(self.sharding.optimizer_temporaries))
        if self.grad_shards is not None:
            self.stream.release(self.grad_shards)
            self.grad_shards = None


def _optimizer(method: Method, parameters: list, target: Target):
    """The optimizer the workload steps, on meta: torch's AdamW (foreach, as on CUDA) or SGD. bitsandbytes' 8-bit
    optimizers have no meta kernels: their state is counted by the estimate, not replayed (None)."""
    if method.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-4, foreach=target == "cuda")
    if method.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=1e-4)
    return None


def trace_step(model, static_sizes: list[tuple[torch.Tensor, int]], quantized: set[str], method: Method,
               batch_size: int, lengths: tuple[int, ...], target: Target, autocast: torch.dtype | None,
               compute_dtype: torch.dtype, sharding: ShardedStep | None = None) -> AllocationTrace:
    """The allocations of training steps of ``model`` (a meta model), one per sequence length in ``lengths``, with
    ``method``'s checkpointing, loss, gradient accumulation and optimizer; ``static_sizes``: each weight and buffer
    with the bytes it holds on the target (4-bit weights packed), in the order they are loaded; ``sharding``:
    FSDP's allocations on one rank, in place of the whole weights and the optimizer's step on them. A step that
    repeats the one before it (``fixed_lengths``) is not run again: ``AllocationTrace.repeated``."""
    recorder = _Recorder()
    stream = _AllocationStream(recorder)
    trainable = [p for p in model.parameters() if p.requires_grad]
    sharded = None
    if sharding is None:
        for tensor, nbytes in static_sizes:
            stream.allocate(tensor.untyped_storage(), nbytes)
        optimizer = _optimizer(method, trainable, target)
    else:
        for tensor, _ in static_sizes:
            stream.ignore(tensor.untyped_storage())
        for nbytes in sharding.shards:
            stream.hold(nbytes)
        optimizer = None
        sharded = _ShardedAllocations(stream, model, sharding)
    hooks = _dequantizing(model, quantized, compute_dtype) + (sharded.handles if sharded else [])
    if method.gradient_checkpointing:
        # Non-reentrant, with the stand-ins active while a layer is recomputed in backward (they are a mode of
        # this thread; autograd does not carry them into the recomputation).
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": lambda: (contextlib.nullcontext(), TargetDevice(target, autocast))})
    repeats = 0
    try:
        with library_output(), stream, contiguous_batches():
            # Under gradient accumulation the second micro-batch runs beside the first's gradients, as every later
            # one does: two are the step's allocations.
            micro_batches = min(method.grad_accum, 2)
            for i, seq_len in enumerate(lengths):
                if i and all(n == lengths[i - 1] for n in lengths[i:]):
                    repeats = len(lengths) - i
                    break
                recorder.step()
                for micro in range(micro_batches):
                    batch = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
                    if sharded:
                        sharded.reduce = method.grad_sync == "each" or micro == micro_batches - 1
                        sharded.start_forward()
                    with TargetDevice(target, autocast):  # one per forward, as autocast's cache of casts is
                        if method.loss == "fp32":
                            loss = model(input_ids=batch, labels=batch).loss
                        elif method.loss == "chunked":
                            loss = chunked_loss(model, batch, batch)
                        else:
                            loss = loss_of_logits(model(input_ids=batch).logits, batch, method.loss)
                    loss.backward()
                    del loss, batch
                    if sharded:
                        sharded.end_backward(trainable)
                if sharded:
                    sharded.optimizer_step()
                elif optimizer is not None:
                    optimizer.step()
                for p in trainable:
                    p.grad = None
    finally:
        for h in hooks:
            h.remove()
        for p in trainable:
            p.grad = None
        if method.gradient_checkpointing:
            model.activation_checkpointing_disable()
    trace = recorder.trace()
    for _ in range(repeats):
        trace = trace.repeated()
    return trace
