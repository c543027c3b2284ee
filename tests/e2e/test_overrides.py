"""Method settings from the command line: recorded on CPU and checked against counts worked out here from the
model's configuration; estimated for any Hugging Face config directory; refused with exit 2 where they make
no sense."""

from __future__ import annotations

import json
import math

import pytest

from profkit import store
from profkit.analyze import breakdown
from profkit.core.presets import get_preset
from tests.conftest import FAST, invoke, run_cli

QUICK_TINY = ["--preset", "tiny", "--device", "cpu", "--warmup-steps", "1", "--steps", "1", "--profiled-steps", "1"]


def linear_shapes(config: dict) -> list[tuple[int, int]]:
    """(in, out) of every linear layer peft's all-linear targets: each decoder layer's projections."""
    h, i = config["hidden_size"], config["intermediate_size"]
    kv = config["num_key_value_heads"] * (h // config["num_attention_heads"])
    per_layer = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]
    return per_layer * config["num_hidden_layers"]


def adamw_8bit_state(numel: int) -> int:
    """bitsandbytes' 8-bit AdamW: uint8 moments with an fp32 absmax per 256 values from 4096 elements up, fp32
    moments below."""
    return 2 * numel + 2 * math.ceil(numel / 256) * 4 if numel >= 4096 else 8 * numel


@pytest.fixture(scope="module")
def rank16(tmp_path_factory):
    out = tmp_path_factory.mktemp("overrides") / "traces"
    result = run_cli("record", "lora", "--lora-rank", "16", "--lora-targets", "all-linear", "--optimizer",
                     "adamw-8bit", *QUICK_TINY, "-o", str(out))
    return out, result


def test_rank_16_on_all_linear_layers_with_8bit_adamw(rank16):
    out, result = rank16
    run = out / "lora-r16-all-linear-adamw-8bit"
    record = json.loads((run / store.MANIFEST).read_text())
    if result.returncode == 3:  # bitsandbytes without an 8-bit optimizer kernel for this CPU
        assert record["status"] == "unsupported" and "adamw-8bit" in record["reason"]
        pytest.skip(f"unsupported here: {record['reason']}")
    assert result.returncode == 0, result.stderr
    config = get_preset("tiny").config
    shapes = linear_shapes(config)
    assert record["inventory"]["trainable_params"] == sum(16 * (a + b) for a, b in shapes)
    assert record["settings"]["lora_r"] == 16 and record["settings"]["optimizer"] == "adamw-8bit"
    assert record["model"]["optimizer"] == "AdamW8bit"
    state = sum(r["bytes"] for r in record["inventory"]["rows"] if r["owner"] == "optimizer_state")
    tensors = [n for a, b in shapes for n in (16 * a, b * 16)]  # lora_A (r x in), lora_B (out x r)
    assert state == sum(adamw_8bit_state(n) for n in tensors) + 2 * 256 * 4  # and the two shared quantile maps
    bd = breakdown([run])
    p = bd.predicted.set_index("category")
    for category in ("parameters_trainable", "parameters_frozen", "optimizer_state", "gradients"):
        assert p.loc[category, "error"] == 0, p
    assert abs(p.loc["activations", "error"]) <= 0.15


@pytest.mark.long
def test_fp4_without_double_quantization(tmp_path):
    result = run_cli("record", "qlora", "--quant-type", "fp4", "--no-double-quant", *FAST, "-o", str(tmp_path))
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "qlora-fp4-no-dq" / store.MANIFEST).read_text())
    found = record["model"]["found"]
    assert found["quantization"] == "fp4" and found["double_quant"] is False  # read back from bitsandbytes
    # Without double quantization each 64-value block keeps an fp32 absmax.
    absmax = [r for r in record["inventory"]["rows"] if r["detail"] == "quant_state.absmax"]
    quantized = record["inventory"]["quantized_params"]
    assert sum(r["bytes"] for r in absmax) == 4 * quantized // 64
    assert not [r for r in record["inventory"]["rows"] if "state2" in r["detail"]]


def test_estimate_any_config_directory_with_settings(tmp_path):
    """The issue's example, on a Llama-3.2-3B-shaped config directory: no weights, only config.json."""
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 3072,
              "intermediate_size": 8192, "num_hidden_layers": 28, "num_attention_heads": 24,
              "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "hidden_act": "silu",
              "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    out = invoke("estimate", "qlora_gc", "--model", str(tmp_path), "--lora-rank", "64", "--lora-targets",
                  "all-linear", "--seq-len", "4096", "--batch-size", "2", "--optimizer", "paged-adamw-8bit",
                  "--format", "json")
    assert out.returncode == 0, out.stderr
    (e,) = json.loads(out.stdout)
    assert e["method"] == "qlora_gc-r64-all-linear-paged-adamw-8bit"
    shapes = linear_shapes(config)
    assert e["params"]["trainable"] == sum(64 * (a + b) for a, b in shapes)
    state = e["instants"]["optimizer"]["optimizer_state"]
    assert state == sum(adamw_8bit_state(n) for a, b in shapes for n in (64 * a, b * 64)) + 2 * 256 * 4
    assert any("unified memory" in n for n in e["notes"])


@pytest.mark.parametrize("args, message", [
    (["full", "--lora-rank", "16"], "--lora-rank applies to LoRA methods"),
    (["lora", "--precision", "fp8"], "valid values are auto, fp32"),
    (["lora_zero2", "--offload", "optimizer+params"], "ZeRO-3 only"),
])
def test_settings_that_make_no_sense_exit_2(args, message, tmp_path):
    for command in (["record", *args, *FAST, "-o", str(tmp_path)], ["estimate", *args]):
        out = invoke(*command)
        assert out.returncode == 2 and message in out.stderr.replace("\n", " "), (command, out.stderr)
    assert not any(tmp_path.iterdir())


@pytest.mark.long
def test_the_reports_command_records_the_same_run_again(tmp_path):
    """The report's reproduction command is built from each run's own settings (RunSettings.to_argv): run as
    printed, it records a run with the same name and the same settings."""
    import shlex

    from profkit.report.document import record_commands

    first, again = tmp_path / "first", tmp_path / "again"
    result = run_cli("record", "lora", "--lora-rank", "4", "--lora-targets", "q_proj,v_proj", "--seq-len", "32",
                     *FAST, "-o", str(first))
    assert result.returncode == 0, result.stderr
    (command,) = record_commands(breakdown([first]))
    assert "--lora-rank 4" in command and "--lora-targets q_proj,v_proj" in command and "--seq-len 32" in command
    argv = shlex.split(command)
    assert argv[:2] == ["profkit", "record"]
    result = run_cli(*argv[1:], "-o", str(again))
    assert result.returncode == 0, result.stderr
    (run,) = [p.name for p in first.iterdir() if not p.name.startswith(".")]
    settings = [json.loads((d / run / store.MANIFEST).read_text())["run_settings"] for d in (first, again)]
    assert settings[0] == settings[1]
