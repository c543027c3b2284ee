"""The exit codes of every profkit command and of the recording worker: one table."""

from __future__ import annotations

from enum import IntEnum


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # a run failed or ran out of memory; an input could not be analysed; nothing fits a budget
    USAGE = 2  # bad arguments: the message says which and lists the valid values
    UNSUPPORTED = 3  # a method cannot run on this device (the others were recorded)
    INTERRUPTED = 130  # Ctrl-C or SIGTERM (128 + SIGINT, as shells report it)


def for_status(status: str) -> Exit:
    """A run's status as a process exit code."""
    return {"ok": Exit.OK, "unsupported": Exit.UNSUPPORTED, "interrupted": Exit.INTERRUPTED}.get(status, Exit.FAILED)
