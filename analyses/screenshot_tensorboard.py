"""Browser check of ``profkit view``: headless Chromium (driven by selenium through Debian's chromedriver)
opens the TensorBoard page it serves, selects a profkit run, its Trace view and its time worker in the
PyTorch profiler plugin, and takes a screenshot; then one of the Scalars dashboard with profkit's summaries.

Offline caveat: the plugin's page loads Google Charts from www.gstatic.com before it draws any view, so on
a machine without internet its panel stays a spinner (run, view and worker selectors are live); the
Scalars dashboard is TensorBoard's own and renders offline.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package; without them it exits 3.
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
import time
import urllib.request
from pathlib import Path

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars", "--window-size=1600,1000"]


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def _terminal_session() -> None:
    """A session of its own with SIGINT at its default: started from a background job, SIGINT would be
    inherited as ignored and the Ctrl-C that stops ``profkit view`` would never arrive."""
    os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_view(traces: Path, *args: str) -> tuple[subprocess.Popen, str]:
    """``profkit view TRACES ARGS`` (default here: ``--tensorboard``), and the URL it prints."""
    args = args or ("--tensorboard",)
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "view", str(traces), *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_terminal_session)
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


def warm(url: str, run: str) -> None:  # noqa: D103
    """Ask the plugin for the views the page opens first, so it draws them instead of a spinner."""
    get = lambda ep: json.loads(urllib.request.urlopen(url + "data/plugin/pytorch_profiler/" + ep, timeout=300).read())
    for worker in get(f"workers?run={run}&view=Overview"):
        for span in get(f"spans?run={run}&worker={worker}") or [""]:
            get(f"overview?run={run}&worker={worker}&span={span}")


def _driver(browser: str):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in CHROMIUM_FLAGS:
        opts.add_argument(flag)
    opts.binary_location = browser
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)


def _choose(driver, index: int, label: str) -> None:
    from selenium.webdriver.common.by import By

    driver.find_elements(By.CSS_SELECTOR, "[aria-haspopup=listbox]")[index].click()
    time.sleep(1)
    for option in driver.find_elements(By.CSS_SELECTOR, "[role=option]"):
        if option.get_attribute("innerText").strip() == label:
            option.click()
            time.sleep(2)
            return
    raise LookupError(f"no option {label!r} in selector {index}")


def screenshot(traces: Path, out: Path, run: str = "lora", settle_s: float = 15) -> list[Path]:
    from selenium.webdriver.common.by import By

    browser = chromium()
    if browser is None or shutil.which("chromedriver") is None:
        raise FileNotFoundError("Chromium/chromedriver not found (Debian packages: chromium, chromium-driver)")
    proc, url = start_view(traces)
    driver = None
    try:
        runs = wait_for_runs(url)
        run = run if run in runs else sorted(runs)[0]
        warm(url, run)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver = _driver(browser)
        driver.get(url + "#pytorch_profiler")
        time.sleep(settle_s)
        driver.switch_to.frame(driver.find_elements(By.TAG_NAME, "iframe")[0])
        _choose(driver, 0, run)
        _choose(driver, 1, "Trace")
        _choose(driver, 2, "time")
        time.sleep(settle_s)
        driver.save_screenshot(str(out))
        scalars = out.with_name(out.stem.replace("profiler", "scalars") + out.suffix)
        driver.switch_to.default_content()
        driver.get(url + "#scalars&runSelectionState=" + "")
        time.sleep(settle_s)
        driver.save_screenshot(str(scalars))
        print(f"{out}, {scalars}: TensorBoard at {url}, profiler runs {runs}")
        return [out, scalars]
    finally:
        stop(driver, proc)


def stop(driver, proc: subprocess.Popen) -> None:
    """Close the browser, then stop ``profkit view`` with Ctrl-C as a user would."""
    if driver is not None:
        driver.quit()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", nargs="?", type=Path, default=Path("traces"))
    parser.add_argument("-o", "--output", type=Path, default=Path("reports/tiny-cpu/tensorboard_profiler.png"))
    args = parser.parse_args()
    try:
        import selenium  # noqa: F401
    except ImportError:
        print("skipped: selenium is not installed (pip install selenium)")
        sys.exit(3)
    if chromium() is None or shutil.which("chromedriver") is None:
        print("skipped: Chromium is not installed (apt-get install chromium chromium-driver)")
        sys.exit(3)
    screenshot(args.traces, args.output)


if __name__ == "__main__":
    main()
