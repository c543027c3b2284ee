"""How a run ended, as a status: what an exception means for the run it ended."""

from __future__ import annotations

import sys

import torch

from profkit.core.methods import UnsupportedError


# torch's CPU allocator reports a failed allocation as a plain RuntimeError (c10's alloc_cpu), not as
# torch.OutOfMemoryError as the CUDA allocator does: its messages are all that tell the two apart (one per
# allocation path: posix_memalign's error, and a null pointer).
CPU_ALLOCATOR_FAILURES = ("DefaultCPUAllocator: can't allocate memory", "DefaultCPUAllocator: not enough memory")


def classify(exc: BaseException) -> str:
    """The status a run that ended in ``exc`` gets."""
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    if isinstance(exc, RuntimeError) and any(message in str(exc) for message in CPU_ALLOCATOR_FAILURES):
        return "oom"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, UnsupportedError):
        return "unsupported"
    return "failed"


class ProcessEnded(Exception):
    pass


def unhandled_exception() -> BaseException:
    """At exit with a session still open: the exception that ended the process, if Python kept it."""
    exc = getattr(sys, "last_value", None) or getattr(sys, "last_exc", None)
    return exc if isinstance(exc, BaseException) else ProcessEnded(
        "the process ended with the session still open (an exception in the training loop, or sys.exit)")
