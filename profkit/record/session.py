"""The profiler lifecycle for one run, driven by the caller's training loop: ``profkit record``'s own loop, the
Hugging Face callback and a user's hand-written loop all step the same ``Session``.

The session walks the phase schedule (``phase_schedule``: warm-up, timed steps, the time cycle, the memory cycle),
running each phase's work (``cuda_allocator``, ``timed_steps``, ``profiler_cycles``, ``memory_cycle``) with the
phase labels (``phase_labels``) installed for the profiling cycles. It owns the run's outcome and directory.

The run is written under a temporary name beside ``path`` and renamed into place when the session closes;
a session that stops early is ``incomplete``, one that ends in an exception ``failed`` (``oom`` for an
out-of-memory error, ``interrupted`` for Ctrl-C), each with what it captured.
"""

from __future__ import annotations

import atexit
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from profkit import store
from profkit.core.quiet import library_output
from profkit.record import describe
from profkit.record.cuda_allocator import OomSnapshot, WarmupHistory
from profkit.record.environment import agree_on, device_info, device_of, world
from profkit.record.generation import Generation
from profkit.record.memory_cycle import MemoryCycle, export_memory_timeline  # noqa: F401 (imported from here)
from profkit.record.outcome import classify, unhandled_exception
from profkit.record.phase_labels import PhaseLabels
from profkit.record.phase_schedule import DONE, PhaseSchedule, PhaseWork
from profkit.record.profiler_cycles import TimeCycle
from profkit.record.step_inputs import StepInputs
from profkit.record.timed_steps import TimedSteps
from profkit.store.manifest import RunRecord, new_record, now

Progress = Callable[[str], None]  # called with the phase name after every step
# What the estimate predicts for the live setup: (model, run record, (batch, sequence) seen, world size, device)
# -> the estimate's JSON, or {"error": reason}. Passed in by the caller: recording does not depend on predicting.
Predict = Callable[[Any, RunRecord, tuple[int, int], int, str], dict]

_OPEN: "weakref.ref[Session] | None" = None  # the session open in this process, if any


class Session:
    """Record one run of the caller's training loop into ``path`` (a run directory, as ``profkit record``
    writes). Call ``step()`` once per optimizer step; use as a context manager or call ``close()``."""

    def __init__(self, path: str | Path, model: Any, optimizer: Any = None, *, warmup_steps: int = 2,
                 timed_steps: int = 5, profiled_steps: int = 2, memory_steps: int = 1,
                 progress: Progress | None = None, tokens_per_step: int | None = None,
                 engine: str = "session", record: RunRecord | None = None, commit: bool = True,
                 predict: Predict | None = None):
        self.schedule = PhaseSchedule(warmup_steps, timed_steps, profiled_steps, memory_steps)
        path = Path(path)
        if commit:
            store.check_target(path)
        self.parts = describe.unwrap(model, optimizer)
        if not isinstance(self.parts.model, torch.nn.Module):
            raise TypeError(f"Session(model=...): an nn.Module or a DeepSpeed engine, not {type(model).__name__}")
        self.target = self.path = path
        self._commit = commit
        self.root = path.parent if str(path.parent) else Path(".")
        self.run_dir: store.RunDir | None = None  # made at start(), so a session refused there leaves nothing
        self.progress = progress or (lambda phase: None)
        self.tokens_per_step = tokens_per_step
        self.device = device_of(self.parts.model)
        self.cuda = self.device == "cuda"
        self.inference = (self.parts.optimizer is None
                          and not any(p.requires_grad for p in self.parts.model.parameters()))
        self._generation = Generation(self._sync) if self.inference else None
        self.record = self._found_in(record, engine)
        self._started = self._closed = False
        self._inputs = StepInputs()
        self._work = PhaseWork()  # what runs in the current phase
        self._labels = PhaseLabels(self.parts, self.inference, self._take_inventory_if_due)
        self._t0 = time.perf_counter()
        self._oom_snapshot: OomSnapshot | None = None
        self._finalizer = None
        self._world: tuple[int, int] | None = None  # (rank, world size) under torch.distributed, from start()
        self._predict = predict

    def _found_in(self, record: RunRecord | None, engine: str) -> RunRecord:
        """The run's record, with what the live objects say the method is; for a user's run this is the method,
        for profkit's own runs it is kept beside the registry's settings as a check."""
        found = describe.method_of(self.parts, inference=self.inference)
        if record is None:
            record = new_record(self.target.name, found.name, found.kind, found.settings(), engine,
                                model=describe.model_info(self.parts))
        record.model["found"] = {"method": found.name, **found.settings()}
        if self.parts.ddp is not None:
            record.model["found"]["data_parallel"] = True
        record.device = record.device or device_info(self.device)
        return record

    # ------------------------------------------------------------------ public

    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(exc)
        return False  # the user's exception goes on

    @property
    def phase(self) -> str | None:
        return self.schedule.phase

    @property
    def plan(self) -> dict[str, int]:
        return self.schedule.plan

    @property
    def done(self) -> bool:
        return self.schedule.done

    @property
    def total_steps(self) -> int:
        return self.schedule.total_steps

    @property
    def status(self) -> str:
        return self.record.status

    def start(self) -> None:
        if self._started:
            return
        global _OPEN
        other = _OPEN() if _OPEN is not None else None
        if other is not None and not other._closed and other is not self:
            # Kineto is one per process: a second profiler started beside the first crashes the interpreter.
            raise RuntimeError(f"another profkit Session is open in this process (recording into {other.target}); "
                               "torch.profiler runs one profiler per process: close that session first")
        _OPEN = weakref.ref(self)
        self._started = True
        self._world = world()
        if self._world is not None:
            self.record.rank, self.record.world_size = self._world
        self.run_dir = self._make_run_dir()
        self.path = self.run_dir.path
        self._inputs.attach(self.parts.model, "cuda" if self.cuda else "cpu", self._forward_done)
        if self.cuda:
            self._oom_snapshot = OomSnapshot(self.run_dir.oom_snapshot)
            self._oom_snapshot.start()
        # A process that ends with the session open (an exception escaping a Trainer, sys.exit) still
        # leaves the run marked, never looking complete.
        ref = weakref.ref(self)
        self._finalizer = lambda: (lambda s: s and not s._closed and s.close(unhandled_exception()))(ref())
        atexit.register(self._finalizer)
        self._enter(self.schedule.begin())

    def step(self) -> None:
        """Call once at the end of every training step (after the optimizer step)."""
        if not self._started:
            self.start()
        if self.done or self._closed:
            return
        phase = self.phase
        self._labels.close_data()
        self._work.measure(self._inputs.tokens_now, self._inputs.last_loss)
        self._inputs.next_step()
        last = self.schedule.count_step()
        self._work.step(last)
        self.progress(phase)
        if last:
            self._work.finish()
            self._work.stop()
            self.record.phases_done.append(phase)
            self._enter(self.schedule.next_phase())
        elif self._labels.active:
            self._labels.open_data()

    def close(self, exc: BaseException | None = None) -> Path:
        """End the session: stop what is running, write the manifest, move the run into place."""
        if self._closed:
            return self.path
        self._closed = True
        if not self._started:  # never started: nothing was recorded or written
            return self.path
        if self._oom_snapshot is not None:
            self._oom_snapshot.stop()
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
        rec = self.record
        self._set_outcome(exc)
        try:
            self._work.stop()
        except Exception as failure:  # never let saving what was captured hide the run's own outcome
            if rec.status == "ok":
                rec.status = "failed"
            rec.reason = ((rec.reason + "; ") if rec.reason else "") + \
                f"saving the profile failed: {type(failure).__name__}: {failure}"
        finally:
            self._labels.remove()
            self._inputs.remove()
            if rec.estimate is None and rec.kind == "train":
                self._add_estimate()
            self._write_record()
        self._commit_run()
        return self.path

    # ------------------------------------------------------------------ phases

    def _enter(self, phase: str) -> None:
        if phase == DONE:
            self._work = PhaseWork()
            self._labels.remove()
            return
        self._work = self._work_for(phase)
        self._work.start()

    def _work_for(self, phase: str) -> PhaseWork:
        if phase == "warmup":
            return WarmupHistory() if self.cuda else PhaseWork()
        if phase == "timed":
            return TimedSteps(self._sync, self.record, self._generation, self.tokens_per_step)
        cycle = dict(run_dir=self.run_dir, labels=self._labels, record=self.record, cuda=self.cuda,
                     steps=self.plan[phase])
        if phase == "time_profile":
            return TimeCycle(**cycle)
        return MemoryCycle(parts=self.parts, generation=self._generation, **cycle)

    def _take_inventory_if_due(self) -> None:
        """At an optimizer step: in the memory cycle's last step, the inventory (gradients live, before the step)."""
        if self.phase == "memory_profile" and self.schedule.on_last_step():
            self._work.take_inventory()

    def _forward_done(self, output) -> None:
        if self._generation is not None:
            self._generation.forward_done(output, timed=self.phase == "timed")

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    # ------------------------------------------------------------------ the run

    def _make_run_dir(self) -> store.RunDir:
        if self._commit and self._world is not None:
            # Every rank of the user's job records its share into one run: rank 0 names the partial directory.
            run_dir = store.RunDir(agree_on(store.new_partial(self.root, self.target.name).path
                                            if self._world[0] == 0 else None)).rank(self._world[0])
            run_dir.path.mkdir(parents=True, exist_ok=True)
            return run_dir
        if self._commit:
            return store.new_partial(self.root, self.target.name)
        # the caller made ``path`` as a partial directory and commits it (profkit record's worker)
        self.target.mkdir(parents=True, exist_ok=True)
        return store.RunDir(self.target)

    def _set_outcome(self, exc: BaseException | None) -> None:
        rec = self.record
        if exc is not None:
            rec.status, rec.reason = classify(exc), f"{type(exc).__name__}: {exc}".strip()
        elif self.done:
            rec.status, rec.reason = "ok", None
        else:
            rec.status = "incomplete"
            rec.reason = (f"the session was closed after {self.schedule.steps} of the {self.total_steps} steps it "
                          f"needs (in phase {self.phase}); train for at least {self.total_steps} steps, or lower the "
                          f"Session's step counts")

    def _add_estimate(self) -> None:
        """The caller's prediction for this setup (the method read from the live objects, the batch the forward
        saw), so that ``breakdown`` sets it beside the measurement; None without a predictor."""
        found = self.record.model["found"]
        if self._inputs.input_shape is not None:
            precision = describe.precision_of(self.parts.model, self._inputs.autocast)
            found["precision"] = precision or "auto"  # auto: the estimate names its guess
        if (grad_accum := self._inputs.grad_accum()) is not None:
            found["grad_accum"] = grad_accum
        with library_output(self.run_dir.profiler_log):  # the estimator imports peft and bitsandbytes, which chatter
            self.record.estimate = self._estimate()

    def _estimate(self) -> dict | None:
        if self._predict is None:
            return None
        if self._inputs.input_shape is None:
            return {"error": "no estimate: no token batch was seen"}
        world_size = self._world[1] if self._world is not None else 1
        try:
            return self._predict(self.parts.model, self.record, self._inputs.input_shape, world_size, self.device)
        except Exception as exc:  # an estimate is advisory: it never fails a run
            return {"error": f"no estimate: {type(exc).__name__}: {exc}"}

    def _write_record(self) -> None:
        rec = self.record
        rec.finished_at = now()
        rec.wall_s = time.perf_counter() - self._t0
        rec.files = self.run_dir.files()
        try:
            self.run_dir.write_manifest(rec.to_json())
        except OSError as unwritten:  # a full disk: the run failed, whatever it measured, and says why
            rec.status = "failed"
            rec.reason = ((rec.reason + "; ") if rec.reason else "") + \
                f"writing the manifest failed: {type(unwritten).__name__}: {unwritten}"
            raise

    def _commit_run(self) -> None:
        rec = self.record
        if self._commit and self._world is not None:
            # The last rank to finish assembles the run's record and commits it; a rank that never finishes
            # leaves the run under its partial name, never looking complete.
            run = store.RunDir(self.run_dir.path.parent)
            template = RunRecord.from_json({**rec.to_json(), "rank": None, "inventory": None, "files": []})
            committed = store.finish_rank(run, self._world[0], self._world[1], template, self.root, self.target.name)
            self.path = committed.path if committed else self.run_dir.path
        elif self._commit:
            self.path = store.commit(self.run_dir, self.root, self.target.name).path
