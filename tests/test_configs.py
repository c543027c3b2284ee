"""The users' own config files (``profkit.configs``): every file of the corpus's used split (tests/data/configs,
INDEX.csv) read or refused with its reason; what each framework's keys become; bad files named with what is wrong;
models found without the network; ``estimate --config``."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.configs import ConfigError, read_configs
from profkit.configs.models import resolve_model
from profkit.configs.plan import method_with_settings
from profkit.core.methods import METHODS
from profkit.core.presets import get_preset
from profkit.core.stack import Stack
from profkit.predict.mechanisms import stacked
from profkit.predict.published import read_figure

CORPUS = Path(__file__).parent / "data" / "configs"
INDEX = list(csv.DictReader((CORPUS / "INDEX.csv").open()))
USED = [r for r in INDEX if r["split"] == "used"]


@pytest.mark.parametrize("row", USED, ids=[r["file"] for r in USED])
def test_every_used_config_is_read_or_refused_with_its_reason(row):
    path = CORPUS / row["file"]
    try:
        reading = read_configs([path])
    except ConfigError as exc:
        assert str(path) in str(exc) and "Error" not in str(exc), exc
        return
    assert reading.method in METHODS and reading.frameworks[0] in row["framework"].replace("trl", "trainer")
    if row["kind"] == "training-recipe":
        assert reading.batch_size and reading.model, reading


def _read(*names: str):
    return read_configs([CORPUS / n for n in names])


def test_axolotl_qlora():
    r = _read("axolotl/llama-3.2-1b-qlora.yml")
    assert (r.method, r.model, r.batch_size, r.seq_len) == ("qlora_gc", "NousResearch/Llama-3.2-1B", 2, 2048)
    assert r.settings | {"lora_rank": 32, "grad_accum": 4, "optimizer": "adamw-8bit", "attention": "flash",
                         "precision": "bf16-mixed"} == r.settings
    assert len(r.settings["lora_targets"].split(",")) == 7 and r.stack == {"loop": "axolotl"}


def test_torchtune_qlora_names_the_hugging_face_model_and_its_lora_layers():
    r = _read("torchtune/llama3_1-8b-qlora-single-device.yaml")
    assert (r.method, r.model, r.batch_size, r.seq_len) == ("qlora_gc", "meta-llama/Llama-3.1-8B", 2, None)
    assert r.settings["lora_targets"] == "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert r.settings["loss"] == "chunked" and r.settings["precision"] == "bf16-pure"
    assert r.stack["loop"] == "torchtune"


def test_litgpt_qlora_is_lightnings_4bit_in_pure_bf16():
    r = _read("litgpt/llama-3.1-8b-qlora.yaml")
    assert (r.method, r.batch_size, r.seq_len, r.world_size) == ("qlora", 2, 512, 1)
    assert r.settings["quant_type"] == "nf4" and r.settings["precision"] == "bf16-pure"
    assert r.settings["lora_targets"] == "q_proj,v_proj" and r.settings["grad_accum"] == 4
    assert r.stack["loop"] == "litgpt"


def test_litgpt_on_several_devices_shards_and_checkpoints_every_block():
    r = _read("litgpt/gemma-2b-full.yaml")
    assert (r.method, r.world_size, r.stack) == ("full_fsdp_gc", 4, {"loop": "litgpt", "fsdp": "fsdp1"})


def test_a_trainer_config_with_accelerates_fsdp_and_a_deepspeed_file():
    r = _read("trl/zephyr-7b-mistral-sft-qlora.yaml", "accelerate/trl-fsdp1.yaml")
    assert r.method == "qlora_fsdp_gc" and r.world_size == 8 and r.stack == {"loop": "trainer", "fsdp": "fsdp1"}
    r = _read("accelerate/trl-deepspeed-zero3.yaml", "deepspeed/axolotl-zero3-bf16-offload-all.json")
    assert r.method == "full_zero3" and r.settings["offload"] == "optimizer+params"


def test_llama_factory_and_a_peft_adapter():
    r = _read("llama-factory/qwen3-4b-qlora-bnb4-sft.yaml")
    assert (r.method, r.batch_size, r.seq_len) == ("qlora_gc", 1, 2048)
    assert r.settings["lora_targets"] == "all-linear" and r.settings["grad_accum"] == 8
    r = _read("peft/llama-3.2-3b-loha-r32.json")
    assert r.method == "lora" and r.settings["lora_rank"] == 32
    assert any("LOHA: an adapter profkit does not model; estimated as LoRA" in n for n in r.notes)


def test_what_is_not_modelled_is_noted_and_what_is_unknown_listed(tmp_path):
    config = tmp_path / "run.yml"
    config.write_text("base_model: org/model\nmicro_batch_size: 2\nsequence_len: 512\nrl: dpo\n"
                      "activation_offloading: true\nmade_up_key: 3\nwandb_project: x\n")
    r = read_configs([config])
    assert any("rl: a preference or RL trainer" in n for n in r.notes)
    assert any("activation_offloading" in n for n in r.notes)
    assert r.unknown == ["run.yml: made_up_key"]


@pytest.mark.parametrize("name, text, message", [
    ("bad.yaml", "base_model: x\nmicro_batch_size: [2\n", "bad.yaml, line 3, column 1: malformed YAML"),
    ("bad.json", '{"zero_optimization": {"stage": 3,}}', "bad.json, line 1, column 35: malformed JSON"),
    ("typed.yml", "base_model: x\nmicro_batch_size: two\n", "typed.yml: micro_batch_size: expected an integer, "
                                                             "got 'two'"),
    ("list.yml", "- a\n- b\n", "a mapping of keys expected at the top, found list"),
    ("other.yml", "foo: 1\n", "not a config profkit reads"),
])
def test_a_bad_file_is_named_with_what_is_wrong(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        read_configs([tmp_path / name])


def test_two_files_that_contradict_each_other_name_both(tmp_path):
    (tmp_path / "a.yml").write_text("model_name_or_path: x\nper_device_train_batch_size: 4\ngradient_accumulation_steps: 2\n")
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2}, "gradient_accumulation_steps": 8}')
    with pytest.raises(ConfigError, match=r"ds.json: gradient_accumulation_steps = 8 contradicts .*a.yml: "
                                          r"gradient_accumulation_steps = 2"):
        read_configs([tmp_path / "a.yml", tmp_path / "ds.json"])


def test_a_deepspeed_file_an_axolotl_config_names_is_read_beside_it(tmp_path):
    (tmp_path / "zero3.json").write_text('{"zero_optimization": {"stage": 3}, "bf16": {"enabled": true}}')
    (tmp_path / "run.yml").write_text("base_model: x\nmicro_batch_size: 1\nsequence_len: 64\ndeepspeed: zero3.json\n")
    assert read_configs([tmp_path / "run.yml"]).method == "full_zero3"
    (tmp_path / "run.yml").write_text("base_model: x\nmicro_batch_size: 1\nsequence_len: 64\ndeepspeed: gone.json\n")
    assert any("names gone.json, not found" in n for n in read_configs([tmp_path / "run.yml"]).notes)


def test_a_model_is_found_locally_in_the_hub_cache_or_not_at_all(tmp_path, monkeypatch):
    local = tmp_path / "ckpt"
    local.mkdir()
    (local / "config.json").write_text("{}")
    assert resolve_model(str(local)) == (local, "local directory")
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert resolve_model("org/tiny") == (snapshot, "Hugging Face cache")
    with pytest.raises(ConfigError, match=r"model 'org/absent' not found: not a local directory .* Hugging Face "
                                          r"cache .* Give its config.json's directory with --model DIR"):
        resolve_model("org/absent")


def _micro_run(tmp_path, extra: str = "sequence_len: 64\n") -> Path:
    model = tmp_path / "micro"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(get_preset("micro").config))
    config = tmp_path / "run.yml"
    config.write_text(f"base_model: {model}\nadapter: lora\nlora_r: 4\nlora_alpha: 8\nmicro_batch_size: 2\n"
                      f"gradient_checkpointing: true\nbf16: true\n{extra}")
    return config


def test_estimate_from_a_config_names_the_config_and_its_stack(tmp_path):
    config = _micro_run(tmp_path)
    result = CliRunner().invoke(app, ["estimate", "--config", str(config), "--format", "json"])
    assert result.exit_code == 0, result.output
    [out] = json.loads(result.stdout)
    assert out["method"] == "lora_gc" and out["settings"]["batch_size"] == 2 and out["settings"]["seq_len"] == 64
    assert out["stack"]["loop"] == {"value": "axolotl", "from": "config run.yml"}
    assert out["settings"]["method"]["lora_r"] == 4 and "from run.yml" in out["notes"]
    text = CliRunner().invoke(app, ["estimate", "--config", str(config), "--batch-size", "3"], env={"COLUMNS": "80"})
    assert text.output.startswith("stack: loop axolotl (config run.yml)")
    assert "--batch-size 3 given: over the config's 2" in " ".join(text.output.split())


def test_estimate_from_a_config_without_a_length_or_with_a_bad_key_exits_2(tmp_path):
    config = _micro_run(tmp_path, extra="")
    result = CliRunner().invoke(app, ["estimate", "--config", str(config)])
    assert result.exit_code == 2 and "no sequence length set" in " ".join(result.output.split())
    config.write_text(config.read_text() + "sequence_len: long\n")
    result = CliRunner().invoke(app, ["estimate", "--config", str(config)])
    assert result.exit_code == 2 and "sequence_len: expected an integer, got 'long'" in " ".join(result.output.split())


def test_the_catalogue_resolves_the_ids_configs_name():
    """The models the corpus's recipes name, as users write them, found in the bundled catalogue."""
    for name in ("NousResearch/Llama-3.2-1B", "meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B-Instruct",
                 "mistralai/Mistral-7B-v0.1", "google/gemma-2-9b"):
        directory, found = resolve_model(name)
        assert "catalogue" in found or found == "Hugging Face cache", (name, found)
        assert json.loads((directory / "config.json").read_text())["model_type"]


def test_torchtunes_recipe_is_read_from_the_launch_line_its_config_begins_with():
    r = _read("torchtune/llama3_2-1b-full-single-device.yaml")
    assert (r.method, r.world_size) == ("full", None)
    r = _read("torchtune/llama3_1-70b-lora-distributed.yaml")  # "tune run --nproc_per_node 8 lora_finetune_distributed"
    assert (r.method, r.world_size, r.stack["fsdp"]) == ("lora_fsdp_gc", 8, "fsdp2")


def test_a_model_is_found_by_its_name_or_its_shapes_name_in_the_catalogue():
    _, found = resolve_model("NousResearch/Llama-3.2-1B")
    assert "matched by its name alone" in found
    _, found = resolve_model("Qwen/Qwen3-4B-Instruct-2507")
    assert "without its variant's words" in found


FIELDS = ("adapter", "quantization", "double_quant", "gradient_checkpointing", "fsdp", "zero_stage", "lora_r",
          "lora_alpha", "lora_targets", "precision", "optimizer", "loss", "kbit_upcast", "bnb_keeps_inputs",
          "quantize_head", "keeps_previous_logits")


def test_litgpts_published_configs_read_as_the_hand_set_columns_say():
    """The config_hub YAMLs behind litgpt's published peaks (used split): read from the file, with the stack the
    source states, the method is the one wide.csv's hand-set columns give, field by field (the file also knows
    its dropout and accumulation, which the columns do not state)."""
    data = Path(__file__).parent / "data" / "published"
    models = json.loads((data / "models.json").read_text())
    wide = pd.read_csv(data / "wide.csv", dtype=str, keep_default_na=False)
    compared = 0
    for index in csv.DictReader((CORPUS / "published-litgpt" / "INDEX.csv").open()):
        row = wide.iloc[int(index["row"])]
        figure = read_figure(row, models)
        if index["split"] != "used" or figure.method is None:
            continue
        reading = read_configs([CORPUS / "published-litgpt" / index["file"]])
        bnb = row["bitsandbytes"].split(" ")[0]
        stack = Stack.installed().over(Stack.from_parts({"bitsandbytes": bnb} if bnb else {}, "source")).over(
            Stack.from_parts(reading.stack, "config"))
        [(method, _)] = stacked([method_with_settings(reading.method, dict(reading.settings), [])], reading.settings, stack,
                                models[figure.model]["config"])
        assert {f: getattr(method, f) for f in FIELDS} == {f: getattr(figure.method, f) for f in FIELDS}, index
        assert (reading.batch_size, reading.seq_len) == (figure.batch_size, figure.seq_len)
        compared += 1
    assert compared >= 25, compared
