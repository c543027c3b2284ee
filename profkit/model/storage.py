"""Memory is owned by storages, not tensors: ZeRO-2's parameters and gradients are views into one flat buffer, a
KV cache's keys may share one allocation, autograd saves the same activation for several ops. Everything that
counts bytes (the inventory, the KV cache, the estimate on the meta device) counts each storage once, by this key."""

from __future__ import annotations

from typing import Iterable

import torch


def storage_id(t: torch.Tensor) -> tuple[str, int]:
    """The storage ``t`` views: on a real device its memory (device, base address), so storages that alias the
    same memory count once; on the meta device, where every address is 0, the storage object itself (the
    address of its StorageImpl, which torch's own ``StorageWeakRef`` keys on)."""
    storage = t.untyped_storage()
    if t.device.type == "meta":
        return "meta", storage._cdata
    return str(t.device), storage.data_ptr()


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages that ``tensors`` view, each counted once."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        seen.setdefault(storage_id(t), t.untyped_storage().nbytes())
    return sum(seen.values())
