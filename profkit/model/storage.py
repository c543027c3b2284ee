"""Memory is owned by storages, not tensors: ZeRO-2's parameters and gradients are views into one flat buffer, a
KV cache's keys may share one allocation, autograd saves the same activation for several ops. Everything that
counts bytes (the inventory, the KV cache, the estimate on the meta device) counts each storage once, by this key."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.distributed.fsdp import FSDPModule


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``t``: a DTensor's local shard (FSDP2's parameters, their gradients and optimizer
    state), any other tensor itself."""
    inner = getattr(t, "_local_tensor", None)
    return inner if isinstance(inner, torch.Tensor) else t


def storage_id(t: torch.Tensor) -> tuple[str, int]:
    """The storage ``t`` views: on a real device its memory (device, base address), so storages that alias the
    same memory count once; on the meta device or as a fake tensor, where every address is 0, the storage object
    itself (the address of its StorageImpl, which torch's own ``StorageWeakRef`` keys on)."""
    t = local_tensor(t)
    storage = t.untyped_storage()
    if t.device.type == "meta" or isinstance(t, FakeTensor):
        return str(t.device), storage._cdata
    return str(t.device), storage.data_ptr()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages that ``tensors`` view, each counted once."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        seen.setdefault(storage_id(t), local_tensor(t).untyped_storage().nbytes())
    return sum(seen.values())


def _fsdp_param_groups(model: torch.nn.Module) -> Iterator:
    """Every FSDP2 unit's parameter group (private to torch, read defensively: none where it is named otherwise)."""
    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        state = module._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            group = getattr(state, "_fsdp_param_group", None)
            groups = [group] if group is not None else []
        yield from groups


def unsharded_storages(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Tensors whose storages hold the gathered (unsharded) parameters of every FSDP unit: FSDP keeps one storage
    per parameter and resizes it to the full size for each gather and to 0 after (``FSDPParam.all_gather_outputs``;
    with tensor-subclass extensions, ``_unsharded_inner_tensors``). Private to torch, read defensively: a torch
    that names them otherwise yields nothing, and the gathered bytes are then filed as what allocated them."""
    for group in _fsdp_param_groups(model):
        for param in getattr(group, "fsdp_params", ()):
            yield from getattr(param, "all_gather_outputs", ())
            yield from getattr(param, "_unsharded_inner_tensors", ())


def unsharded_parameters(model: torch.nn.Module) -> Iterator[tuple[torch.Tensor, object]]:
    """FSDP2's unsharded parameters (what autograd accumulates a unit's gradients on, before its reduce-scatter),
    each with its unit's parameter group, whose ``reduce_grads`` is False under no_sync
    (``set_requires_gradient_sync(False)``). Private to torch, read defensively, as ``unsharded_storages``."""
    for group in _fsdp_param_groups(model):
        for param in getattr(group, "fsdp_params", ()):
            tensor = getattr(param, "_unsharded_param", None)
            if isinstance(tensor, torch.Tensor):
                yield tensor, group
