"""``profkit view``: a real TensorBoard, queried through its HTTP API, stopped with Ctrl-C."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import psutil

from profkit.methods import METHODS
from tests.conftest import terminal_session


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_view_lists_every_method_and_scalars(matrix):
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "view", str(matrix)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=terminal_session)
    try:
        url = None
        deadline = time.time() + 180
        while url is None and time.time() < deadline:
            line = proc.stderr.readline()
            assert line or proc.poll() is None, "profkit view exited early"
            m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
            url = m.group(1) if m else None
        assert url, "no URL printed"
        children = psutil.Process(proc.pid).children(recursive=True)
        while time.time() < deadline:
            runs = get(url + "data/plugin/pytorch_profiler/runs")
            if not runs["loading"] and len(runs["runs"]) == len(METHODS):
                break
            time.sleep(1)
        assert sorted(runs["runs"]) == sorted(METHODS)
        assert "Trace" in get(url + "data/plugin/pytorch_profiler/views?run=lora")
        assert sorted(get(url + "data/plugin/pytorch_profiler/workers?run=lora&view=Overview")) == ["memory", "time"]
        tags = get(url + "data/plugin/scalars/tags")
        assert set(METHODS) <= set(tags)
        assert {"summary/peak_memory_MiB", "memory_MiB/activations", "time_ms_per_step/gemm"} <= set(tags["lora"])
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
