"""Library chatter kept out of the user's terminal: native progress lines (Kineto), import-time notices
(bitsandbytes, DeepSpeed's accelerator detection) and deprecation warnings go to a log file, or nowhere."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path


@contextlib.contextmanager
def library_output(log: Path | None = None):
    """Redirect file descriptors 1 and 2 (native code bypasses ``sys.stderr``) and Python warnings into ``log``
    (appended), or discard them when ``log`` is None."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log if log is not None else os.devnull, "ab") as sink, warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sink.write(
                warnings.formatwarning(message, category, filename, lineno, line).encode())
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
