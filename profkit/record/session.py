"""The profiler lifecycle for one run, driven by the caller's training loop: the only place in profkit that
drives torch.profiler and the CUDA allocator history. ``profkit record``'s own loop, the Hugging Face
callback and a user's hand-written loop all step the same ``Session``.

Phases, in order, each a number of calls to ``step()`` (memory instrumentation distorts timing, so time and
memory get separate cycles):

1. warm-up steps (caches, lazy allocations, DeepSpeed buckets);
2. timed steps with no profiler and no instrumentation: clean step time, tokens/s, loss;
3. the time cycle: CPU (+CUDA) activities, shapes and FLOPs, one warm-up then N active steps;
4. the memory cycle: ``profile_memory`` with shapes and stacks (which the memory timeline needs), the CUDA
   allocator history where there is a GPU, and the exact inventory taken between backward and the
   optimizer step of the last step;
5. done: ``step()`` returns at once and every hook is removed.

During the two profiling cycles the phases are labelled without the user annotating anything: the model's
forward (module hooks), backward (``torch.autograd.backward``, which ``Tensor.backward``, DeepSpeed and
accelerate all call), the optimizer step (torch's step hooks, or DeepSpeed's ``step``), data loading (from
``step()`` to the next forward), gradient-checkpointing recompute (the checkpointed function when it runs
again inside autograd's backward) and normalization layers. The user's own ``record_function`` labels are
kept.

The run is written under a temporary name beside ``path`` and renamed into place when the session closes;
a session that stops early is ``incomplete``, one that ends in an exception ``failed`` (``oom`` for an
out-of-memory error, ``interrupted`` for Ctrl-C), each with what it captured.
"""

from __future__ import annotations

import atexit
import json
import resource
import statistics
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import psutil
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, schedule

from profkit import store
from profkit.core.quiet import library_output
from profkit.record import describe
from profkit.record.environment import agree_on, cpu_wait_share, device_info, device_of, scheduler_times, world
from profkit.record.generation import Generation
from profkit.record.inventory import take_inventory
from profkit.record.outcome import classify, unhandled_exception
from profkit.record.phases import PhaseLabels
from profkit.record.storages import MemoryCycleFollower
from profkit.store.manifest import RunRecord, new_record, now

Progress = Callable[[str], None]  # called with the phase name after every step
# What the estimate predicts for the live setup: (model, run record, (batch, sequence) seen, world size, device)
# -> the estimate's JSON, or {"error": reason}. Passed in by the caller: recording does not depend on predicting.
Predict = Callable[[Any, RunRecord, tuple[int, int], int, str], dict]

# Enough allocator events for several steps of a 3B model; older events are dropped first.
CUDA_HISTORY_MAX_ENTRIES = 200_000
# torch's memory-timeline export grows faster than the profiler events it analyses (micro generating on CPU,
# torch 2.15: 67k events 3.4 s, 254k 16.5 s, 504k 48 s); on an H100 an inference memory cycle of the gpu-check
# preset (128 tokens generated) ran it for over 6 minutes without an end. Training cycles of that preset hold
# ~100k. Past this many the export, a second opinion beside the storage lifetimes, is not run.
MEMORY_TIMELINE_MAX_EVENTS = 300_000
PHASES = ("warmup", "timed", "time_profile", "memory_profile")


_OPEN: "weakref.ref[Session] | None" = None  # the session open in this process, if any


class Session:
    """Record one run of the caller's training loop into ``path`` (a run directory, as ``profkit record``
    writes). Call ``step()`` once per optimizer step; use as a context manager or call ``close()``."""

    def __init__(self, path: str | Path, model: Any, optimizer: Any = None, *, warmup_steps: int = 2,
                 timed_steps: int = 5, profiled_steps: int = 2, memory_steps: int = 1,
                 progress: Progress | None = None, tokens_per_step: int | None = None,
                 engine: str = "session", record: RunRecord | None = None, commit: bool = True,
                 predict: Predict | None = None):
        for name, value in (("warmup_steps", warmup_steps), ("timed_steps", timed_steps),
                            ("profiled_steps", profiled_steps), ("memory_steps", memory_steps)):
            if not isinstance(value, int) or value < (0 if name == "warmup_steps" else 1):
                raise ValueError(f"Session({name}={value!r}): a whole number, at least "
                                 f"{0 if name == 'warmup_steps' else 1}")
        path = Path(path)
        if commit:
            store.check_target(path)
        self.parts = describe.unwrap(model, optimizer)
        if not isinstance(self.parts.model, torch.nn.Module):
            raise TypeError(f"Session(model=...): an nn.Module or a DeepSpeed engine, not {type(model).__name__}")
        self.target = path
        self._commit = commit
        self.root = path.parent if str(path.parent) else Path(".")
        self.run_dir: store.RunDir | None = None  # made at start(), so a session refused there leaves nothing
        self.path = path
        self.plan = dict(zip(PHASES, (warmup_steps, timed_steps, 1 + profiled_steps, 1 + memory_steps)))
        self.progress = progress or (lambda phase: None)
        self.tokens_per_step = tokens_per_step
        self.device = device_of(self.parts.model)
        self.cuda = self.device == "cuda"
        # What the live objects say the method is; for a user's run this is the method, for profkit's own
        # runs it is kept beside the registry's settings as a check.
        inference = self.parts.optimizer is None and not any(p.requires_grad for p in self.parts.model.parameters())
        self.inference = inference
        self._generation = Generation(self._sync) if inference else None
        found = describe.method_of(self.parts, inference=inference)
        if record is None:
            record = new_record(path.name, found.name, found.kind, found.settings(), engine,
                                model=describe.model_info(self.parts))
        record.model["found"] = {"method": found.name, **found.settings()}
        if self.parts.ddp is not None:
            record.model["found"]["data_parallel"] = True
        self.record = record
        self.record.device = self.record.device or device_info(self.device)
        self.phase: str | None = None
        self._in_phase = 0
        self._started = False
        self._closed = False
        self._mark = 0.0
        self._times: list[float] = []
        self._losses: list[float] = []
        self._tokens: list[int] = []
        self._tokens_now = 0
        # Training forwards between two optimizer steps (a loop's gradient accumulation), per step.
        self._forwards: list[int] = []
        self._forwards_now = 0
        self._last_loss = None
        self._input_shape: tuple | None = None
        self._autocast = None  # the autocast dtype the model's first forward ran under
        self._prof: profile | None = None
        self._labels = PhaseLabels(self)
        self._t0 = time.perf_counter()
        self._always: list = []
        self._finalizer = None
        self._world: tuple[int, int] | None = None  # (rank, world size) under torch.distributed, from start()
        self._lifetimes: MemoryCycleFollower | None = None
        self._predict = predict
        self._scheduler: dict | None = None  # the threads' scheduler times when the current phase began

    # ------------------------------------------------------------------ public

    def __enter__(self) -> "Session":
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close(exc)
        return False  # the user's exception goes on

    @property
    def done(self) -> bool:
        return self.phase == "done"

    @property
    def total_steps(self) -> int:
        return sum(self.plan.values())

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
        if self._commit and self._world is not None:
            # Every rank of the user's job records its share into one run: rank 0 names the partial directory.
            self.run_dir = store.RunDir(agree_on(store.new_partial(self.root, self.target.name).path
                                                  if self._world[0] == 0 else None)).rank(self._world[0])
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
        elif self._commit:
            self.run_dir = store.new_partial(self.root, self.target.name)
        else:  # the caller made ``path`` as a partial directory and commits it (profkit record's worker)
            self.target.mkdir(parents=True, exist_ok=True)
            self.run_dir = store.RunDir(self.target)
        self.path = self.run_dir.path
        self._always = [self.parts.model.register_forward_pre_hook(self._count_inputs, with_kwargs=True),
                        self.parts.model.register_forward_hook(self._keep_loss)]
        if self.cuda:
            self._attach_oom_observer()
        # A process that ends with the session open (an exception escaping a Trainer, sys.exit) still
        # leaves the run marked, never looking complete.
        ref = weakref.ref(self)
        self._finalizer = lambda: (lambda s: s and not s._closed and s.close(unhandled_exception()))(ref())
        atexit.register(self._finalizer)
        self._enter_next(0)

    def step(self) -> None:
        """Call once at the end of every training step (after the optimizer step)."""
        if not self._started:
            self.start()
        if self.phase == "done" or self._closed:
            return
        phase = self.phase
        self._labels.close_data()
        if phase == "timed":
            self._sync()
            now_s = time.perf_counter()
            if self._generation is not None:
                self._generation.step_done(self._mark)
            self._times.append(now_s - self._mark)
            self._mark = now_s
            self._tokens.append(self._tokens_now)
            if self._last_loss is not None:
                self._losses.append(float(self._last_loss.float().item()))
        self._tokens_now = 0
        if self._forwards_now:
            self._forwards.append(self._forwards_now)
        self._forwards_now = 0
        self._last_loss = None
        self._in_phase += 1
        last = self._in_phase == self.plan[phase]
        if phase == "memory_profile" and self._in_phase == 1:
            self._stop_following()  # the profiler's warm-up step is done
        if phase == "memory_profile" and last and self.record.inventory is None:
            self._take_inventory()  # no optimizer step was seen: take it now
        if self._prof is not None:
            with self._native_output():
                self._prof.step()
        self.progress(phase)
        if last:
            self._finish_phase(phase)
            self._enter_next(PHASES.index(phase) + 1)
        elif self._labels.active:
            self._labels.open_data()

    def close(self, exc: BaseException | None = None) -> Path:
        """End the session: stop what is running, write the manifest, move the run into place."""
        if self._closed:
            return self.path
        if not self._started:  # never started: nothing was recorded or written
            self._closed = True
            return self.path
        self._closed = True
        if self._finalizer is not None:
            atexit.unregister(self._finalizer)
        rec = self.record
        if exc is not None:
            rec.status, rec.reason = classify(exc), f"{type(exc).__name__}: {exc}".strip()
        elif self.phase == "done":
            rec.status, rec.reason = "ok", None
        else:
            rec.status = "incomplete"
            done = sum(self.plan[p] for p in PHASES[:PHASES.index(self.phase)]) + self._in_phase if self.phase else 0
            rec.reason = (f"the session was closed after {done} of the {self.total_steps} steps it needs "
                          f"(in phase {self.phase}); train for at least {self.total_steps} steps, or lower the "
                          f"Session's step counts")
        try:
            self._stop_profiler()
            if self.phase == "memory_profile":
                self._end_memory_cycle()
            elif self.phase == "warmup" and self.cuda:
                torch.cuda.memory._record_memory_history(enabled=None)
        except Exception as failure:  # never let saving what was captured hide the run's own outcome
            if rec.status == "ok":
                rec.status = "failed"
            rec.reason = ((rec.reason + "; ") if rec.reason else "") + \
                f"saving the profile failed: {type(failure).__name__}: {failure}"
        finally:
            self._labels.remove()
            for h in self._always:
                h.remove()
            if rec.estimate is None and rec.kind == "train":
                if self._input_shape is not None:
                    precision = describe.precision_of(self.parts.model, self._autocast)
                    rec.model["found"]["precision"] = precision or "auto"  # auto: the estimate names its guess
                if self._forwards:  # micro-batches a step: a loop's gradient accumulation, counted, not asked
                    rec.model["found"]["grad_accum"] = max(1, int(statistics.median(self._forwards)))
                with self._native_output():  # the estimator imports peft and bitsandbytes, which chatter
                    rec.estimate = self._estimate()
            self._write_record()
        if self._commit and self._world is not None:
            # The last rank to finish assembles the run's record and commits it; a rank that never finishes
            # leaves the run under its partial name, never looking complete.
            run = store.RunDir(self.run_dir.path.parent)
            template = RunRecord.from_json({**rec.to_json(), "rank": None, "inventory": None, "files": []})
            committed = store.finish_rank(run, self._world[0], self._world[1], template, self.root, self.target.name)
            self.path = committed.path if committed else self.run_dir.path
        elif self._commit:
            self.path = store.commit(self.run_dir, self.root, self.target.name).path
        return self.path

    # ------------------------------------------------------------------ phases

    def _enter_next(self, index: int) -> None:
        while index < len(PHASES) and self.plan[PHASES[index]] == 0:
            index += 1
        if index == len(PHASES):
            self.phase = "done"
            self._labels.remove()
            return
        self.phase, self._in_phase = PHASES[index], 0
        if self.phase == "warmup" and self.cuda:
            # The allocator's history through the warm-up steps (not timed), so that an OOM in the first steps,
            # where a batch too large fails, dumps a snapshot holding the failed request and the allocations that
            # led to it (on an H100 the GPU check's OOM snapshot had neither: it failed before the memory cycle).
            torch.cuda.memory._record_memory_history(max_entries=CUDA_HISTORY_MAX_ENTRIES)
        elif self.phase == "timed":
            self._sync()
            self._scheduler = scheduler_times()
            self._mark = time.perf_counter()
        elif self.phase == "time_profile":
            self._scheduler = scheduler_times()
            self._labels.install()
            self._prof = self._profile(self.plan["time_profile"] - 1, self.run_dir.time_trace,
                                       record_shapes=True, with_flops=True)
            with self._native_output():
                self._prof.start()
            self._labels.open_data()
        elif self.phase == "memory_profile":
            self._start_memory_cycle()

    def _finish_phase(self, phase: str) -> None:
        if phase == "warmup" and self.cuda:
            torch.cuda.memory._record_memory_history(enabled=None)  # and cleared: the memory cycle starts afresh
        elif phase == "timed":
            self._store_timings()
        elif phase in ("time_profile", "memory_profile"):
            if phase == "time_profile" and self.record.timings:
                # Before the profiler writes its trace: the profiled steps' own waits only.
                self.record.timings["profiled_cpu_wait_share"] = cpu_wait_share(self._scheduler, scheduler_times())
            self._stop_profiler()
            if phase == "memory_profile":
                self._end_memory_cycle()
        self.record.phases_done.append(phase)

    def _store_timings(self) -> None:
        median = statistics.median(self._times)
        tokens = self.tokens_per_step or (int(statistics.median(self._tokens)) if self._tokens else 0)
        self.record.timings = {"step_times_s": self._times, "step_time_s": median, "tokens_per_step": tokens,
                               "tokens_per_s": tokens / median if median > 0 else None, "losses": self._losses,
                               "cpu_wait_share": cpu_wait_share(self._scheduler, scheduler_times())}
        if self._generation is not None:
            self.record.timings.update(self._generation.timings(median))

    def _start_memory_cycle(self) -> None:
        peaks = self.record.peaks
        if self.cuda:
            peaks["cuda_max_allocated_before_memory_cycle"] = torch.cuda.max_memory_allocated()
            peaks["cuda_max_reserved_before_memory_cycle"] = torch.cuda.max_memory_reserved()
            torch.cuda.reset_peak_memory_stats()
            torch.cuda.memory._record_memory_history(max_entries=CUDA_HISTORY_MAX_ENTRIES)
        run_dir, device = self.run_dir, (f"cuda:{torch.cuda.current_device()}" if self.cuda else "cpu")

        def on_ready(p: profile) -> None:
            p.export_chrome_trace(str(run_dir.memory_trace))
            error = export_memory_timeline(p, run_dir.memory_timeline, device)
            if error:
                self.record.timings["memory_timeline_error"] = error

        self._labels.install()
        self._prof = self._profile(self.plan["memory_profile"] - 1, None, profile_memory=True,
                                   record_shapes=True, with_stack=True)
        self._prof.on_trace_ready = on_ready
        with self._native_output():
            self._prof.start()
        # Storages are followed in the profiler's warm-up step, the cycle's first: the profiler records nothing
        # then, so the tracker's Python calls stay out of the memory trace. Followed in the recorded step, they
        # made 90% of its events (micro, 3 methods: traces 3.9-7.4x larger, recording 54 s instead of 34 s).
        p = self.parts
        self._lifetimes = MemoryCycleFollower(p.model, p.optimizer, p.inner_optimizer, lambda: self._labels.now)
        self._labels.open_data()

    def _stop_following(self) -> None:
        follower, self._lifetimes = self._lifetimes, None
        if follower is not None:
            follower.stop(self.run_dir.storage_lifetimes)

    def _end_memory_cycle(self) -> None:
        peaks = self.record.peaks
        self._stop_following()  # a session closed inside the warm-up step
        if self.cuda:
            try:
                torch.cuda.memory._dump_snapshot(str(self.run_dir.cuda_snapshot))
            finally:
                torch.cuda.memory._record_memory_history(enabled=None)
            peaks["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
            peaks["cuda_max_reserved"] = torch.cuda.max_memory_reserved()
        peaks["process_rss_peak"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        peaks["process_rss"] = psutil.Process().memory_info().rss

    def _stop_profiler(self) -> None:
        prof, self._prof = self._prof, None
        if prof is not None:
            self._labels.close_data()
            with self._native_output():
                prof.stop()  # mid-cycle, this still exports what was captured

    def _estimate(self) -> dict | None:
        """The caller's prediction for this setup (the method read from the live objects, the batch the forward
        saw), so that ``breakdown`` sets it beside the measurement; None without a predictor."""
        if self._predict is None:
            return None
        if self._input_shape is None:
            return {"error": "no estimate: no token batch was seen"}
        world = self._world[1] if self._world is not None else 1
        try:
            return self._predict(self.parts.model, self.record, self._input_shape, world, self.device)
        except Exception as exc:  # an estimate is advisory: it never fails a run
            return {"error": f"no estimate: {type(exc).__name__}: {exc}"}

    def _take_inventory(self) -> None:
        p = self.parts
        self.record.inventory = take_inventory(p.model, p.optimizer, p.inner_optimizer, p.ddp)
        if self._generation is not None:
            self.record.inventory.update(self._generation.inventory())

    def _inventory_due(self) -> bool:
        return (self.phase == "memory_profile" and self._in_phase == self.plan["memory_profile"] - 1
                and self.record.inventory is None)

    # ------------------------------------------------------------------ helpers

    def _count_inputs(self, module, args, kwargs) -> None:
        if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            ids = kwargs.get("input_ids") if kwargs else None
            if ids is None:
                ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
                self._tokens_now += ids.numel()
                self._forwards_now += 1
                if self._input_shape is None and ids.dim() == 2:
                    self._input_shape = tuple(ids.shape)  # (batch, sequence): what the estimate needs
                    # Autocast as the forward runs (inside a DeepSpeed engine: as the engine left it): with the
                    # weights' dtypes, the precision the estimate takes (a user loop on an H100 loaded fp32 weights
                    # under bf16 autocast; taken for bf16 weights, its peak was estimated 25% low).
                    kind = "cuda" if self.cuda else "cpu"
                    self._autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None

    def _keep_loss(self, module, args, output) -> None:
        if self._generation is not None:
            self._generation.forward_done(output, timed=self.phase == "timed")
        loss = getattr(output, "loss", None) if not isinstance(output, dict) else output.get("loss")
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self._last_loss = loss.detach()

    def _native_output(self):
        """Kineto's native progress lines and the profiler's deprecation warnings: into the run's profiler.log."""
        return library_output(self.run_dir.profiler_log)

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def _profile(self, active: int, trace_path: Path | None, **kwargs) -> profile:
        prof = profile(
            activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else []),
            # repeat=1: one cycle; with the default (0) a new, empty cycle starts after the trace is saved.
            schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
            on_trace_ready=(lambda p: p.export_chrome_trace(str(trace_path))) if trace_path else None,
            **kwargs,
        )
        prof.preset_metadata_json("profkit", json.dumps({"run": self.record.run, "method": self.record.method}))
        if not (dist.is_available() and dist.is_initialized()):
            # Kineto writes distributedInfo only under torch.distributed; HTA needs a rank to load a trace.
            prof.preset_metadata_json("distributedInfo", json.dumps({"backend": "none", "rank": 0, "world_size": 1}))
        return prof

    def _attach_oom_observer(self) -> None:
        """Dump the allocator state at the moment of an out-of-memory error, before tensors are freed."""
        ref = weakref.ref(self)

        def observer(device, alloc, device_alloc, device_free):  # signature fixed by torch
            s = ref()
            if s is not None and not s._closed:
                torch.cuda.memory._dump_snapshot(str(s.run_dir.oom_snapshot))

        torch._C._cuda_attach_out_of_memory_observer(observer)

    def _write_record(self) -> None:
        rec = self.record
        rec.finished_at = now()
        rec.wall_s = time.perf_counter() - self._t0
        rec.files = self.run_dir.files()
        self.run_dir.write_manifest(rec.to_json())


def export_memory_timeline(p: profile, path: Path, device: str,
                           max_events: int = MEMORY_TIMELINE_MAX_EVENTS) -> str | None:
    """Write the profiler's categorized memory timeline to ``path``; why it was not written, or None.

    Deprecated upstream, its data-flow analysis sometimes asserts ("duplicate outputs", pytorch/pytorch#167838) and
    its cost grows faster than the cycle's events (``MEMORY_TIMELINE_MAX_EVENTS``). The storage lifetimes are the
    run's own attribution; this export, while torch has it and it ends in reasonable time, is a second opinion."""
    results = getattr(p.profiler, "kineto_results", None)
    events = len(results.events()) if results is not None else 0
    if events > max_events:
        return (f"not exported: {events:,} profiler events in the memory cycle, over {max_events:,}; torch's "
                "export grows faster than its events (504k took 48 s on CPU; an H100 inference cycle over 6 min)")
    try:
        p.export_memory_timeline(str(path), device=device)
    except Exception as exc:
        path.unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None
