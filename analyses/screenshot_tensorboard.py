"""Browser check of ``profkit view``: headless Chromium opens the TensorBoard page it serves and takes a
screenshot of the PyTorch profiler view with a profkit run loaded.

Needs Debian's ``chromium`` (and ``chromium-driver``); without them it exits 3 saying so.
Usage: python analyses/screenshot_tensorboard.py [TRACES_DIR] [-o reports/tiny-cpu/tensorboard_profiler.png]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1600,1000"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def start_view(traces: Path) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "view", str(traces)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line and proc.poll() is not None:
            raise RuntimeError("profkit view exited early")
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        if m:
            return proc, m.group(1)
    raise TimeoutError("profkit view printed no URL")


def wait_for_runs(url: str, timeout_s: float = 180) -> list[str]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        runs = json.loads(urllib.request.urlopen(url + "data/plugin/pytorch_profiler/runs", timeout=30).read())
        if runs["runs"] and not runs["loading"]:
            return runs["runs"]
        time.sleep(1)
    raise TimeoutError("the profiler plugin did not finish loading runs")


def screenshot(traces: Path, out: Path, budget_ms: int = 20000) -> Path:
    browser = chromium()
    if browser is None:
        raise FileNotFoundError("Chromium not found (Debian packages: chromium, chromium-driver)")
    proc, url = start_view(traces)
    try:
        runs = wait_for_runs(url)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as profile:
            # virtual-time-budget lets the page's scripts fetch and draw before the capture.
            subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                            f"--virtual-time-budget={budget_ms}", f"--screenshot={out}", url + "#pytorch_profiler"],
                           check=True, capture_output=True, timeout=180)
        print(f"{out}: TensorBoard at {url}, profiler runs {runs}")
        return out
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="?", type=Path, default=Path("traces"))
    parser.add_argument("-o", "--output", type=Path, default=Path("reports/tiny-cpu/tensorboard_profiler.png"))
    args = parser.parse_args()
    if chromium() is None:
        print("skipped: Chromium is not installed (apt-get install chromium chromium-driver)")
        sys.exit(3)
    screenshot(args.traces, args.output)


if __name__ == "__main__":
    main()
