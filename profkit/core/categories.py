"""The categories profkit decomposes memory into: the vocabulary shared by the estimate (what it predicts) and
the analysis (what it measures). No torch.

``parameters_unsharded``: what FSDP gathers of the sharded parameters for the layers in flight (the shards
themselves are the other parameter categories)."""

MEMORY_CATEGORIES = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "parameters_unsharded",
                     "gradients", "optimizer_state", "kv_cache", "activations", "temporaries", "allocator_overhead",
                     "unattributed")
