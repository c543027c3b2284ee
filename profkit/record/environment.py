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


def scheduler_times() -> dict[str, tuple[int, int]] | None:
    """Per thread of this process: (ns it ran on a CPU, ns it was ready to run but waited for a CPU), from
    Linux's ``/proc/self/task/*/schedstat``; None where the kernel does not expose them. The wait is what
    another process competing for the cores costs a step, measured rather than inferred from step times."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    times = {}
    for tid in os.listdir(tasks):
        try:
            ran, waited, _ = (tasks / tid / "schedstat").read_text().split()
            times[tid] = (int(ran), int(waited))
        except (OSError, ValueError):  # a thread that ended meanwhile, or a kernel without schedstat
            continue
    return times or None


def cpu_wait_share(before: dict | None, after: dict | None) -> float | None:
    """The share of the time this process's threads were ready to run that they spent waiting for a CPU,
    between two ``scheduler_times()`` readings (a thread started meanwhile counts from zero; one that ended
    is lost with its counts, which only lowers the share)."""
    if not before or not after:
        return None
    ran = waited = 0
    for tid, (r, w) in after.items():
        r0, w0 = before.get(tid, (0, 0))
        ran, waited = ran + r - r0, waited + w - w0
    return waited / (ran + waited) if ran + waited > 0 else None
