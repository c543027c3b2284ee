"""The first screen of a report as a reader sees it: headless Chromium opens report.html in a 1280x800 window
and saves what is visible, so one can check that the at-a-glance table and the answers are there without
scrolling. Needs Debian's chromium; nothing is fetched (the report's images are inline).

    python analyses/screenshot_report.py reports/tiny-cpu -o reports/tiny-cpu/first_screen.png
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

WINDOW = (1280, 800)


def screenshot(report_dir: Path, out: Path, window: tuple[int, int] = WINDOW) -> Path:
    html = (report_dir / "report.html").resolve()
    if not html.is_file():
        raise SystemExit(f"{html}: no report.html here (write one with `profkit report RUNS -o {report_dir}`)")
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("Chromium is not installed (Debian package chromium)")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="profkit-chromium-") as profile:
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
             f"--window-size={window[0]},{window[1]}", f"--screenshot={out.resolve()}", html.as_uri()],
            capture_output=True, text=True, timeout=120)
    if done.returncode != 0 or not out.is_file():
        raise SystemExit(f"Chromium could not take the screenshot (exit {done.returncode}): {done.stderr[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report_dir", type=Path, help="A directory written by `profkit report`.")
    parser.add_argument("-o", "--output", type=Path, help="PNG to write (default: REPORT_DIR/first_screen.png).")
    args = parser.parse_args(argv)
    print(screenshot(args.report_dir, args.output or args.report_dir / "first_screen.png"))


if __name__ == "__main__":
    sys.exit(main())
