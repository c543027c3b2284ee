"""Library chatter kept out of the user's terminal: native progress lines (Kineto), import-time notices
(bitsandbytes, DeepSpeed's accelerator detection) and deprecation warnings go to a log file, or nowhere."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path


def _point_output_at(fd: int) -> None:
    """File descriptors 1 and 2 (native code writes there, bypassing ``sys.stderr``) onto ``fd``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def redirect_output(path: Path) -> None:
    """This process's stdout and stderr, native code included, appended to ``path`` from now on."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    _point_output_at(fd)
    os.close(fd)


@contextlib.contextmanager
def library_output(log: Path | None = None):
    """Redirect file descriptors 1 and 2 (native code bypasses ``sys.stderr``) and Python warnings into ``log``
    (appended), or discard them when ``log`` is None."""
    saved = [os.dup(1), os.dup(2)]
    try:
        with open(log if log is not None else os.devnull, "ab") as sink, warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: sink.write(
                warnings.formatwarning(message, category, filename, lineno, line).encode())
            _point_output_at(sink.fileno())
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
