from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from profkit import store
from profkit.analyze import breakdown
from profkit.cli.common import fail_usage
from profkit.report.tensorboard import start_server, write_scalars


def view(
    path: Path = typer.Argument(store.DEFAULT_ROOT, help="A directory of runs (traces/)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; the default serves this machine only."),
    port: Optional[int] = typer.Option(None, help="Port (default 6006, or a free one if taken)."),
) -> None:
    """Open the runs in TensorBoard: the PyTorch profiler plugin plus scalar summaries of the comparison."""
    if not path.is_dir():
        fail_usage(f"{path}: not a directory of runs")
    console = Console(stderr=True)
    bd = breakdown([path])
    written = write_scalars(bd)
    console.print(f"wrote scalar summaries for {len(written)} runs", highlight=False)
    proc, url = start_server(path, host, port)
    console.print(f"TensorBoard: [bold]{url}#pytorch_profiler[/]  (scalars: {url}#scalars)  Ctrl-C to stop",
                  highlight=False)
    snapshots = sorted(store.RunDir(Path(p)).cuda_snapshot for p in bd.runs.get("path", [])
                       if store.RunDir(Path(p)).cuda_snapshot.exists())
    for snap in snapshots:
        console.print(f"CUDA allocator history: open {snap} at https://pytorch.org/memory_viz", highlight=False)
    try:
        proc.wait()
    except KeyboardInterrupt:
        console.print("stopping TensorBoard")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except Exception:
            proc.kill()
