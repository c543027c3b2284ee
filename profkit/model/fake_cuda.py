"""PyTorch's own CUDA kernels without a GPU: the reference the estimator's meta-device stand-ins are held to.

Fake tensors (``FakeTensorMode``) that say they are on CUDA carry CUDA's dispatch keys, autocast's included, so
CUDA autocast and the CUDA kernels' shape and dtype rules run on them; nothing is allocated and no GPU is asked.
``torch.autocast`` itself refuses CUDA on a machine without one, so its switches are set directly."""

from __future__ import annotations

import contextlib
from collections import Counter

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from profkit.model.storage import storage_id


@contextlib.contextmanager
def real_autocast(device: str, dtype: torch.dtype = torch.bfloat16):
    """What ``torch.autocast(device, dtype)`` switches on, without its check that the device exists."""
    enabled, before = torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)
    torch.set_autocast_dtype(device, dtype)
    torch.set_autocast_enabled(device, True)
    torch.autocast_increment_nesting()
    try:
        yield
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, before)


def on_fake_device(model: torch.nn.Module, mode: FakeTensorMode, device: str = "cuda") -> torch.nn.Module:
    """``model`` (built on the meta device) with every parameter and buffer replaced by a fake tensor on
    ``device`` of the same shape, dtype and ``requires_grad``; tied weights stay tied."""
    done: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for table, parameter in ((module._parameters, True), (module._buffers, False)):
            for name, t in table.items():
                if t is None:
                    continue
                if id(t) not in done:
                    fake = FakeTensor(mode, t.detach(), torch.device(device))
                    done[id(t)] = torch.nn.Parameter(fake, t.requires_grad) if parameter else fake
                table[name] = done[id(t)]
    return model


def saved_by(run, static: list[torch.Tensor] = ()) -> Counter:
    """What ``run()`` saves for backward, once per storage (``storage_id``), by (dtype, shape), less the storages
    of ``static`` (the weights: saving a weight costs nothing)."""
    seen = {storage_id(t) for t in static}
    saved: Counter = Counter()
    held = []  # each counted storage kept alive, so that no later one is handed its address

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_id(t)
        if key not in seen:
            seen.add(key)
            held.append(t)
            saved[(t.dtype, tuple(t.shape))] += 1
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return saved


def saved_bytes(saved: Counter) -> int:
    return sum(n * torch.Size(shape).numel() * dtype.itemsize for (dtype, shape), n in saved.items())
