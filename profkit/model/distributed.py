"""The process group a sharded method runs in: torchrun's ranks when it launched us (its environment wins), else a
group of one on a free local port, so a sharded method also runs as a single process."""

from __future__ import annotations

import os
from typing import Callable

import torch.distributed as dist

from profkit.core.ports import free_port


def backend_for(device: str) -> str:
    return "nccl" if device == "cuda" else "gloo"


def init_process_group(device: str, initialize: Callable[..., None] | None = None) -> None:
    """``initialize(backend)``: how the framework wants its group made (DeepSpeed's ``init_distributed``);
    torch's ``init_process_group`` by default."""
    if dist.is_initialized():
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    if initialize is not None:
        initialize(backend_for(device))
    else:
        dist.init_process_group(backend=backend_for(device))


def backend_missing(device: str) -> str | None:
    """Why this torch build cannot make the process group for ``device``, or None."""
    backend = backend_for(device)
    available = dist.is_available() and (dist.is_nccl_available() if backend == "nccl" else dist.is_gloo_available())
    return None if available else f"the torch.distributed {backend} backend, which this torch build lacks"
