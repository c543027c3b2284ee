"""Where a session runs: the device a model is on, what that device is, and the ranks of torch.distributed."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import torch.distributed as dist


def device_of(model: torch.nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"


def world() -> tuple[int, int] | None:
    """(rank, world size) under torch.distributed with more than one rank, else None."""

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None


def agree_on(path: Path | None) -> Path:
    """Rank 0's ``path``, on every rank (a collective: every rank starts its session at its first step)."""

    box = [str(path) if path is not None else None]
    dist.broadcast_object_list(box, src=0)
    return Path(box[0])


def device_info(device: str) -> dict:
    info = {"type": device, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform()}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        info.update(name=props.name, total_memory=props.total_memory, cuda=torch.version.cuda,
                    capability=f"{props.major}.{props.minor}")
    else:
        info["name"] = platform.processor() or platform.machine()
    return info
