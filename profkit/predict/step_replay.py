"""Training steps run on the meta device, every allocation and free fed to the caching allocator's policy.

The estimator's allocated peak is counted from what autograd saves (``predict.estimate``); what the caching
allocator reserves beyond it depends on the order and sizes of every allocation of the step, temporaries
included. Here the step itself runs on the meta device (no memory), under the same stand-ins for the target's
kernels: each storage an op returns is an allocation, the end of that storage object its free, and the stream
goes through ``predict.allocator.CachingAllocator``. Two steps run, so that the second finds the segments the
first left cached, as a real run's steady state does, and the optimizer's state (made at the first step) sits
where it lands.

What the stream does not see: kernels' internal workspaces (cuBLAS' is cached, a few MiB), and bitsandbytes'
dequantized weights, added here by hand: a 4-bit layer dequantizes its weight into a temporary of the compute
dtype for its forward and again for its backward.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from profkit.core.methods import Method
from profkit.core.quiet import library_output
from profkit.model.loss import loss_of_logits
from profkit.predict.allocator import CachingAllocator
from profkit.predict.stand_ins import Target, TargetDevice, contiguous_batches

STEPS = 2


@dataclass(frozen=True)
class AllocatorReplay:
    peak_allocated: int  # the replayed stream's own allocated peak (rounded blocks)
    peak_reserved: int
    segments: int

    @property
    def overhead(self) -> int:
        """Reserved beyond allocated at their peaks: what the predicted allocated peak is short of reserved."""
        return self.peak_reserved - self.peak_allocated

    def to_json(self) -> dict:
        return {"peak_allocated": self.peak_allocated, "peak_reserved": self.peak_reserved,
                "segments": self.segments, "overhead": self.overhead}


class _AllocationStream(TorchDispatchMode):
    """Feeds ``allocator`` every storage an op returns that it has not seen, and frees it when the storage dies."""

    def __init__(self, allocator: CachingAllocator):
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

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                self.allocate(t.untyped_storage())
        return out


def _dequantizing(model, quantized: set[str], dtype: torch.dtype) -> list:
    """Hooks that hold a weight-sized temporary in ``dtype`` while each 4-bit layer's forward and backward run,
    as bitsandbytes' 4-bit matmul does for inputs of more than one token."""
    names = {n.rsplit(".", 1)[0] for n in quantized}
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


def _optimizer(method: Method, parameters: list, target: Target):
    """The optimizer the workload steps, on meta: torch's AdamW (foreach, as on CUDA) or SGD. bitsandbytes' 8-bit
    optimizers have no meta kernels: their state is counted by the estimate, not replayed (None)."""
    if method.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-4, foreach=target == "cuda")
    if method.optimizer == "sgd":
        return torch.optim.SGD(parameters, lr=1e-4)
    return None


def replay_step(model, static_sizes: list[tuple[torch.Tensor, int]], quantized: set[str], method: Method,
                batch_size: int, seq_len: int, target: Target, autocast: torch.dtype | None,
                compute_dtype: torch.dtype) -> AllocatorReplay:
    """``STEPS`` training steps of ``model`` (a meta model) with ``method``'s checkpointing, loss and optimizer;
    ``static_sizes``: each weight and buffer with the bytes it holds on the target (4-bit weights packed), in the
    order they are loaded."""
    allocator = CachingAllocator()
    stream = _AllocationStream(allocator)
    for tensor, nbytes in static_sizes:
        stream.allocate(tensor.untyped_storage(), nbytes)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(method, trainable, target)
    hooks = _dequantizing(model, quantized, compute_dtype)
    if method.gradient_checkpointing:
        # Non-reentrant, with the stand-ins active while a layer is recomputed in backward (they are a mode of
        # this thread; autograd does not carry them into the recomputation).
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={
            "use_reentrant": False,
            "context_fn": lambda: (contextlib.nullcontext(), TargetDevice(target, autocast))})
    try:
        with library_output(), stream, contiguous_batches():
            for _ in range(STEPS):
                batch = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
                with TargetDevice(target, autocast):  # one per forward, as autocast's cache of casts is
                    if method.loss == "fp32":
                        loss = model(input_ids=batch, labels=batch).loss
                    else:
                        loss = loss_of_logits(model(input_ids=batch).logits, batch, method.loss)
                loss.backward()
                del loss, batch
                if optimizer is not None:
                    optimizer.step()
                for p in trainable:
                    p.grad = None
    finally:
        for h in hooks:
            h.remove()
        if method.gradient_checkpointing:
            model.activation_checkpointing_disable()
    return AllocatorReplay(allocator.peak_allocated, allocator.peak_reserved, len(allocator.segments))
