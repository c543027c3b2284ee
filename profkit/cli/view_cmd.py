from __future__ import annotations

import shutil
import webbrowser
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape

from profkit import store
from profkit.analyze import breakdown
from profkit.cli.common import fail_usage
from profkit.report.viewer import CYCLES, ViewError, ViewerState, find_view_runs, make_server


def view(
    path: Path = typer.Argument(store.DEFAULT_ROOT, help="A run, or a directory of runs (traces/)."),
    run: Optional[str] = typer.Option(None, help="Open this run (default: a page that lists every run)."),
    cycle: str = typer.Option("memory", help="memory: the memory cycle's trace, with counter tracks of memory by "
                                              "owner; time: the time cycle's trace."),
    steps: Optional[int] = typer.Option(None, min=1, help="Only the last N profiled steps (for large traces)."),
    no_browser: bool = typer.Option(False, "--no-browser", help="Only print the URL."),
    port: Optional[int] = typer.Option(None, help="Port on 127.0.0.1 (default: a free one)."),
    tensorboard: bool = typer.Option(False, "--tensorboard", help="TensorBoard instead: the PyTorch profiler plugin "
                                                                  "(needs internet for its charts) and scalars."),
) -> None:
    """Open runs in the Perfetto UI, offline and on this machine only, with memory by owner beside the operators."""
    if not path.exists():
        fail_usage(f"{path}: no such run or directory of runs")
    if tensorboard:
        _tensorboard(path, port)
        return
    if cycle not in CYCLES:
        fail_usage(f"unknown cycle {cycle!r}; valid: {', '.join(CYCLES)}")
    runs = find_view_runs(path)
    if not runs:
        fail_usage(f"{path}: no profkit runs here")
    console = Console(stderr=True)
    state = ViewerState(path, runs, cycle)
    if run is not None:
        try:
            state.open(run, cycle, steps)
        except ViewError as exc:
            fail_usage(str(exc))
    server = make_server(state, port or 0)
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    console.print(f"profkit view: [bold]{url}[/]  (runs: {url}runs)  Ctrl-C to stop", highlight=False)
    if not no_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        console.print("stopped", highlight=False)
    finally:
        server.server_close()
        shutil.rmtree(state.tmp, ignore_errors=True)


def _tensorboard(path: Path, port: Optional[int]) -> None:
    from profkit.report.tensorboard import start_server, write_scalars  # heavy: torch's TensorBoard writer

    if not path.is_dir():
        fail_usage(f"{path}: not a directory of runs")
    console = Console(stderr=True)
    bd = breakdown([path])
    written = write_scalars(bd)
    console.print(f"wrote scalar summaries for {len(written)} runs", highlight=False)
    proc, url = start_server(path, "127.0.0.1", port)
    console.print(f"TensorBoard: [bold]{url}#pytorch_profiler[/]  (scalars: {url}#scalars)  Ctrl-C to stop; its "
                  "profiler panel loads Google Charts from the internet", highlight=False)
    for snap in sorted(store.RunDir(Path(p)).cuda_snapshot for p in bd.runs.get("path", [])
                       if store.RunDir(Path(p)).cuda_snapshot.exists()):
        console.print(f"CUDA allocator history: {escape(str(snap))} (`profkit snapshot` reads it)", highlight=False)
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
