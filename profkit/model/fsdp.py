"""PyTorch FSDP2 as profkit runs it: ``fully_shard`` on each decoder layer, then on the whole model, whose own unit
holds what is left (embeddings, final norm, LM head), as torchtune and accelerate wrap. Each unit's parameters are
sharded on dim 0 across the ranks (DTensors) and gathered whole for the unit's forward and backward.

A mixed precision is FSDP's ``MixedPrecisionPolicy`` (torchtitan's and torchtune's way): the gathered parameters
in the half dtype, gradients reduced in fp32, the sharded parameters and the optimizer in their own dtype; no
autocast. CPU offload is ``CPUOffloadPolicy``: shards, gradients and the optimizer step on the host.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from profkit.core.methods import Method
from profkit.model.build import decoder_layers


def mixed_precision(param_dtype: torch.dtype | None) -> MixedPrecisionPolicy:
    """``param_dtype``: the gathered parameters' dtype (None: their own); gradients are reduced in fp32."""
    if param_dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)


def shard(model: torch.nn.Module, method: Method, param_dtype: torch.dtype | None, device: str) -> torch.nn.Module:
    """``model`` sharded in place across the process group's ranks (which must exist)."""
    world = torch.distributed.get_world_size()
    mesh = init_device_mesh(device, (world,))
    policy = CPUOffloadPolicy() if method.offload != "none" else OffloadPolicy()
    common = {"mesh": mesh, "mp_policy": mixed_precision(param_dtype), "offload_policy": policy}
    layers = decoder_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__}: no decoder layers for FSDP to wrap one by one")
    for layer in layers:
        fully_shard(layer, reshard_after_forward=method.reshard_after_forward, **common)
    # The root's unit: FSDP's default keeps it gathered from forward to backward (backward starts with it).
    fully_shard(model, **common)
    return model


def trainer_fsdp_arguments(method: Method, model: torch.nn.Module) -> dict:
    """``TrainingArguments``' FSDP settings as a Trainer user writes them for FSDP2 (accelerate's plugin wraps the
    decoder layers by class, as ``shard`` does)."""
    layers = sorted({type(m).__name__ for m in decoder_layers(model)})
    return {"fsdp": True, "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": layers,
                                          "reshard_after_forward": method.reshard_after_forward,
                                          "cpu_offload": method.offload != "none"}}
