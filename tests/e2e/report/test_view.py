"""``profkit view``: the offline Perfetto UI and its viewer copy of a run's trace, over HTTP, on 127.0.0.1 only;
and ``--tensorboard``: a real TensorBoard, queried through its HTTP API. Both stopped with Ctrl-C."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import psutil

from tests.conftest import terminal_session


def get(url: str):
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())


def test_view_lists_every_run_and_scalars(matrix, tmp_path):
    # Three runs of the matrix (training, 4-bit, generation): TensorBoard's profiler plugin parses every trace it
    # lists, about 1.5 s a run on 2 cores, and three exercise the same listing as twenty.
    shown = ("lora", "qlora", "infer_fp16")
    for run in shown:
        shutil.copytree(matrix / run, tmp_path / run)
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "view", str(tmp_path), "--tensorboard"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_session)
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
            if not runs["loading"] and len(runs["runs"]) == len(shown):
                break
            time.sleep(1)
        assert sorted(runs["runs"]) == sorted(shown)
        assert "Trace" in get(url + "data/plugin/pytorch_profiler/views?run=lora")
        assert sorted(get(url + "data/plugin/pytorch_profiler/workers?run=lora&view=Overview")) == ["memory", "time"]
        tags = get(url + "data/plugin/scalars/tags")
        assert set(shown) <= set(tags)
        assert {"summary/peak_memory_MiB", "memory_MiB/activations", "time_ms_per_step/gemm"} <= set(tags["lora"])
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    # TensorBoard's own workers end just after it: give them a bounded moment, then none may be left.
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not [c for c in alive if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def start_view(*args: str):
    proc = subprocess.Popen([sys.executable, "-m", "profkit", "view", *args, "--no-browser"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=terminal_session)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        assert line or proc.poll() is None, "profkit view exited early: " + proc.stderr.read()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        if m:
            return proc, m.group(1)
    raise AssertionError("no URL printed")


def status_of(url: str) -> int:
    import urllib.error
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def expected_counters(timeline_path, base_ns):
    """The timeline replayed here, independently: bytes live per profiler category after each timestamp."""
    import gzip

    from profkit.analyze.memory import TIMELINE_CATEGORIES
    from profkit.report.viewer import OWNER_GROUPS

    with gzip.open(timeline_path, "rt") as fh:
        rows = sorted(json.load(fh), key=lambda r: r[0])
    live = [0] * len(TIMELINE_CATEGORIES)
    state = {}
    for t, _action, size, category in rows:
        live[category] += size
        state[t] = {name: sum(live[TIMELINE_CATEGORIES.index(c)] for c in cats) for name, cats in OWNER_GROUPS.items()}
    return {round((t - base_ns) / 1e3, 3): v for t, v in state.items() if t > 0}


def test_view_serves_the_offline_perfetto_ui_and_a_trace_with_memory_by_owner(matrix, tmp_path):
    import gzip
    import shutil

    from profkit import store
    from profkit.report.viewer import COUNTER_NAME, MEMORY_PID, PHASES_PID

    runs = tmp_path / "traces"
    shutil.copytree(matrix / "lora", runs / "lora")
    shutil.copytree(matrix / "qlora_gc", runs / "qlora_gc")
    outside = tmp_path / "secret.txt"
    outside.write_text("not a run's file")
    (runs / "lora" / "link").symlink_to(outside)
    before = (runs / "lora" / store.MEMORY_TRACE).read_bytes()
    proc, url = start_view(str(runs), "--run", "lora")
    try:
        listening = [c for c in psutil.Process(proc.pid).net_connections() if c.status == psutil.CONN_LISTEN]
        assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
        with urllib.request.urlopen(url, timeout=30) as response:
            assert "perfetto" in response.read().decode().lower()  # the bundled UI, served from here
        trace = get(url + "localtrace")
        events = trace["traceEvents"]
        counters = [e for e in events if e.get("ph") == "C" and e["pid"] == MEMORY_PID]
        assert counters and all(e["name"] == COUNTER_NAME for e in counters)
        with gzip.open(runs / "lora" / store.MEMORY_TRACE, "rt") as fh:
            base_ns = json.load(fh)["baseTimeNanoseconds"]
        expected = expected_counters(runs / "lora" / store.MEMORY_TIMELINE, base_ns)
        for e in counters:
            want = expected[round(e["ts"], 3)]
            for name, mib in e["args"].items():
                assert abs(mib * 2**20 - want[name]) <= 2, (e["ts"], name)
        phases = {e["name"] for e in events if e.get("pid") == PHASES_PID and e.get("ph") == "X"}
        assert {"forward", "backward", "optimizer"} <= phases
        assert (runs / "lora" / store.MEMORY_TRACE).read_bytes() == before  # the recorded trace is untouched
        picker = urllib.request.urlopen(url + "runs", timeout=30).read().decode()
        assert "lora" in picker and "qlora_gc" in picker and "open?run=qlora_gc" in picker
        assert status_of(url + "files/lora/manifest.json") == 200
        for bad in ("files/lora/link", "files/lora/../qlora_gc/manifest.json", "files/lora/%2e%2e/%2e%2e/secret.txt",
                    "..%2f..%2fsecret.txt", "%2fetc%2fpasswd", "files/nope/manifest.json", str(outside)):
            assert status_of(url + bad) == 404, bad
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "stopped" in err


def test_a_trace_too_large_for_a_tab_is_refused_with_a_trimmed_copy_offered(matrix, tmp_path, monkeypatch):
    from profkit.report import viewer

    runs = viewer.find_view_runs(matrix)
    state = viewer.ViewerState(matrix, runs, "memory")
    state.open("lora", "memory")
    whole = json.loads(state.current.read_text())["traceEvents"]
    monkeypatch.setattr(viewer, "MAX_VIEW_BYTES", state.current.stat().st_size - 1)
    import pytest
    with pytest.raises(viewer.ViewError, match="more than a browser tab holds.*steps=1"):
        state.open("lora", "memory")
    state.open("lora", "memory", last_steps=1)
    trimmed = json.loads(state.current.read_text())["traceEvents"]
    steps = [e for e in trimmed if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("ph") == "X"]
    assert len(steps) == 1 and len(trimmed) < len(whole)
    assert any(e.get("ph") == "C" for e in trimmed)
