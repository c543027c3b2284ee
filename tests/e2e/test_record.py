"""End to end: ``profkit record --all`` on the micro preset, then check what every run wrote."""

import gzip
import json

import pytest
from torch_tb_profiler.consts import WORKER_PATTERN

from profkit.analyze import breakdown
from profkit.analyze.trace import load_trace
from profkit.core.methods import METHODS
from profkit.core.presets import get_preset
from tests.conftest import FAST, invoke, recorded, run_cli

MICRO = get_preset("micro").config


def lora_param_count(cfg: dict, r: int = 8) -> int:
    """Analytic LoRA count on q/k/v/o: r * (in + out) per adapted projection per layer."""
    h = cfg["hidden_size"]
    head = h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * head, cfg["num_key_value_heads"] * head
    return cfg["num_hidden_layers"] * r * ((h + q) + (h + kv) + (h + kv) + (q + h))


def model_param_count(cfg: dict) -> int:
    from transformers import AutoConfig, AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg))
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once


def owner_bytes(manifest, owner, detail=None):
    return sum(r["bytes"] for r in manifest["inventory"]["rows"]
               if r["owner"] == owner and (detail is None or r["detail"] == detail))


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_records(matrix, name):
    run = matrix / name
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "ok", manifest.get("reason")
    for key in ("method", "settings", "run_settings", "versions", "device", "timings", "peaks", "inventory",
                "started_at", "finished_at", "git_commit", "model"):
        assert key in manifest, key
    assert manifest["method"] == name and manifest["settings"] == METHODS[name].settings()
    # The preset's batch is a training batch; serving is measured one request at a time unless asked.
    expected_batch = 1 if METHODS[name].kind == "infer" else get_preset("micro").batch_size
    assert manifest["run_settings"]["batch_size"] == expected_batch
    assert manifest["timings"]["step_time_s"] > 0 and manifest["timings"]["tokens_per_s"] > 0
    # How long the run's threads waited for a CPU, from Linux's scheduler: a share, for the clean and profiled steps.
    for share in ("cpu_wait_share", "profiled_cpu_wait_share"):
        assert 0.0 <= manifest["timings"][share] <= 1.0, share
    assert manifest["phases_done"] == ["warmup", "timed", "time_profile", "memory_profile"]
    # The method as the live objects show it (peft, bitsandbytes, DeepSpeed) is the one the registry built.
    found, settings = manifest["model"]["found"], manifest["settings"]
    for key in ("adapter", "quantization", "gradient_checkpointing", "zero_stage", "lora_r", "lora_alpha", "lora_dropout"):
        if key in settings:
            assert found[key] == settings[key], key
    if "lora_targets" in settings:
        assert sorted(found["lora_targets"]) == sorted(settings["lora_targets"])
    # Both cycles wrote Kineto traces that parse, carry a rank for HTA and ProfilerStep markers.
    for trace_file in ("time.pt.trace.json.gz", "memory.pt.trace.json.gz"):
        trace = load_trace(run / trace_file)
        assert "rank" in trace.metadata["distributedInfo"]
        assert trace.metadata["profkit"]["method"] == name
        assert trace.step_windows(), "no ProfilerStep markers"
        assert WORKER_PATTERN.match(trace_file), "TensorBoard's profiler plugin would not list this trace"
    memory = json.load(gzip.open(run / "memory.pt.trace.json.gz"))
    assert any(e.get("name") == "[memory]" for e in memory["traceEvents"]), "no memory events in the memory cycle"
    export = run / "memory_timeline.raw.json.gz"
    if not export.is_file():
        # torch's deprecated export can assert (pytorch/pytorch#167838; one CI run in six on 2026-11-25, for
        # full_zero3_gc, not reproduced in six reruns): the run stays complete and must say why the export is missing
        assert manifest["timings"].get("memory_timeline_error"), "the export is missing and the run does not say why"
    else:
        assert json.load(gzip.open(export))
    assert not list(matrix.glob(f".{name}.partial-*")), "partial directory left behind"


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.kind == "train" and not m.zero_stage])
def test_inventory_is_exact(matrix, name):
    manifest = json.loads((matrix / name / "manifest.json").read_text())
    method = METHODS[name]
    expected = model_param_count(MICRO) if method.adapter == "none" else lora_param_count(MICRO, method.lora_r)
    assert manifest["inventory"]["trainable_params"] == expected
    assert owner_bytes(manifest, "parameters_trainable") == 4 * expected  # fp32 on CPU
    assert owner_bytes(manifest, "gradients") == 4 * expected
    # AdamW: two fp32 moments per trainable parameter, plus one scalar step per parameter tensor.
    assert owner_bytes(manifest, "optimizer_state", "exp_avg") == 4 * expected
    assert owner_bytes(manifest, "optimizer_state", "exp_avg_sq") == 4 * expected
    n_tensors = next(r["tensors"] for r in manifest["inventory"]["rows"] if r["owner"] == "parameters_trainable")
    assert owner_bytes(manifest, "optimizer_state", "step") == 4 * n_tensors
    if method.quantization:
        assert manifest["inventory"]["quantized_params"] > 0
        assert owner_bytes(manifest, "parameters_quantized", "nf4 weight") * 2 == manifest["inventory"]["quantized_params"]


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.zero_stage])
def test_zero_inventory_names_deepspeed_buffers(matrix, name):
    manifest = json.loads((matrix / name / "manifest.json").read_text())
    inventory = manifest["inventory"]
    trainable = lora_param_count(MICRO) if METHODS[name].adapter == "lora" else \
        inventory["trainable_params"] + inventory["frozen_params"]  # full fine-tuning trains every weight
    assert inventory["trainable_params"] == trainable and (METHODS[name].adapter == "lora" or trainable > 300_000)
    details = {r["detail"] for r in manifest["inventory"]["rows"]}
    assert any(d.startswith("deepspeed:") for d in details), details
    # ZeRO keeps an fp32 master copy besides AdamW's two moments, even on one process.
    assert owner_bytes(manifest, "optimizer_state") >= 3 * 4 * trainable


def test_tokens_and_loss_are_sane(matrix):
    lora = json.loads((matrix / "lora" / "manifest.json").read_text())
    assert lora["timings"]["tokens_per_step"] == get_preset("micro").batch_size * get_preset("micro").seq_len
    assert all(0 < loss < 20 for loss in lora["timings"]["losses"])


def test_unknown_method_exits_2_listing_valid_names(tmp_path):
    result = run_cli("record", "lroa", "-o", str(tmp_path))
    assert result.returncode == 2
    assert "lroa" in result.stderr and "qlora_zero3_gc" in result.stderr
    assert not any(tmp_path.iterdir())


def test_methods_command_lists_every_method():
    result = invoke("methods", "--json")
    assert result.returncode == 0
    assert [m["name"] for m in json.loads(result.stdout)] == list(METHODS)


# What a torch without the deprecated export does: importing it in every worker (sitecustomize) removes it.
NO_EXPORT_SITECUSTOMIZE = """
import torch.profiler
def _removed(self, *args, **kwargs):
    raise AttributeError("export_memory_timeline was removed from torch (simulated)")
torch.profiler.profile.export_memory_timeline = _removed
"""


def test_record_without_the_profilers_export_decomposes_from_storage_lifetimes(tmp_path):
    """``profkit record`` on a torch without ``export_memory_timeline``: every run is complete, its memory comes
    from the storage lifetimes, static owners are the inventory's to the byte and |unattributed| is within 1%."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(NO_EXPORT_SITECUSTOMIZE)
    out = tmp_path / "traces"
    methods = ["full_gc", "infer_fp16"]
    result = run_cli("record", *methods, *FAST, "-o", str(out), env={"PYTHONPATH": str(tmp_path / "site")})
    assert result.returncode == 0, recorded(result, out)
    bd = breakdown([out])
    assert not [p for p in bd.problems if p.fatal], bd.problems
    for name in methods:
        record = bd.records[name]
        assert record.status == "ok" and "simulated" in record.timings["memory_timeline_error"]
        peak = bd.memory[(bd.memory.run == name) & (bd.memory.phase == "peak")].set_index("category").bytes
        measured = int(bd.runs.set_index("run").loc[name, "measured_peak_bytes"])
        assert abs(peak["unattributed"]) <= 0.01 * measured, (name, peak.to_dict())
        owners = {}
        for row in record.inventory["rows"]:
            owners[row["owner"]] = owners.get(row["owner"], 0) + row["bytes"]
        assert peak["parameters_frozen"] == owners.get("parameters_frozen", 0) + owners.get("buffers", 0)
        assert peak["parameters_trainable"] == owners.get("parameters_trainable", 0)
        assert peak["optimizer_state"] == owners.get("optimizer_state", 0)
    assert bd.memory[(bd.memory.run == "infer_fp16") & (bd.memory.phase == "peak")].set_index("category") \
        .bytes["kv_cache"] == bd.records["infer_fp16"].inventory["kv_cache_bytes"]


AXOLOTL = """base_model: meta-llama/Llama-3.2-1B
adapter: lora
lora_r: 4
lora_alpha: 8
lora_target_modules: [q_proj, v_proj]
sequence_len: 64
micro_batch_size: 2
gradient_checkpointing: true
optimizer: adamw_torch
"""


def test_record_from_a_users_config_records_its_method_settings_and_sizes_on_a_model_with_weights(tmp_path):
    """A config whose model is known here as a configuration only (profkit's catalogue) is recorded with its method,
    settings and sizes on the preset given beside it, and says so; the run's manifest states what the config set."""
    config = tmp_path / "my-axolotl.yml"
    config.write_text(AXOLOTL)
    result = invoke("record", "--config", str(config), "--preset", "micro", "--device", "cpu",
                    "--output", str(tmp_path / "runs"), env={"COLUMNS": "120"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "configuration only here" in result.stderr and "preset micro" in result.stderr
    [run] = breakdown([tmp_path / "runs"]).records.values()
    settings = run.run_settings
    assert run.status == "ok" and run.method == "lora_gc"
    assert settings["overrides"] == {"lora_rank": 4, "lora_alpha": 8, "lora_targets": "q_proj,v_proj",
                                     "optimizer": "adamw", "precision": "auto"}
    assert (settings["batch_size"], settings["seq_len"], settings["preset"]) == (2, 64, "micro")
