"""Runs that do not complete: unsupported, interrupted, killed. None may look complete, and none may
replace a complete run."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from profkit import store
from tests.conftest import FAST, run_cli, terminal_session

LONG = ["--preset", "micro", "--device", "cpu", "--warmup-steps", "1", "--steps", "100000"]


def start_record(out: Path, *args: str) -> subprocess.Popen:
    # Ctrl-C reaches the CLI and its worker together, as in a terminal.
    return subprocess.Popen([sys.executable, "-m", "profkit", "record", *args, "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_session)


def wait_for_worker_steps(out: Path, proc: subprocess.Popen, timeout: float = 300) -> psutil.Process:
    """Wait until the worker is in its timed steps (the model is built and stepping); the worker, by the pid its
    first event gives (a child of the command's, or of the server it forks workers from)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()
        partial = list(out.glob(".lora.partial-*"))
        events = partial[0] / ".events" if partial else None
        started = [line for line in events.read_text().split("\n")[:-1] if '"start"' in line] if events else []
        if started and (partial[0] / store.LOG).exists() and "profiler" not in (partial[0] / store.LOG).read_text():
            time.sleep(8)  # model build, warm-up; the timed phase runs 100000 steps
            return psutil.Process(json.loads(started[0])["pid"])
        time.sleep(0.5)
    raise AssertionError("worker never started")


def test_cuda_requested_without_gpu_is_unsupported(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so --device cuda is supported here")
    # One method: the refusal is the worker's, before any method's own work (a second adds only its start-up).
    result = run_cli("record", "qlora", *FAST[:2], "--device", "cuda", "-o", str(tmp_path))
    assert result.returncode == 3, result.stderr
    for name in ("qlora",):
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert manifest["status"] == "unsupported"
        assert "CUDA" in manifest["reason"]
        assert "timings" not in manifest or not manifest["timings"]


def test_int4_inference_on_layer_sizes_the_cpu_kernel_cannot_pack(tmp_path):
    """bitsandbytes' CPU 4-bit inference kernel (used on CPUs with AVX512-BF16) packs 32 output
    features at a time; a model with an MLP width of 176 cannot run there. Also exercises --model."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from profkit.core.presets import get_preset
    from profkit.core.settings import RunSettings
    from profkit.launch.workload import tokenizer_for

    ckpt = tmp_path / "odd-model"
    cfg = {**get_preset("micro").config, "intermediate_size": 176}
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).save_pretrained(ckpt)
    tokenizer_for(RunSettings(method="")).save_pretrained(ckpt)
    result = run_cli("record", "infer_int4", "--model", str(ckpt), *FAST[2:], "-o", str(tmp_path / "traces"))
    manifest = json.loads((tmp_path / "traces" / "infer_int4" / "manifest.json").read_text())
    assert manifest["model"]["path"] == str(ckpt.resolve())  # recorded before the build, so unsupported runs too
    cpu_kernel = bnb.nn.Linear4bit(64, 176, quant_type="nf4").support_avx512bf16_for_cpu
    if cpu_kernel and not torch.cuda.is_available():
        assert result.returncode == 3, result.stderr
        assert manifest["status"] == "unsupported"
        assert "multiple of 32" in manifest["reason"] and "176" in manifest["reason"]
    else:
        assert result.returncode == 0, result.stderr
        assert manifest["status"] == "ok"


@pytest.mark.e2e  # starts the CLI through a helper
def test_interrupt_marks_run_interrupted(tmp_path):
    out = tmp_path / "traces"
    proc = start_record(out, "lora", *LONG)
    wait_for_worker_steps(out, proc)
    os.killpg(proc.pid, signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    manifest = json.loads((out / "lora" / "manifest.json").read_text())
    assert manifest["status"] == "interrupted"
    assert "memory_profile" not in manifest.get("phases_done", [])
    assert not store.is_complete(out / "lora")
    assert not list(out.glob(".lora.partial-*"))


def test_interrupt_never_replaces_a_complete_run(tmp_path, matrix):
    out = tmp_path / "traces"
    shutil.copytree(matrix / "lora", out / "lora")
    before = (out / "lora" / "manifest.json").read_text()
    proc = start_record(out, "lora", *LONG)
    wait_for_worker_steps(out, proc)
    os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert (out / "lora" / "manifest.json").read_text() == before  # the complete run is untouched
    attempts = list((out / store.ATTEMPTS_DIR).iterdir())
    assert len(attempts) == 1 and attempts[0].name.endswith("-interrupted")
    assert json.loads((attempts[0] / "manifest.json").read_text())["status"] == "interrupted"


@pytest.mark.e2e  # starts the CLI through a helper
@pytest.mark.parametrize("sig", [signal.SIGKILL, pytest.param(signal.SIGSEGV, marks=pytest.mark.long)])  # the OOM killer's; a crash in native code
def test_killed_worker_is_recorded_as_failed(tmp_path, sig):
    out = tmp_path / "traces"
    proc = start_record(out, "lora", *LONG)
    worker = wait_for_worker_steps(out, proc)
    worker.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1
    manifest = json.loads((out / "lora" / "manifest.json").read_text())
    assert manifest["status"] == "failed" and sig.name in manifest["reason"]
    if sig == signal.SIGSEGV:  # the worker's fault handler left the Python stack it crashed in
        log = (out / "lora" / store.LOG).read_text()
        assert "Fatal Python error: Segmentation fault" in log and 'File "' in log, log[-2000:]
    assert not store.is_complete(out / "lora")
