"""One method, recorded in a process of its own (``python -m profkit.launch.worker``, or a fork of the preloaded
server: ``profkit.launch.forking``), so allocator state and peaks never leak between methods. The parent (``profkit.launch.runner``) passes the settings, a partial run
directory and a pipe for progress events; this process builds the workload, steps a ``profkit.Session``
over it, and exits with a code that names the outcome. Library chatter goes to the run's log, not the pipe."""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import sys
import traceback
from pathlib import Path

from profkit.core.exitcodes import for_status
from profkit.core.quiet import redirect_output
from profkit.core.settings import RunSettings
from profkit.store import RunDir
from profkit.store.manifest import RunRecord, now, record_for


def predict(method, settings: RunSettings, device: str, device_name: str | None = None) -> dict:
    """The estimator's prediction for this run (one rank's share), or the reason there is none (it never fails
    the run). On a GPU in profkit's table, training's step time on it too (``step_time``), so that the
    breakdown sets each category's predicted time beside the measured one."""
    try:
        # heavy (torch, transformers, peft): imported in the worker only, where its failure is the run's outcome
        from profkit.predict.estimate import estimate_run

        out = estimate_run(method, settings, device, settings.nproc).to_json()
    except Exception as exc:  # an estimate is advisory: a model it cannot handle still gets recorded
        return {"error": f"{type(exc).__name__}: {exc}"}
    if device.startswith("cuda") and method.kind == "train":
        out["step_time"] = _predict_step_time(method, settings, device_name or "")
    return out


def _predict_step_time(method, settings: RunSettings, device_name: str) -> dict:
    try:
        # with the estimate above: the same meta-device model, in the worker only
        from profkit.core.gpus import UnknownGpu, find
        from profkit.predict.step_time import predict_run

        try:
            gpu = find(device_name)
        except UnknownGpu:
            return {"error": f"the device {device_name!r} is not in profkit's GPU table"}
        return predict_run(method, settings, gpu, settings.nproc).to_json()
    except Exception as exc:  # advisory, as the memory estimate
        return {"error": f"{type(exc).__name__}: {exc}"}


def run(settings: RunSettings, run_dir: RunDir, events, rank: int | None = None) -> str:
    def emit(**event) -> None:
        events.write(json.dumps(event) + "\n")
        events.flush()

    method = settings.method_spec()
    settings = settings.resolved()
    record = record_for(settings, world_size=settings.nproc, rank=rank)
    for part in (run_dir.path, run_dir.path.parent):  # rep<k>/ or rep<k>/rank<j>/: one repetition of a run
        if part.name.startswith("rep") and part.name[3:].isdigit():
            record.repetition = int(part.name[3:])
    emit(event="start", total_steps=settings.total_steps, pid=os.getpid())
    sessions: list = []
    try:
        # Inside the try: a library that fails to import (torch, transformers, peft...) is this run's recorded
        # failure, not a worker that dies without a manifest.
        from profkit.launch.workload import build
        from profkit.model.build import resolve_device
        from profkit.record import describe
        from profkit.record.environment import device_info
        from profkit.record.session import Session

        device = resolve_device(settings.device)
        record.device = device_info(device)
        if settings.memory_limit_bytes:  # a smaller GPU emulated (the GPU check's fit part)
            from profkit.record.cuda_allocator import limit_allocator  # heavy: torch, as the imports above

            record.device["memory_limit_bytes"] = settings.memory_limit_bytes
            record.device["memory_fraction"] = limit_allocator(device, settings.memory_limit_bytes)
        # The prediction is made before the run, so an OOM or failed run still carries it.
        record.estimate = predict(method, settings, device, record.device.get("name"))
        record.model = {"preset": None if settings.model_path else settings.preset, "path": settings.model_path}
        workload = build(method, settings, device)

        def make_session(model, optimizer) -> Session:
            record.model.update(describe.model_info(describe.unwrap(model, optimizer)))
            sessions.append(Session(run_dir.path, model, optimizer, warmup_steps=settings.warmup_steps,
                                    timed_steps=settings.timed_steps, profiled_steps=settings.profiled_steps,
                                    memory_steps=settings.memory_steps, tokens_per_step=workload.tokens_per_step,
                                    progress=lambda phase: emit(event="step", phase=phase), record=record,
                                    commit=False))
            return sessions[-1]

        workload.run(make_session)
        if not sessions:
            raise RuntimeError(f"the {settings.engine} engine ended without starting a profiling session")
        sessions[-1].close()  # the Trainer closes it at the end of training; a no-op then
    except BaseException as exc:  # every outcome, including Ctrl-C, is recorded with its status
        from profkit.record.outcome import classify  # heavy (torch): see the imports above

        if sessions:
            sessions[-1].close(exc)  # a no-op if it was closed already
        else:  # failed before a session started: nothing has written the record yet
            record.status, record.reason = classify(exc), f"{type(exc).__name__}: {exc}".strip()
            _write(record, run_dir)
        if record.status == "failed":
            traceback.print_exc()
    finally:
        emit(event="end", status=record.status, reason=record.reason)
    return record.status


def _write(record: RunRecord, run_dir: RunDir) -> None:
    record.finished_at = now()
    record.files = run_dir.files()
    try:
        run_dir.write_manifest(record.to_json())
    except OSError as unwritten:  # a full disk: the end event carries why there is no manifest
        record.status = "failed"
        record.reason = f"{record.reason}; writing the manifest failed: {type(unwritten).__name__}: {unwritten}"
        raise


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--settings", required=True, help="RunSettings as JSON")
    parser.add_argument("--events", type=Path, default=None, help="file that receives progress events (JSON lines)")
    args = parser.parse_args(argv)
    # SIGTERM (a scheduler's, the parent's or torchrun's stop) is handled like Ctrl-C: recorded as interrupted.
    signal.signal(signal.SIGTERM, _interrupt)
    settings = RunSettings.from_json(json.loads(args.settings))
    run_dir, rank = RunDir(args.run_dir), None
    if settings.nproc > 1:  # one of torchrun's ranks: its own directory and log inside the run
        rank = int(os.environ["RANK"])
        run_dir = run_dir.rank(rank)
        run_dir.path.mkdir(parents=True, exist_ok=True)
        redirect_output(run_dir.log)  # each rank its own log: the ranks' output would interleave
    # A crash in native code (SIGSEGV, SIGABRT...) leaves the Python stack that led to it in the log.
    faulthandler.enable()
    events = open(args.events, "a") if args.events is not None and not rank else open(os.devnull, "w")
    with events:
        status = run(settings, run_dir, events, rank)
    return for_status(status)


def forked_main(argv: list[str], log: str, environ: dict[str, str], cwd: str) -> None:
    """``main`` in a process forked from the preloaded server (``profkit.launch.forking``): the parent's
    environment and working directory as they were when it asked, output appended to the run's log, exit code
    as ``main``'s."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    redirect_output(Path(log))
    sys.exit(main(argv))


if __name__ == "__main__":
    sys.exit(main())
