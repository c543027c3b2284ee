"""The recording session's parts, without recording: the phase schedule (pure), and each phase's work started,
stepped and stopped on a small model."""

from __future__ import annotations

import pytest
import torch

from profkit import store
from profkit.record.phase_schedule import DONE, PHASES, PhaseSchedule


@pytest.mark.parametrize("warmup, timed, profiled, memory, phases", [
    (0, 1, 1, 1, ["timed", "time_profile", "time_profile", "memory_profile", "memory_profile"]),
    (2, 1, 1, 1, ["warmup"] * 2 + ["timed", "time_profile", "time_profile", "memory_profile", "memory_profile"]),
    (1, 3, 2, 1, ["warmup"] + ["timed"] * 3 + ["time_profile"] * 3 + ["memory_profile"] * 2),
    (2, 5, 2, 1, ["warmup"] * 2 + ["timed"] * 5 + ["time_profile"] * 3 + ["memory_profile"] * 2),  # the defaults
    (0, 2, 1, 3, ["timed"] * 2 + ["time_profile"] * 2 + ["memory_profile"] * 4),
])
def test_the_phase_of_each_step(warmup, timed, profiled, memory, phases):
    schedule = PhaseSchedule(warmup, timed, profiled, memory)
    assert schedule.total_steps == len(phases)
    assert [schedule.phase_of(i) for i in range(len(phases) + 2)] == phases + [DONE, DONE]
    for phase in PHASES:  # a phase ends after its last step
        assert schedule.end_of(phase) == (max(i for i, p in enumerate(phases) if p == phase) + 1 if phase in phases
                                          else schedule.end_of(PHASES[PHASES.index(phase) - 1]) if phase != "warmup"
                                          else 0)
    # Walked as a session walks it: the phase before each step, and which steps end their phase.
    walked, ends = [schedule.begin()], []
    while not schedule.done:
        on_last = schedule.on_last_step()
        last = schedule.count_step()
        assert last == on_last
        if last:
            ends.append(schedule.steps)
            schedule.next_phase()
        walked.append(schedule.phase)
    assert walked == phases + [DONE] and schedule.steps == len(phases)
    assert ends == [schedule.end_of(p) for p in dict.fromkeys(phases)]


def test_steps_counted_in_a_phase():
    schedule = PhaseSchedule(1, 2, 1, 1)
    assert schedule.phase is None and schedule.in_phase == 0 and not schedule.done
    assert schedule.begin() == "warmup" and schedule.in_phase == 0
    assert schedule.count_step() and schedule.in_phase == 1
    assert schedule.next_phase() == "timed" and schedule.in_phase == 0
    assert not schedule.count_step() and schedule.in_phase == 1 and schedule.on_last_step()


@pytest.mark.parametrize("name, value, least", [("warmup_steps", -1, 0), ("timed_steps", 0, 1),
                                                ("profiled_steps", 1.5, 1), ("memory_steps", 0, 1)])
def test_step_counts_are_whole_numbers(name, value, least):
    counts = dict(warmup_steps=2, timed_steps=5, profiled_steps=2, memory_steps=1) | {name: value}
    with pytest.raises(ValueError, match=rf"Session\({name}={value!r}\): a whole number, at least {least}"):
        PhaseSchedule(**counts)


def test_timed_steps_time_each_step_and_keep_its_tokens_and_loss():
    from profkit.record.timed_steps import TimedSteps
    from profkit.store.manifest import RunRecord

    record = RunRecord(run="r", method="lora", kind="train", settings={})
    synced = []
    timed = TimedSteps(lambda: synced.append(1), record)
    timed.start()
    timed.measure(64, torch.tensor(2.5))
    timed.measure(32, None)
    timed.measure(64, torch.tensor(1.5, dtype=torch.bfloat16))
    timed.finish()
    timed.stop()
    t = record.timings
    assert len(synced) == 4 and len(t["step_times_s"]) == 3 and all(s >= 0 for s in t["step_times_s"])
    assert t["tokens_per_step"] == 64 and t["losses"] == [2.5, 1.5]
    assert t["tokens_per_s"] == 64 / t["step_time_s"]
    assert TimedSteps(lambda: None, record, tokens_per_step=10).tokens_per_step == 10


def test_the_warmup_keeps_the_allocators_history_and_an_oom_snapshot_only_while_started(tmp_path, monkeypatch):
    from profkit.record.cuda_allocator import CUDA_HISTORY_MAX_ENTRIES, OomSnapshot, WarmupHistory

    calls, observers = [], []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kw: calls.append(kw.get("max_entries") if enabled else None))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: calls.append(path))
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append, raising=False)
    warmup = WarmupHistory()
    warmup.start()
    warmup.step(last=True)
    warmup.stop()
    assert calls == [CUDA_HISTORY_MAX_ENTRIES, None]
    calls.clear()
    snapshot = OomSnapshot(tmp_path / "oom.pickle")
    snapshot.start()
    observers[0](0, 1, 2, 3)
    snapshot.stop()
    observers[0](0, 1, 2, 3)  # the session closed: nothing more is dumped
    assert calls == [str(tmp_path / "oom.pickle")]


def _tiny_training():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Linear(8, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optimizer


def _train_step(model, optimizer):
    ids = torch.randint(0, 32, (2, 4))
    model(ids).float().mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _cycle(kind, tmp_path, steps):
    from profkit.record import describe
    from profkit.record.memory_cycle import MemoryCycle
    from profkit.record.phase_labels import PhaseLabels
    from profkit.record.profiler_cycles import TimeCycle
    from profkit.store.manifest import RunRecord

    model, optimizer = _tiny_training()
    parts = describe.unwrap(model, optimizer)
    record = RunRecord(run="r", method="full", kind="train", settings={}, timings={"step_time_s": 1.0})
    run_dir = store.RunDir(tmp_path)
    cycle = dict(run_dir=run_dir, labels=PhaseLabels(parts, False, lambda: None), record=record, cuda=False,
                 steps=steps)
    work = TimeCycle(**cycle) if kind == "time" else MemoryCycle(parts=parts, generation=None, **cycle)
    return work, model, optimizer, record, run_dir


def test_the_time_cycle_writes_its_trace_and_the_profiled_steps_wait(tmp_path):
    cycle, model, optimizer, record, run_dir = _cycle("time", tmp_path, steps=2)
    cycle.start()
    for last in (False, True):
        _train_step(model, optimizer)
        cycle.step(last)
    cycle.finish()
    cycle.stop()
    cycle.labels.remove()
    assert run_dir.time_trace.stat().st_size > 0 and cycle.profiler is None
    assert "profiled_cpu_wait_share" in record.timings


def test_the_memory_cycle_follows_storages_through_its_first_step_and_takes_the_inventory_in_its_last(tmp_path):
    cycle, model, optimizer, record, run_dir = _cycle("memory", tmp_path, steps=2)
    cycle.start()
    assert cycle.follower is not None
    _train_step(model, optimizer)
    cycle.step(last=False)
    assert cycle.follower is None and run_dir.storage_lifetimes.stat().st_size > 0 and record.inventory is None
    _train_step(model, optimizer)
    cycle.step(last=True)  # no optimizer step was labelled: the inventory is taken at the step's end
    assert record.inventory["trainable_params"] == sum(p.numel() for p in model.parameters())
    cycle.finish()
    cycle.stop()
    cycle.labels.remove()
    assert run_dir.memory_trace.stat().st_size > 0
    assert record.peaks["process_rss_peak"] > 0 and record.peaks["process_rss"] > 0


def test_a_memory_cycle_stopped_in_its_first_step_keeps_the_storage_lifetimes(tmp_path):
    cycle, model, optimizer, record, run_dir = _cycle("memory", tmp_path, steps=2)
    cycle.start()
    _train_step(model, optimizer)
    cycle.stop()
    cycle.labels.remove()
    assert run_dir.storage_lifetimes.stat().st_size > 0 and cycle.profiler is None and "process_rss" in record.peaks


def test_a_memory_limit_needs_the_cuda_caching_allocator():
    from profkit.record.cuda_allocator import limit_allocator

    with pytest.raises(ValueError, match="the cpu has none"):
        limit_allocator("cpu", 1 << 30)
