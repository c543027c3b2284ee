#!/usr/bin/env bash
# Regenerate the committed report of the method matrix on the `tiny` preset on this machine's CPU:
# record every method into traces/ (not committed), write reports/tiny-cpu/, and, where Chromium is
# installed, screenshots of the report's first screen (1280x800) and of the TensorBoard profiler view. Run from the repository root after `make setup`.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
$BIN/profkit record --all --preset tiny --device cpu -o traces
$BIN/profkit report traces -o reports/tiny-cpu
$BIN/python analyses/screenshot_report.py reports/tiny-cpu -o reports/tiny-cpu/first_screen.png || \
  echo "(no screenshot of the report: see above)"
$BIN/python analyses/screenshot_tensorboard.py traces -o reports/tiny-cpu/tensorboard_profiler.png || \
  echo "(no screenshot: see above)"
