"""The command line is made from the settings dataclasses: every ``RunSettings`` option and every method setting
parses back from ``RunSettings.to_argv()`` into the settings it came from (in process, through typer)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from typer.testing import CliRunner

from profkit.cli import COMMANDS, summary_line, app, record_cmd
from profkit.core.methods import SETTINGS
from profkit.core.settings import RunSettings


@pytest.fixture
def parsed(monkeypatch):
    """What ``profkit record`` hands the runner for a command line, without recording anything."""
    seen: list[RunSettings] = []

    def fake_record(methods, base, root, observer=None):
        seen.append(base)
        return []

    monkeypatch.setattr(record_cmd.runner, "record", fake_record)

    def parse(argv: list[str]) -> RunSettings:
        result = CliRunner().invoke(app, ["record", *argv, "-o", "unused"])
        assert result.exit_code == 0, result.output
        return seen.pop()
    return parse


SETTINGS_TO_TRY = [
    RunSettings(method="lora"),
    RunSettings(method="infer_int4", preset="micro", device="cpu", batch_size=3, seq_len=24, max_new_tokens=5,
                warmup_steps=0, timed_steps=1, profiled_steps=3,
                overrides={"prefill_logits": "all-fp32", "kv_cache": "tuples"}),
    RunSettings(method="qlora_zero3", engine="trainer", nproc=2, repeats=3,
                overrides={"lora_rank": 4, "lora_alpha": 8, "lora_dropout": 0.1, "lora_targets": "q_proj,v_proj",
                           "quant_type": "fp4", "double_quant": False, "precision": "bf16-mixed",
                           "optimizer": "sgd", "attention": "eager", "offload": "optimizer+params",
                           "kbit_upcast": False, "loss": "logits-dtype", "bnb_keeps_inputs": True,
                           "quantize_head": True, "keeps_previous_logits": True, "quantize_experts": True}),
    RunSettings(method="lora_fsdp", nproc=2, overrides={"reshard_after_forward": False, "offload": "optimizer+params",
                                                         "grad_accum": 4, "grad_sync": "last", "fsdp_flat": True}),
    RunSettings(method="lora_gc", overrides={"keeps_kv_cache": True, "buffers_of": "4.35.2"}),
]


def test_every_setting_is_tried():
    """The table above sets every option the command line has, so a new one cannot go untested."""
    varied = {name for name, (_, default) in RunSettings.options().items()
              if any(getattr(s, name) != default for s in SETTINGS_TO_TRY)}
    assert varied | {"model_path", "dataset_path"} == set(RunSettings.options())  # paths: below
    assert {k for s in SETTINGS_TO_TRY for k in s.overrides} == set(SETTINGS)


@pytest.mark.parametrize("settings", SETTINGS_TO_TRY, ids=lambda s: s.method)
def test_to_argv_parses_back_into_the_same_settings(parsed, settings):
    back = parsed(settings.to_argv())
    assert replace(back, method=settings.method) == settings  # the runner's base names no method


def test_paths_are_stored_resolved(parsed, tmp_path, monkeypatch):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    (tmp_path / "data.txt").write_text("hello")
    monkeypatch.chdir(tmp_path)
    back = parsed(["lora", "--model", "ckpt", "--dataset", "data.txt"])
    assert (back.model_path, back.dataset_path) == (str(tmp_path / "ckpt"), str(tmp_path / "data.txt"))
    assert parsed(replace(back, method="lora").to_argv()) == back


@pytest.mark.parametrize("argv, message", [
    (["--device", "tpu"], "--device 'tpu': valid values are auto, cpu, cuda"),
    (["--engine", "accelerate"], "--engine 'accelerate': valid values are loop, trainer"),
    (["--preset", "gpt5"], "--preset 'gpt5': valid values are micro, tiny"),
    (["--optimizer", "lion"], "--optimizer 'lion': valid values are adamw, adamw-8bit"),
])
def test_a_value_outside_an_options_choices_exits_2_naming_them(parsed, argv, message):
    for command in ("record", "estimate"):
        if command == "estimate" and argv[0] in ("--device", "--engine"):
            continue  # estimate's --device is its own option; it has no --engine
        result = CliRunner().invoke(app, [command, "lora", *argv])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


@pytest.mark.parametrize("command", [[]] + [[name] for name, _, _ in COMMANDS], ids=lambda c: c[0] if c else "profkit")
def test_every_help_fits_80_columns_with_nothing_cut(command, monkeypatch):
    """At 80 columns every option name and every command's line is whole (rich's tables had cut
    --keeps-previous-logits and --no-reshard-after-forward to an ellipsis) and no line is wider."""
    monkeypatch.setenv("COLUMNS", "80")
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert "…" not in result.output and max(len(line) for line in result.output.splitlines()) <= 80
    if not command:  # each command's line whole, to its full stop (click alone cuts it at 45 characters)
        flat = " ".join(result.output.split())
        assert all(f"{name} {summary_line(function.__doc__)}" in flat for name, function, _ in COMMANDS)


def test_a_model_the_catalogue_resolved_is_named_by_its_id_not_the_cache_path():
    from profkit.cli.common import model_label
    from profkit.configs.models import resolve_model
    from profkit.core.settings import RunSettings

    directory, _ = resolve_model("meta-llama/Llama-2-7b-hf")  # an id of the catalogue's own
    assert model_label(RunSettings(method="lora", model_path=str(directory))) == "meta-llama/Llama-2-7b-hf"
    assert model_label(RunSettings(method="lora", model_path="/data/ckpt")) == "/data/ckpt"
    assert model_label(RunSettings(method="lora", preset="micro")) == "micro"
