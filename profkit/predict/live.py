"""The estimate for a setup found on live objects (a user's loop or Trainer, recorded through ``profkit.Session``):
the method as the session read it from the model and optimizer, the model's own config, the batch its forward saw.
The session calls it through the hook it is given; recording itself does not depend on predicting."""

from __future__ import annotations

from typing import Any

from profkit.core.methods import Method
from profkit.predict.estimate import estimate
from profkit.store.manifest import RunRecord

# Method fields a live setup can fill (the rest keep the registry's defaults).
_FIELDS = frozenset(Method.__dataclass_fields__) - {"name", "kind", "description", "variant"}


def estimate_live(model: Any, record: RunRecord, input_shape: tuple[int, int], world_size: int, device: str) -> dict:
    """The estimate's JSON for the live setup, or ``{"error": reason}`` for one the estimator does not model."""
    config = getattr(model, "config", None)
    if config is None:
        return {"error": "no estimate: not a Hugging Face model with a config"}
    found = record.model.get("found", {})
    if found.get("quantization") not in (None, "nf4", "fp4"):
        return {"error": f"no estimate: the estimator models NF4, not {found.get('quantization')}"}
    fields = {k: v for k, v in found.items() if k in _FIELDS}
    fields["lora_targets"] = tuple(fields.get("lora_targets") or ())
    method = Method(**{**fields, "name": found.get("method", "custom"), "kind": "train",
                       "description": "found on the live objects"})
    batch, seq = input_shape
    # Ranks matter where they shard the method, or where DDP replicates it (its buckets): a script that runs
    # unsharded ranks without DDP holds what one process does.
    world = world_size if method.sharded or found.get("data_parallel") else 1
    return estimate(method, config, batch, seq, world, "cuda" if device == "cuda" else "cpu", type(config).__name__,
                    "trainer" if record.engine == "trainer" else "session").to_json()
