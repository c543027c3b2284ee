"""Gradient accumulation: from the second micro-batch on, the summed gradients are alive through forward and
backward."""

from __future__ import annotations

from profkit.core.methods import Method
from profkit.core.units import human_bytes
from profkit.predict.memory.contribution import Contribution


def accumulation(method: Method, accumulated: int, fsdp=None) -> Contribution:
    """``accumulated``: the bytes each micro-batch's gradients sum into without FSDP; ``fsdp``: FSDP's step
    (``memory.fsdp.FsdpStep``), whose gradients are the shards, or whole until the last micro-batch under no_sync."""
    unsynced = fsdp is not None and method.grad_sync == "last"
    held = (fsdp.unsharded_gradients if unsynced else fsdp.gradients) if fsdp else accumulated
    part = Contribution(detail={"accumulated_gradients": held})
    if method.zero_stage != 3:  # ZeRO-3's partition is counted at every instant already
        part.add("gradients", held, held)
    where = ("" if not (fsdp or method.zero_stage) else
             f", unsharded until the last micro-batch reduces them (--grad-sync last: no_sync, as accelerate "
             f"and Lightning accumulate; reduced into the shards each micro-batch, --grad-sync each, "
             f"{human_bytes(fsdp.gradients)})" if unsynced else
             f", each micro-batch's reduced into the shards (--grad-sync each, as torchtitan and torchtune "
             f"accumulate; held unsharded until the last, --grad-sync last as accelerate's no_sync, "
             f"{human_bytes(fsdp.unsharded_gradients)})" if fsdp else
             " (ZeRO-3 keeps its gradient partition at every instant in any case)" if method.zero_stage == 3 else
             ", each micro-batch's reduced into ZeRO's partition")
    part.notes.append(f"gradient accumulation over {method.grad_accum} micro-batches: from the second on, the summed "
                      f"gradients ({human_bytes(held)} per rank on the device) are alive through forward and "
                      f"backward{where}")
    return part
