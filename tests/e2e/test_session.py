"""Profiling a user's own training: ``profkit.Session`` in a hand-written loop, ``profkit.TrainerCallback`` in a Hugging
Face Trainer (with and without DeepSpeed), and ``profkit record --engine trainer``; then the same analysis as for
profkit's own runs. Figures are checked against counts taken from the models.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_session.py``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import profkit
from profkit import store
from profkit.analyze import breakdown
from profkit.core.presets import get_preset
from profkit.record.environment import cpu_wait_share, scheduler_times
from profkit.store.manifest import SCHEMA_VERSION
from tests.conftest import invoke, run_cli

OWN_TRAINING = Path(__file__).parents[2] / "docs" / "pages" / "own-training.md"  # the documented examples


QUICK = dict(warmup_steps=0, timed_steps=1, profiled_steps=1, memory_steps=1)  # 5 steps


def readme_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", OWN_TRAINING.read_text(), re.S)


def inventory_bytes(record: dict, owner: str, detail: str | None = None) -> int:
    return sum(r["bytes"] for r in record["inventory"]["rows"]
               if r["owner"] == owner and (detail is None or r["detail"] == detail))


def check_training_run(bd, run: str, model_trainable: int) -> None:
    """What every recorded training run must show, against counts taken independently from the model."""
    row = bd.runs.set_index("run").loc[run]
    assert row.status == "ok", row.reason
    record = bd.records[run].to_json()
    mem = bd.memory[(bd.memory.run == run) & (bd.memory.phase == "peak")].set_index("category").bytes
    assert record["inventory"]["trainable_params"] == model_trainable
    assert mem["parameters_trainable"] == 4 * model_trainable  # fp32 on CPU
    # AdamW: two fp32 moments per trainable parameter (and a step counter per tensor).
    moments = inventory_bytes(record, "optimizer_state", "exp_avg") + inventory_bytes(record, "optimizer_state", "exp_avg_sq")
    assert moments == 2 * 4 * model_trainable
    assert mem["optimizer_state"] == inventory_bytes(record, "optimizer_state")
    assert row.coverage_cpu >= 0.95
    time_phases = set(bd.time[bd.time.run == run].phase)
    assert {"forward", "backward", "optimizer", "data"} <= time_phases
    assert {"forward", "backward", "optimizer"} <= set(bd.memory[bd.memory.run == run].phase)
    # Gradients exist from backward to the optimizer step: the breakdown sees all of them there.
    grads = bd.memory[(bd.memory.run == run) & (bd.memory.phase == "optimizer") & (bd.memory.category == "gradients")]
    assert int(grads.bytes.iloc[0]) == inventory_bytes(record, "gradients")


def test_readme_examples_record_and_break_down(tmp_path):
    """The documented examples (docs, "Your own training"), run as a user's scripts, give runs that the breakdown decomposes fully."""
    examples = readme_examples()
    assert len(examples) == 2
    for i, code in enumerate(examples):
        script = tmp_path / f"example{i}.py"
        script.write_text(code)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "profiler_start" not in done.stderr and "export_memory_timeline" not in done.stderr  # kept in profiler.log
    runs = [tmp_path / "traces" / "my_loop", tmp_path / "traces" / "my_trainer"]
    bd = breakdown(runs)
    assert not bd.problems
    # The examples' LoRA: r=8 on q_proj and v_proj (64 -> 64) in each of 2 layers.
    expected = 2 * 2 * 8 * (64 + 64)
    for run in ("my_loop", "my_trainer"):
        check_training_run(bd, run, expected)
        found = bd.records[run].settings
        assert bd.records[run].method == "lora" and found["lora_r"] == 8
        assert sorted(found["lora_targets"]) == ["q_proj", "v_proj"]
    assert bd.records["my_loop"].engine == "session" and bd.records["my_trainer"].engine == "trainer"
    # The estimate of the setup read from the live objects, beside the measurement: static categories exact.
    for run in ("my_loop", "my_trainer"):
        p = bd.predicted[bd.predicted.run == run].set_index("category")
        assert p.loc["parameters_trainable", "error"] == 0 and p.loc["optimizer_state", "error"] == 0
        assert abs(p.loc["activations", "error"]) < 0.15
    assert bd.records["my_trainer"].engine_config["trainer"]["max_steps"] == 12
    table = invoke("breakdown", *map(str, runs), env={"COLUMNS": "80"})
    assert table.returncode == 0, table.stderr
    assert "my_trainer" in table.stdout and "Traceback" not in table.stderr


def micro_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**get_preset("micro").config))
    model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    return model, optimizer


def train_steps(model, optimizer, session, n: int, fail_at: int | None = None) -> None:
    for i in range(n):
        if i == fail_at:
            raise RuntimeError("a bug in the user's loop")
        ids = torch.randint(0, 4096, (2, 32))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        session.step()


def test_session_counts_tokens_and_losses_and_labels_recompute(tmp_path):
    model, optimizer = micro_lora()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    with profkit.Session(tmp_path / "gc", model, optimizer, **QUICK) as session:
        train_steps(model, optimizer, session, session.total_steps + 3)  # extra steps cost nothing
        assert session.done
    record = json.loads((tmp_path / "gc" / "manifest.json").read_text())
    assert record["status"] == "ok" and record["schema_version"] == SCHEMA_VERSION
    assert record["timings"]["tokens_per_step"] == 2 * 32
    assert len(record["timings"]["losses"]) == 1 and 0 < record["timings"]["losses"][0] < 20
    assert record["method"] == "lora_gc" and record["settings"]["gradient_checkpointing"] is True
    bd = breakdown([tmp_path / "gc"])
    assert bd.time[(bd.time.run == "gc") & (bd.time.category == "recompute")].seconds.sum() > 0
    # Hooks and patches are gone once the session is done.
    assert torch.autograd.backward.__name__ == "backward" and not hasattr(torch.autograd.backward, "__wrapped__")
    assert not model._forward_pre_hooks and not optimizer._optimizer_step_pre_hooks


def test_exception_in_the_loop_marks_the_run_failed_and_keeps_its_traces(tmp_path):
    model, optimizer = micro_lora()
    with pytest.raises(RuntimeError, match="a bug"):
        with profkit.Session(tmp_path / "run", model, optimizer, **QUICK) as session:
            train_steps(model, optimizer, session, 10, fail_at=4)  # in the memory cycle
    record = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert record["status"] == "failed" and "a bug in the user's loop" in record["reason"]
    assert (tmp_path / "run" / store.TIME_TRACE).exists()  # the time cycle had finished
    assert "time_profile" in record["phases_done"] and "memory_profile" not in record["phases_done"]
    bd = breakdown([tmp_path / "run"])
    assert bd.runs.iloc[0].status == "failed"  # shown with its status, never as zeros
    assert bd.memory.empty


def test_a_short_session_is_incomplete_and_never_replaces_a_complete_run(tmp_path):
    model, optimizer = micro_lora()
    with profkit.Session(tmp_path / "run", model, optimizer, **QUICK) as session:
        train_steps(model, optimizer, session, 5)
    complete = (tmp_path / "run" / "manifest.json").read_text()
    with profkit.Session(tmp_path / "run", model, optimizer, **QUICK) as session:
        train_steps(model, optimizer, session, 2)
    assert (tmp_path / "run" / "manifest.json").read_text() == complete
    attempts = list((tmp_path / store.ATTEMPTS_DIR).iterdir())
    assert len(attempts) == 1
    record = json.loads((attempts[0] / "manifest.json").read_text())
    assert record["status"] == "incomplete" and "at least 5 steps" in record["reason"]


TWO_PROCESSES = """
import sys, torch, profkit
from tests.e2e.test_session import micro_lora, train_steps, QUICK
model, optimizer = micro_lora(int(sys.argv[2]))
with profkit.Session(sys.argv[1], model, optimizer, **QUICK) as session:
    train_steps(model, optimizer, session, 5)
"""


@pytest.mark.long
def test_two_sessions_on_one_directory_leave_one_complete_run(tmp_path):
    """Two processes record into the same run at once: each writes its own partial directory; the commits
    replace each other whole, so what is left is one complete run and no partial one."""
    root = Path(__file__).parents[2]
    procs = [subprocess.Popen([sys.executable, "-c", TWO_PROCESSES, str(tmp_path / "run"), str(seed)], cwd=root,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
    assert store.is_complete(tmp_path / "run")
    assert not [p for p in tmp_path.iterdir() if store.PARTIAL_MARK in p.name or ".old-" in p.name]
    # In one process, a second open session is refused (one profiler per process) instead of crashing.
    a, opt_a = micro_lora(0)
    with profkit.Session(tmp_path / "a", a, opt_a, **QUICK):
        with pytest.raises(RuntimeError, match="another profkit Session is open"):
            profkit.Session(tmp_path / "b", a, opt_a, **QUICK).start()


def test_bad_session_arguments_are_refused_before_anything_is_written(tmp_path):
    model, optimizer = micro_lora()
    mine = tmp_path / "my_project"
    mine.mkdir()
    (mine / "train.py").write_text("print('mine')\n")
    with pytest.raises(OSError, match="not a profkit run directory"):
        profkit.Session(mine, model, optimizer)
    assert (mine / "train.py").read_text() == "print('mine')\n"
    with pytest.raises(TypeError, match="nn.Module"):
        profkit.Session(tmp_path / "x", "not a model", optimizer)
    with pytest.raises(ValueError, match="timed_steps"):
        profkit.Session(tmp_path / "x", model, optimizer, timed_steps=0)
    assert not (tmp_path / "x").exists()


def test_trainer_that_stops_early_leaves_an_incomplete_run(tmp_path):
    from transformers import Trainer, TrainingArguments

    model, _ = micro_lora()
    ids = torch.randint(0, 4096, (32,))
    data = [{"input_ids": ids, "labels": ids}] * 8
    args = TrainingArguments(str(tmp_path / "out"), max_steps=3, per_device_train_batch_size=2, report_to="none",
                             use_cpu=True, save_strategy="no", disable_tqdm=True)
    callback = profkit.TrainerCallback(tmp_path / "short", **QUICK)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    record = json.loads((tmp_path / "short" / "manifest.json").read_text())
    assert record["status"] == "incomplete" and "3 of the 5 steps" in record["reason"]
    assert record["engine"] == "trainer"


def test_an_unknown_manifest_schema_is_named_not_guessed(tmp_path, matrix):
    import shutil

    run = tmp_path / "future"
    shutil.copytree(matrix / "lora", run)
    record = json.loads((run / "manifest.json").read_text())
    (run / "manifest.json").write_text(json.dumps({**record, "schema_version": 99}))
    result = invoke("breakdown", str(run), str(matrix / "lora"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "schema version 99" in result.stderr and "lora" in result.stdout


def test_trainer_engine_records_beside_the_loop_and_the_breakdown_says_why_they_differ(engines):
    from tests.e2e.test_record import lora_param_count

    micro = get_preset("micro").config
    bd = breakdown([engines])
    assert set(bd.runs.run) == {"lora_zero2", "lora_zero2-trainer", "qlora_gc", "qlora_gc-trainer"}
    for run in bd.runs.run:
        rec = bd.records[run]
        # Read from the live objects, through accelerate's and DeepSpeed's wrappers: what the registry says.
        found = rec.model["found"]
        for key in ("adapter", "quantization", "gradient_checkpointing", "zero_stage", "lora_r"):
            assert found[key] == rec.settings[key], (run, key)
        assert rec.engine == ("trainer" if run.endswith("-trainer") else "loop")
    check_training_run(bd, "lora_zero2-trainer", lora_param_count(micro))
    trainer = bd.records["lora_zero2-trainer"]
    hidden = micro["hidden_size"]
    assert trainer.engine_config["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == hidden * hidden
    assert trainer.model["zero"]["reduce_bucket_size"] == hidden * hidden
    assert bd.records["lora_zero2"].model["zero"]["reduce_bucket_size"] == 500_000_000
    mem = bd.memory[bd.memory.phase == "peak"].pivot(index="category", columns="run", values="bytes")
    # DeepSpeed's default bucket (500M fp32 elements) per backward under profkit's loop; hidden^2 under the Trainer.
    # The rest of the step's temporaries (activation gradients, the loss') are the same model's on the same batch.
    assert mem.loc["temporaries", "lora_zero2"] >= 0.99 * 500_000_000 * 4
    bucket_difference = (500_000_000 - hidden * hidden) * 4
    apart = mem.loc["temporaries", "lora_zero2"] - mem.loc["temporaries", "lora_zero2-trainer"]
    assert abs(apart - bucket_difference) <= 0.01 * bucket_difference, (apart, bucket_difference)
    # The estimate knows each engine's bucket: the peak prediction follows the Trainer's config too.
    pred = bd.predicted[(bd.predicted.run == "lora_zero2-trainer") & (bd.predicted.category == "peak")]
    assert abs(float(pred.error.iloc[0])) < 0.5
    table = invoke("breakdown", str(engines), env={"COLUMNS": "80"})
    assert "500,000,000 elements" in table.stdout and "4,096 under the Trainer" in table.stdout.replace("\n", " ")


@pytest.mark.parametrize("args, message", [
    (["lora", "--engine", "nope"], "--engine 'nope': valid values are loop, trainer"),
    (["infer_fp16", "--engine", "trainer"], "infer_fp16 is an inference method"),
])
def test_bad_engine_arguments(args, message):
    result = run_cli("record", *args)
    assert result.returncode == 2 and message in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


def decomposed_by_owner(run: Path):
    """A complete run whose peak decomposes: static owners the inventory's to the byte, activations found, and
    |unattributed| within 1% of the measured peak. Returns the breakdown and the run's record."""
    record = json.loads((run / "manifest.json").read_text())
    assert record["status"] == "ok", record["reason"]
    bd = breakdown([run])
    assert not bd.problems, bd.problems
    peak = bd.memory[bd.memory.phase == "peak"].set_index("category").bytes
    assert abs(peak["unattributed"]) <= 0.01 * int(bd.runs.measured_peak_bytes.iloc[0])
    assert peak["parameters_trainable"] == inventory_bytes(record, "parameters_trainable") > 0
    assert peak["parameters_frozen"] == inventory_bytes(record, "parameters_frozen") + inventory_bytes(record, "buffers")
    assert peak["optimizer_state"] == inventory_bytes(record, "optimizer_state") > 0
    assert peak["activations"] > 0
    return bd, record


def test_without_the_profilers_export_memory_comes_from_the_storage_lifetimes(tmp_path, monkeypatch):
    """A torch without ``export_memory_timeline`` (deprecated upstream), or one whose export fails
    (pytorch/pytorch#167838): the run is complete, and its memory decomposes from the storage lifetimes with static
    owners to the byte and |unattributed| within 1% of the measured peak."""
    from torch.profiler import profile as Profile

    def removed(self, *args, **kwargs):
        raise AttributeError("'profile' object has no attribute 'export_memory_timeline' (simulated)")

    monkeypatch.setattr(Profile, "export_memory_timeline", removed)
    model, optimizer = micro_lora()
    session = profkit.Session(tmp_path / "run", model, optimizer, **QUICK)
    with session:
        train_steps(model, optimizer, session, 5)
    bd, record = decomposed_by_owner(tmp_path / "run")
    assert "simulated" in record["timings"]["memory_timeline_error"]
    assert not (tmp_path / "run" / store.MEMORY_TIMELINE).exists()
    peak = bd.memory[bd.memory.phase == "peak"].set_index("category").bytes
    assert peak.sum() == int(bd.runs.measured_peak_bytes.iloc[0])
    assert any("storage lifetimes" in n for n in bd.notes["run"])


@pytest.mark.long
def test_a_compiled_model_decomposes_by_both_sources_alike(tmp_path):
    """A user's loop over a ``torch.compile``d model (``aot_eager``: AOTAutograd's partitioner decides what is saved
    for backward; no C++ compiler needed): the run is complete, static owners are the inventory's to the byte,
    |unattributed| is within 1% of the peak, and the storage lifetimes, followed through the compiled regions (the
    tracker lets Dynamo run them), agree with the profiler's export per category within 1% of the peak. Without
    that, the tracker's step ran eagerly: temporaries 21% of the peak apart on torch 2.15. Inductor's own
    buffers are allocated outside the dispatcher, out of the tracker's sight (README, "Memory")."""
    model, optimizer = micro_lora()
    compiled = torch.compile(model, backend="aot_eager")
    with profkit.Session(tmp_path / "compiled", model, optimizer, **QUICK) as session:
        train_steps(compiled, optimizer, session, session.total_steps)
    bd, _ = decomposed_by_owner(tmp_path / "compiled")
    sources = bd.memory_sources.set_index("category")
    assert len(sources) and (sources.difference_of_peak.abs() <= 0.01).all(), sources
    assert not any("storage lifetimes say" in n for n in bd.notes["compiled"]), bd.notes["compiled"]


def test_the_allocators_history_is_kept_through_the_warmup_steps_on_cuda(tmp_path, monkeypatch):
    """On CUDA the allocator's history runs through the warm-up steps (untimed) and is cleared when they end, so an
    OOM in the first steps dumps a snapshot that holds the failed request (the first GPU check's OOM snapshot held
    no history: it failed in warm-up, before the memory cycle). The CUDA calls are stood in for on CPU."""
    calls = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                        lambda enabled="all", **kw: calls.append("cleared" if enabled is None else "recording"))
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", lambda observer: None, raising=False)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def session(name):
        s = profkit.Session(tmp_path / name, model, optimizer, warmup_steps=2, timed_steps=1, profiled_steps=1,
                            memory_steps=1)
        s.cuda = True  # as on a GPU: the session asks torch for nothing else in its warm-up steps
        return s

    s = session("ends-warmup")
    s.start()
    assert calls == ["recording"]
    s.step()
    assert calls == ["recording"]  # still warming up
    s.step()
    assert calls == ["recording", "cleared"] and s.phase == "timed"
    s.cuda = False  # the rest of the session on CPU
    s.close()

    calls.clear()
    s = session("fails-in-warmup")
    s.start()
    s.close(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert calls == ["recording", "cleared"]
    assert json.loads((s.path / "manifest.json").read_text())["status"] == "oom"


@pytest.mark.long
def test_a_user_loop_under_autocast_over_fp32_weights_is_estimated_as_it_ran(tmp_path):
    """A hand-written loop with the model as from_config made it (fp32) and bf16 autocast around the forward: the
    session reads bf16-amp from the live model and the forward, and the estimate takes it (an H100 run of this
    loop was estimated 25% low when taken for bf16 weights: tests/analyze/test_gpu_runs.py)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    preset = get_preset("micro")
    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_config(AutoConfig.for_model(**preset.config)),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    with profkit.Session(tmp_path / "amp", model, optimizer, **QUICK) as session:
        while not session.done:
            ids = torch.randint(0, preset.config["vocab_size"], (2, 32))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            session.step()
    record = json.loads((session.path / "manifest.json").read_text())
    assert record["model"]["found"]["precision"] == "bf16-amp"
    assert record["estimate"]["settings"]["precision"] == "bf16-amp", record["estimate"].get("error")


def test_a_user_loop_that_accumulates_is_counted_and_estimated_so(tmp_path):
    """Two forwards and backwards per optimizer step: the session counts the micro-batches (the user says nothing)
    and the estimate holds the summed gradients through the second, as measured."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**get_preset("micro").config))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    with profkit.Session(tmp_path / "accumulating", model, optimizer, **QUICK) as session:
        while not session.done:
            for _ in range(2):
                ids = torch.randint(0, 4096, (2, 32))
                (model(input_ids=ids, labels=ids).loss / 2).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            session.step()
    record = json.loads((session.path / "manifest.json").read_text())
    assert record["model"]["found"]["grad_accum"] == 2 and record["timings"]["tokens_per_step"] == 2 * 2 * 32
    estimate = record["estimate"]
    assert estimate["settings"]["method"]["grad_accum"] == 2, estimate.get("error")
    gradients = 4 * sum(p.numel() for p in model.parameters())
    assert estimate["instants"]["forward"]["gradients"] == gradients
    run = breakdown([session.path]).runs.iloc[0]
    assert abs(run.predicted_peak_bytes / run.measured_peak_bytes - 1) <= 0.02, run.to_dict()


def test_the_scheduler_counts_the_wait_for_a_cpu():
    """``cpu_wait_share`` reads what Linux's scheduler counted: with more busy processes than cores, this
    process's threads wait for a CPU a large share of the time they are ready to run."""
    assert cpu_wait_share({"1": (0, 0)}, {"1": (3, 1), "2": (3, 1)}) == 0.25  # a new thread counts from zero
    assert cpu_wait_share(None, {"1": (3, 1)}) is None
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        time.sleep(0.2)
        before, start = scheduler_times(), time.perf_counter()
        while time.perf_counter() - start < 0.5:
            pass
        assert cpu_wait_share(before, scheduler_times()) > 0.2
    finally:
        for p in busy:
            p.kill()
