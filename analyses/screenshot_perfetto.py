"""Browser check of ``profkit view``: headless Chromium (selenium, Debian's chromedriver) opens the offline Perfetto
UI that ``profkit view --run RUN`` serves, waits until the trace's tracks are listed -- profkit's memory-by-owner
counter track among them, which proves the trace loaded in the browser's trace processor -- expands it, and
takes a screenshot. Everything is served from 127.0.0.1; Chromium's background networking is off.

Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package.
Usage: python analyses/screenshot_perfetto.py TRACES_DIR [--run lora] [-o reports/viewer/perfetto.png]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from screenshot_tensorboard import _driver, chromium, start_view, stop  # noqa: E402

TRACK = "profkit: memory by owner"


def screenshot(traces: Path, out: Path, run: str = "lora", timeout_s: float = 120) -> Path:
    from selenium.webdriver.common.by import By

    browser = chromium()
    if browser is None or shutil.which("chromedriver") is None:
        raise FileNotFoundError("Chromium/chromedriver not found (Debian packages: chromium, chromium-driver)")
    proc, url = start_view(traces, "--run", run, "--no-browser")
    driver = None
    try:
        driver = _driver(browser)
        driver.get(url)
        deadline = time.time() + timeout_s
        found = []
        while time.time() < deadline and not found:
            time.sleep(2)
            found = [e for e in driver.find_elements(By.XPATH, f"//*[contains(text(), '{TRACK}')]")]
        if not found:
            raise TimeoutError(f"the Perfetto UI never listed the {TRACK!r} track (still loading?)")
        try:
            found[0].click()  # expand profkit's memory track group
        except Exception:
            pass
        time.sleep(3)
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        print(f"{out}: Perfetto at {url}, run {run}")
        return out
    finally:
        stop(driver, proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path)
    parser.add_argument("--run", default="lora")
    parser.add_argument("-o", "--output", type=Path, default=Path("reports/viewer/perfetto.png"))
    args = parser.parse_args()
    screenshot(args.traces, args.output, args.run)


if __name__ == "__main__":
    main()
