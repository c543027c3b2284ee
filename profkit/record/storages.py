"""Every storage's lifetime during a profiled step, followed at the dispatcher: memory by owner that needs no
profiler export (``export_memory_timeline`` is deprecated upstream and fails now and then, pytorch#167838).

A ``TorchDispatchMode`` sees each op's outputs: a storage that no input of the op views was allocated by it
(``alloc``), one that an input views already existed (``existing``). A weak reference on the storage's Python
object -- kept alive by torch exactly as long as its StorageImpl (PyObject preservation, torch >= 2.2) -- says
when it is freed (``free``). ``UntypedStorage.resize_`` frees or grows bytes without freeing the StorageImpl
(FSDP2 frees unsharded parameters so), so it is wrapped (``resize``). Autograd's pack hook marks what is saved
for backward (``saved``); callers mark what they know (``mark``: gradients by their post-accumulate hooks and
the optimizer's pre-step hook).

torch's ``MemTracker`` (torch.distributed._tools.mem_tracker) follows storages the same way but keeps running
totals only: no events, no instants, so no phase peaks or lifetimes to match against the allocator's history,
and it calls optimizer temporaries optimizer state and every forward output an activation (measured on torch
2.13: a peak "OPT" of twice Adam's state). Owners here are decided by what is known of each storage instead.

Not seen: memory an op allocates and frees inside itself (workspaces), and tensors made outside any op (by
C++ extensions that allocate directly). On CUDA the allocator's own history covers both.
"""

from __future__ import annotations

import functools
import gzip
import json
import threading
import time
import weakref
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from profkit.model.storage import local_tensor, unsharded_parameters, unsharded_storages
from profkit.record.inventory import storage_owners
from profkit.store import LIFETIME_EVENT_COLUMNS


def _tensors(value) -> Iterator[torch.Tensor]:
    """The tensors in an op's arguments or results: aten's are tensors, or lists, tuples and dicts of them.
    (torch's pytree does this too, at three times the cost per op: measured, it was a third of the tracker's.)"""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _storages(t: torch.Tensor) -> Iterator[torch.UntypedStorage]:
    """The real storages behind ``t``: a wrapper subclass (DTensor, a ZeRO or FSDP shard's wrapper) has none of
    its own, its inner tensors do."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None and type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        names, _ = t.__tensor_flatten__()
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # (a DTensor names its device mesh too)
                yield from _storages(inner)
        return
    if t.device.type == "meta":
        return
    yield t.untyped_storage()


class StorageLifetimes(TorchDispatchMode):
    """Use as a context manager around the steps to follow. ``phase`` names the phase work runs in now."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # Dynamo skips compiled frames while a dispatch mode is on the stack unless the mode says this: the
        # tracker's step then ran a ``torch.compile``d model eagerly while the profiler's step ran it compiled
        # (micro LoRA, aot_eager, torch 2.15: activations 2% and temporaries 21% of the peak apart; 0.01% with it).
        return True

    def __init__(self, phase: Callable[[], str] = lambda: "unattributed",
                 existing: Iterable[torch.Tensor] = ()) -> None:
        """``existing``: what is known to be live when following starts (the inventory's parameters, buffers and
        optimizer state), so its bytes count from the start, not from the first op that uses it."""
        super().__init__()
        self.phase = phase
        self.events: list[tuple] = []
        self._existing = list(existing)
        self._ids = WeakIdKeyDictionary()  # storage object -> its number here; never a strong reference
        self._refs: dict[int, weakref.ref] = {}
        self._next = 0
        self._lock = threading.Lock()  # backward may free on autograd's device threads
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._resize = None

    # -- what happens to storages -----------------------------------------------------------------------
    def _record(self, action: str, number: int, nbytes: int, device: str, op: str, address: int = 0,
                inputs: tuple[int, ...] = ()) -> None:
        with self._lock:
            self.events.append((time.perf_counter_ns(), action, number, nbytes, device, address, op, self.phase(),
                                inputs))

    def _follow(self, storage: torch.UntypedStorage, action: str, op: str, inputs: tuple[int, ...] = ()) -> int:
        number = self._ids.get(storage)
        if number is not None:
            return number
        number = self._next
        self._next += 1
        self._ids[storage] = number
        device = str(storage.device)

        def freed(_, number=number, device=device) -> None:
            self._record("free", number, 0, device, "")
            self._refs.pop(number, None)

        self._refs[number] = weakref.ref(storage, freed)
        # The address identifies the storage to the inventory (model.storage.storage_id) and the allocator.
        self._record(action, number, storage.nbytes(), device, op, storage.data_ptr(), inputs)
        return number

    def mark(self, tensor: torch.Tensor, owner: str) -> None:
        """Say what ``tensor``'s storages are (``gradient``, ``kv_cache``, ...) from now on."""
        for storage in _storages(tensor):
            number = self._follow(storage, "existing", "")
            self._record(f"owner:{owner}", number, storage.nbytes(), str(storage.device), "")

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        for storage in _storages(tensor):
            number = self._follow(storage, "existing", "")
            self._record("saved", number, storage.nbytes(), str(storage.device), "")
        # Detached: the same storage, without the grad_fn that would make a saved output a reference cycle (kept
        # until the garbage collector runs, so the step would hold more memory than without the tracker).
        return tensor.detach()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = None
        for t in _tensors(out):
            for storage in _storages(t):
                if storage in self._ids:
                    continue  # followed already (an in-place op's result, a view of a known storage)
                if inputs is None:  # read only for an op that made a storage not yet followed
                    inputs = {id(s): s for a in _tensors((args, kwargs)) for s in _storages(a)}
                    read = tuple(self._follow(s, "existing", "") for s in inputs.values())
                if id(storage) in inputs:
                    self._follow(storage, "existing", str(func.overloadpacket))
                else:
                    self._follow(storage, "alloc", str(func.overloadpacket), read)
        return out

    # -- install and remove -------------------------------------------------------------------------------
    def __enter__(self):
        tracker, original = self, torch.UntypedStorage.resize_

        def resize_(storage, size):
            result = original(storage, size)
            number = tracker._ids.get(storage)
            if number is not None:
                tracker._record("resize", number, int(size), str(storage.device), "resize_")
            return result

        self._resize = original
        torch.UntypedStorage.resize_ = resize_
        for t in self._existing:
            for storage in _storages(t):
                self._follow(storage, "existing", "")
        self._existing = []
        self._saved.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._saved.__exit__(*exc)
            torch.UntypedStorage.resize_ = self._resize


class MemoryCycleFollower:
    """The storage tracker around a step of a session's memory cycle: the inventory's storages known from the
    start, gradients marked as autograd accumulates them and as the optimizer steps on them, the events and
    owners written to the run."""

    def __init__(self, model: torch.nn.Module, optimizer, inner_optimizer, phase: Callable[[], str]) -> None:
        self.owners, existing = storage_owners(model, optimizer, inner_optimizer)
        self.tracker = StorageLifetimes(phase, existing)
        self.hooks = [p.register_post_accumulate_grad_hook(self._gradient)
                      for p in model.parameters() if p.requires_grad]
        self.hooks += [p.register_post_accumulate_grad_hook(functools.partial(self._held_gradient, group))
                       for p, group in unsharded_parameters(model) if p.requires_grad]
        # What the optimizer steps on are gradients too: ZeRO hands its inner optimizer a flat gradient
        # partition it made after backward, which no parameter's accumulate hook sees.
        stepping = inner_optimizer if inner_optimizer is not None else optimizer
        if isinstance(stepping, torch.optim.Optimizer):
            self.hooks.append(stepping.register_step_pre_hook(self._stepped_gradients))
        self.started_ns = time.perf_counter_ns()
        self.started_unix_us = time.time_ns() // 1000  # the CUDA allocator history's clock, to find this step in it
        self.tracker.__enter__()
        # FSDP gathers each unit's parameters into storages it keeps and resizes (0 bytes between uses).
        for t in unsharded_storages(model):
            self.tracker.mark(t, "parameters_unsharded")

    def _gradient(self, p: torch.Tensor) -> None:
        # A gradient that spans its storage is the gradient's memory. One that views a part of a larger buffer
        # lives in a framework's staging memory (ZeRO-2's reduce bucket, sized by its config, not by the
        # gradients: 2 GB on a 30 KB LoRA): that stays what its allocation made it, a temporary, as the estimate
        # and the profiler's export file it; what ZeRO steps on is marked whole, before the step.
        # FSDP's sharded gradients (DTensors) are views into the flat buffer its reduce-scatter wrote a unit's
        # gradients to, which holds nothing else: that buffer is the gradients' memory.
        grad = p.grad
        if grad is None:
            return
        local = local_tensor(grad)
        if local is not grad or sum(s.nbytes() for s in _storages(grad)) <= grad.numel() * grad.element_size():
            self.tracker.mark(grad, "gradients")

    def _held_gradient(self, group, p: torch.Tensor) -> None:
        # FSDP2 under no_sync keeps a unit's gradients unsharded until the last micro-batch: gradients. Reduced in
        # this backward, they are its reduce-scatter's input, a temporary (as the estimate counts them).
        if getattr(group, "reduce_grads", True) is False:
            self._gradient(p)

    def _stepped_gradients(self, optimizer: torch.optim.Optimizer, _args, _kwargs) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                self._gradient(p)

    def stop(self, path: Path) -> None:
        """Stop following and write ``{columns, events, owners, followed_ns, followed_unix_us}`` to ``path``."""
        try:
            self.tracker.__exit__(None, None, None)
        finally:
            for h in self.hooks:
                h.remove()
        owners = [[device, address, owner] for (device, address), owner in self.owners.items()]
        with gzip.open(path, "wt") as fh:
            json.dump({"columns": list(LIFETIME_EVENT_COLUMNS), "events": self.tracker.events, "owners": owners,
                       "followed_ns": time.perf_counter_ns() - self.started_ns,
                       "followed_unix_us": [self.started_unix_us, time.time_ns() // 1000]}, fh)
