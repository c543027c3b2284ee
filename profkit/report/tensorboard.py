"""TensorBoard: scalar summaries of the comparison, and a server for ``profkit view``.

Scalars go into each run's own directory, so TensorBoard shows one run per method in both the PyTorch
profiler plugin (which reads the ``*.pt.trace.json.gz`` files there) and the scalars dashboard.
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from profkit.analyze import Breakdown, views
from profkit.core.ports import free_port

SCALAR_SUFFIX = ".profkit"
DEFAULT_PORT = 6006


def write_scalars(bd: Breakdown) -> list[Path]:
    """One event file per recorded run: memory by category (MiB), time by category (ms/step), summary."""
    from torch.utils.tensorboard import SummaryWriter  # heavy: torch, for `view --tensorboard` only

    mem, tim = views.memory_at(bd), views.time_per_step(bd)
    written = []
    for _, r in bd.runs.iterrows():
        if r.get("status") != "ok" or not r.get("recorded_by_profkit"):
            continue
        run_dir = Path(r["path"])
        for old in run_dir.glob(f"events.out.tfevents.*{SCALAR_SUFFIX}"):
            old.unlink()  # replace, do not accumulate, the summaries of earlier views
        writer = SummaryWriter(log_dir=str(run_dir), filename_suffix=SCALAR_SUFFIX)
        run = r["run"]
        if run in mem.index:
            for cat, value in mem.loc[run].items():
                writer.add_scalar(f"memory_MiB/{cat}", float(value) / 2**20, 0)
        if run in tim.index:
            for cat, value in tim.loc[run].dropna().items():
                writer.add_scalar(f"time_ms_per_step/{cat}", float(value) * 1e3, 0)
        for tag, col, scale in (("peak_memory_MiB", "measured_peak_bytes", 2**-20),
                                ("clean_step_time_ms", "clean_step_time_s", 1e3), ("tokens_per_s", "tokens_per_s", 1)):
            if r.get(col) == r.get(col) and r.get(col) is not None:  # not NaN
                writer.add_scalar(f"summary/{tag}", float(r[col]) * scale, 0)
        writer.close()
        written.append(run_dir)
    return written


def start_server(logdir: Path, host: str = "127.0.0.1", port: int | None = None,
                 timeout_s: float = 120) -> tuple[subprocess.Popen, str]:
    """Start TensorBoard on ``logdir`` and wait until it answers; returns the process and its URL."""
    port = port or free_port(host, DEFAULT_PORT)
    proc = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host,
                             "--port", str(port), "--reload_interval", "5"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://{host}:{port}/"
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"TensorBoard exited with code {proc.returncode}: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(url + "data/plugins_listing", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.5)
    proc.terminate()
    raise TimeoutError(f"TensorBoard did not answer on {url} within {timeout_s:.0f} s")
