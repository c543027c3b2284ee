"""Names that recorded traces carry (``record_function`` labels) and analysis reads back.

Shared by the workload that writes them and the analyzers that read them; no torch import.
"""

DATA = "profkit/data"
FORWARD = "profkit/forward"
BACKWARD = "profkit/backward"
OPTIMIZER = "profkit/optimizer_step"
GENERATE = "profkit/generate"
PREFILL = "profkit/prefill"  # generate(): the prompt's forward pass
DECODE = "profkit/decode"  # generate(): the forward pass of each new token
# Context labels: forward work re-run by gradient checkpointing, and normalization layers (composed of
# elementwise ops in Llama, so their names alone do not say "norm").
RECOMPUTE = "profkit/recompute"
NORM = "profkit/norm"

PHASE_OF_LABEL = {FORWARD: "forward", BACKWARD: "backward", OPTIMIZER: "optimizer", DATA: "data", GENERATE: "generate",
                  PREFILL: "prefill", DECODE: "decode"}
