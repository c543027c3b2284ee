"""One method, recorded in a fresh process (``python -m profkit.worker``), so allocator state and peaks
never leak between methods. The parent (``profkit.runner``) passes the settings, a partial run
directory and a pipe for progress events; this process writes traces and the manifest there and
exits with a code that names the outcome. Library chatter goes to the run's log, not the pipe."""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata
from pathlib import Path

from profkit.methods import get_method
from profkit.settings import RunSettings
from profkit.store import SCHEMA_VERSION, RunDir

EXIT_CODES = {"ok": 0, "failed": 1, "unsupported": 3, "oom": 4, "interrupted": 130}
LIBRARIES = ("torch", "transformers", "peft", "bitsandbytes", "deepspeed", "datasets", "accelerate", "profkit")


def versions() -> dict:
    out = {"python": platform.python_version()}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                              text=True, timeout=5, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def device_info(device: str) -> dict:
    import torch

    info = {"type": device, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "platform": platform.platform()}
    if device == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(name=props.name, total_memory=props.total_memory, cuda=torch.version.cuda,
                    capability=f"{props.major}.{props.minor}")
    else:
        info["name"] = platform.processor() or platform.machine()
    return info


def predict(method, settings: RunSettings, device: str) -> dict:
    """The estimator's prediction for this run, or the reason there is none (it never fails the run)."""
    from profkit.estimate import estimate_run

    try:
        return estimate_run(method, settings, device).to_json()
    except Exception as exc:  # an estimate is advisory: a model it cannot handle still gets recorded
        return {"error": f"{type(exc).__name__}: {exc}"}


def _classify(exc: BaseException) -> str:
    import torch

    from profkit.workload import UnsupportedError

    if isinstance(exc, UnsupportedError):
        return "unsupported"
    if isinstance(exc, (torch.OutOfMemoryError, MemoryError)):
        return "oom"
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    return "failed"


def run(settings: RunSettings, run_dir: RunDir, events) -> str:
    def emit(**event) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    method = get_method(settings.method)
    settings = settings.resolved()
    manifest: dict = {
        "schema_version": SCHEMA_VERSION, "run": method.name, "method": method.name, "kind": method.kind,
        "settings": method.settings(), "run_settings": settings.to_json(), "status": "interrupted",
        "reason": None, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "versions": versions(),
        "git_commit": git_commit(), "pid": os.getpid(),
    }
    emit(event="start", total_steps=settings.total_steps)
    recorder = None
    t0 = time.perf_counter()
    try:
        from profkit.recorder import Recorder
        from profkit.workload import build, resolve_device

        device = resolve_device(settings.device)
        manifest["device"] = device_info(device)
        if method.kind == "train":
            # The prediction is made before the run, so an OOM or failed run still carries it.
            manifest["estimate"] = predict(method, settings, device)
        workload = build(method, settings, device)
        manifest["model"] = {"preset": None if settings.model_path else settings.preset,
                             "path": settings.model_path, "config": workload.model.config.to_diff_dict()}
        recorder = Recorder(run_dir, settings, lambda phase: emit(event="step", phase=phase),
                            {"profkit": {"run": method.name, "method": method.name}})
        recorder.record(workload)
        manifest["status"] = "ok"
    except BaseException as exc:  # every outcome, including Ctrl-C, is recorded with its status
        manifest["status"] = _classify(exc)
        manifest["reason"] = f"{type(exc).__name__}: {exc}".strip()
        if manifest["status"] == "failed":
            traceback.print_exc()
    finally:
        if recorder is not None:
            manifest.update(recorder.results)
        manifest["wall_s"] = time.perf_counter() - t0
        manifest["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        manifest["files"] = sorted(p.name for p in run_dir.path.iterdir() if not p.name.startswith("."))
        run_dir.write_manifest(manifest)
        emit(event="end", status=manifest["status"], reason=manifest["reason"])
    return manifest["status"]


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--settings", required=True, help="RunSettings as JSON")
    parser.add_argument("--events-fd", type=int, default=None, help="file descriptor for progress events")
    args = parser.parse_args(argv)
    # SIGTERM (a scheduler's or the parent's stop) is handled like Ctrl-C: recorded as interrupted.
    signal.signal(signal.SIGTERM, _interrupt)
    events = os.fdopen(args.events_fd, "w") if args.events_fd is not None else open(os.devnull, "w")
    status = run(RunSettings.from_json(json.loads(args.settings)), RunDir(args.run_dir), events)
    return EXIT_CODES[status]


if __name__ == "__main__":
    sys.exit(main())
