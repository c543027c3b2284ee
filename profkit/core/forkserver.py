"""multiprocessing's one forkserver per process, shared by record's workers and the analysis's parallel workers.

The server imports its preload list once, when it starts; each caller adds the modules its processes need, so
the first to start the server does not leave out what the other would have asked (a breakdown before a record in
one process would otherwise give the record's workers a server without their libraries)."""

from __future__ import annotations

import multiprocessing
import sys

_PRELOAD: list[str] = []


def context(preload: list[str]):
    """The forkserver context, with ``preload`` added to what the server imports when it starts (no effect once
    it runs: a module missing there is imported by the forked process itself). None where there is no forkserver
    to fork from (not Linux)."""
    if sys.platform != "linux":
        return None
    ctx = multiprocessing.get_context("forkserver")
    _PRELOAD.extend(name for name in preload if name not in _PRELOAD)
    ctx.set_forkserver_preload(list(_PRELOAD))
    return ctx
