"""A free TCP port on this machine (torch.distributed's rendezvous, TensorBoard's server)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1", preferred: int = 0) -> int:
    """``preferred`` if it is free, else any free port the system gives."""
    for port in dict.fromkeys((preferred, 0)):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise OSError(f"no free port on {host}")
