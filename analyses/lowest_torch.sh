#!/usr/bin/env bash
# The lowest torch profkit declares (pyproject: torch>=2.11, the GPU check's machine's), tested on CPU: a fresh
# venv with PyPI's torch 2.11.0 (its CUDA build, which runs on a CPU), the project over it, then the test suite
# (or the tests named as arguments). The output goes to reports/compat/torch-2.11.0.txt; what the runs found is
# written up in reports/compat/torch-2.11.0.md. CI tests the Makefile's torch, the highest (2.15.0); this
# run is the documented check of the lowest, too long to run twice in CI.
#
# Usage: bash analyses/lowest_torch.sh [pytest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH=2.11.0
VENV="${LOWEST_VENV:-${TMPDIR:-/tmp}/profkit-torch-$TORCH}"
if [ ! -x "$VENV/bin/profkit" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --upgrade pip setuptools wheel
    "$VENV/bin/pip" install --quiet "torch==$TORCH"
    "$VENV/bin/pip" install --quiet --no-build-isolation "deepspeed>=0.19.8,<0.20"
    "$VENV/bin/pip" install --quiet -e ".[dev]" "torch==$TORCH"
fi
OUT=reports/compat/torch-$TORCH.txt
mkdir -p "$(dirname "$OUT")"
{
    echo "# profkit's test suite on torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'), $(date -u +%Y-%m-%d)"
    "$VENV/bin/python" -m pip list --format=freeze 2>/dev/null | grep -iE '^(torch|transformers|peft|bitsandbytes|deepspeed|accelerate|datasets)=='
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider --tb=line -W ignore "$@" 2>&1 | tail -n 60
} | tee "$OUT"
