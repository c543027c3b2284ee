"""The categories profkit decomposes memory into: the vocabulary shared by the estimate (what it predicts) and
the analysis (what it measures). No torch."""

MEMORY_CATEGORIES = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "gradients",
                     "optimizer_state", "kv_cache", "activations", "temporaries", "allocator_overhead",
                     "unattributed")
