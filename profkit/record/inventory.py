"""An exact inventory of the bytes a training run holds, read from the live objects.

The profiler's memory categories are heuristics over what it saw during profiling; this inventory is
ground truth for static memory: every parameter, buffer, gradient and optimizer-state tensor, counted
once per storage (tied weights and flat buffers are not double counted), by owner, dtype and device.
DeepSpeed's ZeRO optimizers hold their own flat buffers; those are walked and named too.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterator

import torch

from profkit.model.storage import local_tensor, storage_id


def _quant_state_tensors(qs: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Tensors of a bitsandbytes QuantState, including the nested (double-quantization) state."""
    for name in ("absmax", "code", "offset"):
        value = getattr(qs, name, None)
        if isinstance(value, torch.Tensor):
            yield name, value
    nested = getattr(qs, "state2", None)
    if nested is not None:
        for name, value in _quant_state_tensors(nested):
            yield f"state2.{name}", value


def four_bit_weights(model: torch.nn.Module) -> dict[int, Any]:
    """id of each bitsandbytes 4-bit weight -> its QuantState (None if it has none yet). Found by the layers too:
    FSDP replaces a layer's ``Params4bit`` with a plain DTensor shard, and bitsandbytes keeps the state on the
    layer to restore it at each forward."""
    found: dict[int, Any] = {}
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if not isinstance(weight, torch.Tensor):
            continue
        state = getattr(weight, "quant_state", None)
        if state is None and type(module).__module__.startswith("bitsandbytes") and hasattr(module, "quant_state"):
            state = module.quant_state
            found[id(weight)] = state
        elif state is not None or type(weight).__name__ == "Params4bit":
            found[id(weight)] = state
    return found | parametrized_four_bit(model)


def parametrized_four_bit(model: torch.nn.Module) -> dict[int, Any]:
    """id of each parameter bitsandbytes' parametrization stores in 4 bits (a fused expert tensor under
    --quantize-experts, axolotl's quantize_moe_experts) -> its QuantState."""
    found: dict[int, Any] = {}
    for module in model.modules():
        for plist in getattr(module, "parametrizations", {}).values():
            state = next((q.quant_state for q in plist if hasattr(q, "quant_state")), None)
            if state is not None:
                found[id(plist.original)] = state
    return found


class _Tally:
    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.owner_of: dict[tuple[str, int], str] = {}  # storage -> the owner that counted it
        self.tensors: list[torch.Tensor] = []  # one tensor per storage counted
        self.rows: dict[tuple[str, str, str, str], list[int]] = defaultdict(lambda: [0, 0, 0])

    def add(self, owner: str, detail: str, t: torch.Tensor, numel: int | None = None) -> bool:
        """Count ``t``: its elements always, its storage's bytes only the first time that storage is seen
        (ZeRO-2's parameters and gradients are views into one flat buffer). Returns True for new storage."""
        if t.device.type == "meta":
            return False  # shape-only tensors hold no memory
        t = local_tensor(t)
        storage = t.untyped_storage()
        key = storage_id(t)
        row = self.rows[(owner, detail, str(t.dtype).removeprefix("torch."), t.device.type)]
        row[1] += 1
        row[2] += t.numel() if numel is None else numel
        if storage.nbytes() == 0 or key in self.seen:  # (nbytes: a resharded FSDP parameter's is 0)
            return False
        self.seen.add(key)
        self.owner_of[key] = owner
        self.tensors.append(t)
        row[0] += storage.nbytes()
        return True

    def key(self, t: torch.Tensor) -> tuple[str, int]:
        return storage_id(t)

    def as_rows(self) -> list[dict]:
        return [{"owner": o, "detail": d, "dtype": dt, "device": dev, "bytes": b, "tensors": n, "numel": ne}
                for (o, d, dt, dev), (b, n, ne) in sorted(self.rows.items())]


def _param_storage(p: torch.Tensor) -> torch.Tensor:
    # ZeRO-3 replaces a parameter's data with an empty tensor and keeps its partition in ds_tensor.
    ds = getattr(p, "ds_tensor", None)
    return ds if isinstance(ds, torch.Tensor) and p.numel() == 0 else p


def take_inventory(model: torch.nn.Module, optimizer: Any = None, inner_optimizer: Any = None,
                   ddp: Any = None) -> dict:
    """Rows ``{owner, detail, dtype, device, bytes, tensors, numel}`` plus parameter counts.

    Parameter counts are logical element counts (a 4-bit weight counts its unpacked elements), so that
    they compare to the model's configuration; bytes are what storage really holds.
    """
    tally, counts = _count(model, optimizer, inner_optimizer)
    return {"rows": tally.as_rows() + ddp_bucket_rows(ddp), **counts}


def ddp_bucket_rows(ddp: Any) -> list[dict]:
    """DDP's gradient buckets, as its reducer reports them: C++ allocates them when the model is wrapped and keeps
    no Python reference, so no op and no object walk sees them (owner ``ddp_buckets``)."""
    if ddp is None:
        return []
    sizes = ddp_bucket_sizes(ddp)
    device = next((p.device.type for p in ddp.module.parameters()), "cpu")
    return [{"owner": "ddp_buckets", "detail": "DDP reducer buckets (DDP's bucket_sizes)", "dtype": "",
             "device": device, "bytes": sum(sizes), "tensors": len(sizes), "numel": 0}] if sizes else []


def storage_owners(model: torch.nn.Module, optimizer: Any = None,
                   inner_optimizer: Any = None) -> tuple[dict, list[torch.Tensor]]:
    """Each storage the inventory counts (``model.storage.storage_id``) -> its owner, and a tensor of each."""
    tally = _count(model, optimizer, inner_optimizer)[0]
    return tally.owner_of, tally.tensors


def _count(model: torch.nn.Module, optimizer: Any, inner_optimizer: Any) -> tuple[_Tally, dict]:
    tally = _Tally()
    counts = {"trainable_params": 0, "frozen_params": 0, "quantized_params": 0}
    four_bit = four_bit_weights(model)
    for name, p in model.named_parameters():
        data = _param_storage(p)
        if id(p) in four_bit:
            qs = four_bit[id(p)]
            logical = int(torch.Size(qs.shape).numel()) if qs is not None else p.numel()
            tally.add("parameters_quantized", "nf4 weight", data, numel=logical)
            counts["quantized_params"] += logical
            for qname, qt in _quant_state_tensors(qs) if qs is not None else ():
                tally.add("parameters_quantized", f"quant_state.{qname}", qt)
        else:
            owner = "parameters_trainable" if p.requires_grad else "parameters_frozen"
            numel = getattr(p, "ds_numel", p.numel())
            tally.add(owner, "", data, numel=numel)
            counts["trainable_params" if p.requires_grad else "frozen_params"] += numel
    for _, b in model.named_buffers():
        tally.add("buffers", "", b)
    for _, p in model.named_parameters():
        if p.grad is not None:
            tally.add("gradients", "param.grad", p.grad)

    inner = inner_optimizer if inner_optimizer is not None else optimizer
    if inner is not None:
        for state in inner.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor):
                    tally.add("optimizer_state", key, value)
    if optimizer is not None and optimizer is not inner:
        # Skip what the model and the inner optimizer own (DeepSpeed also lists views of them).
        _walk_framework(tally, optimizer, type(optimizer).__name__, 0, frozenset(tally.seen))
    return tally, counts


def _framework_owner(path: str) -> str:
    low = path.lower()
    if "grad" in low or "ipg" in low:
        return "gradients"
    if "fp32" in low:
        return "optimizer_state"  # ZeRO's fp32 master copy of the trainable weights
    return "framework"


def _walk_framework(tally: _Tally, obj: Any, path: str, depth: int, owned: frozenset) -> None:
    """Tensors that a DeepSpeed optimizer holds beyond the model and the inner optimizer's state."""
    if depth > 4:
        return
    if isinstance(obj, torch.Tensor):
        if tally.key(obj) not in owned:
            tally.add(_framework_owner(path), f"deepspeed:{path}", obj)
    elif isinstance(obj, dict):
        for k, v in list(obj.items())[:10_000]:
            _walk_framework(tally, v, f"{path}[{k}]" if not isinstance(k, torch.Tensor) else path, depth + 1, owned)
    elif isinstance(obj, (list, tuple)):
        for v in obj[:10_000]:
            _walk_framework(tally, v, path, depth + 1, owned)
    elif type(obj).__module__.startswith("deepspeed") and hasattr(obj, "__dict__") and not isinstance(obj, torch.nn.Module):
        for k, v in vars(obj).items():
            if k in ("optimizer", "module", "param_names", "_global_grad_norm"):
                continue
            _walk_framework(tally, v, k if depth == 0 else f"{path}.{k}", depth + 1, owned)


def ddp_bucket_sizes(ddp: Any) -> list[int]:
    """The bytes of each of DDP's buckets, from DDP's own logging data (no public API exposes them)."""
    return [int(b) for b in str(ddp._get_ddp_logging_data().get("bucket_sizes", "")).split(",") if b.strip()]
