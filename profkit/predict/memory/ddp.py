"""DDP: an unsharded method on several ranks holds a whole replica per rank, and the reducer's buckets."""

from __future__ import annotations

from profkit.core.units import human_bytes
from profkit.predict.memory.contribution import Contribution


def ddp(trainable: list, world_size: int) -> Contribution:
    """The buckets are flat copies of the trainable gradients it all-reduces, allocated when the model is wrapped and
    kept (torch's default gradient_as_bucket_view=False copies each gradient in and back out)."""
    buckets = sum(p.numel() * p.element_size() for p in trainable)
    note = (f"DDP over {world_size} ranks: each rank holds the whole model, and DDP's gradient buckets, a second copy "
            f"of the trainable gradients ({human_bytes(buckets)}), from the wrap on; gradient_as_bucket_view=True "
            "makes the gradients views into the buckets and saves that copy")
    return Contribution(detail={"ddp_gradient_buckets": buckets}, notes=[note]).throughout("gradients", buckets)
