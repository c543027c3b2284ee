import json
import re
from dataclasses import asdict

import pytest

from profkit.core.methods import METHODS, OverrideError, UnknownMethodError, get_method, resolve, with_overrides
from tests.conftest import invoke

TRAINING = ["full", "full_gc", "lora", "lora_gc", "qlora", "qlora_gc", "lora_zero2", "lora_zero3", "lora_zero2_gc",
            "lora_zero3_gc", "qlora_zero2", "qlora_zero3", "qlora_zero2_gc", "qlora_zero3_gc", "full_zero2",
            "full_zero3", "full_zero2_gc", "full_zero3_gc", "full_fsdp", "full_fsdp_gc", "lora_fsdp", "lora_fsdp_gc",
            "qlora_fsdp", "qlora_fsdp_gc"]


def test_registry_has_the_study_matrix():
    assert sorted(METHODS) == sorted(TRAINING + ["infer_fp16", "infer_int4"])


@pytest.mark.parametrize("name", TRAINING)
def test_names_match_settings(name):
    m = get_method(name)
    assert m.kind == "train"
    assert m.gradient_checkpointing == name.endswith("_gc")
    assert m.quantization == ("nf4" if name.startswith("qlora") else None)
    assert m.adapter == ("none" if name.startswith("full") else "lora")
    assert m.zero_stage == (2 if "zero2" in name else 3 if "zero3" in name else 0)
    assert m.fsdp == ("fsdp" in name) and m.sharded == ("zero" in name or "fsdp" in name)
    assert m.learning_rate == (2e-5 if name.startswith("full") else 2e-4)


@pytest.mark.parametrize("variant, base, changed", [
    ("qlora_gc", "qlora", {"gradient_checkpointing"}),
    ("lora_zero3", "lora", {"zero_stage"}),
    ("qlora_zero2_gc", "qlora_gc", {"zero_stage"}),
    ("full_zero3_gc", "full", {"zero_stage", "gradient_checkpointing"}),
    ("qlora", "lora", {"quantization"}),
    ("infer_int4", "infer_fp16", {"quantization"}),
])
def test_a_variant_differs_from_its_base_in_what_its_name_says_only(variant, base, changed):
    a, b = asdict(METHODS[variant]), asdict(METHODS[base])
    assert {k for k in a if a[k] != b[k]} - {"name", "description"} == changed


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownMethodError) as exc:
        resolve(["lora", "lroa"])
    assert "lroa" in str(exc.value) and "qlora_zero3_gc" in str(exc.value)


@pytest.mark.parametrize("method, overrides, message", [
    ("full", {"lora_rank": 16}, "--lora-rank applies to LoRA methods; full trains no adapter"),
    ("lora", {"quant_type": "fp4"}, "--quant-type applies to 4-bit methods"),
    ("lora", {"double_quant": False}, "--double-quant applies to 4-bit methods"),
    ("lora", {"offload": "optimizer"}, "--offload applies to sharded methods"),
    ("lora_zero2", {"offload": "optimizer+params"}, "ZeRO-3 only"),
    ("infer_fp16", {"optimizer": "sgd"}, "applies to training methods"),
    ("lora", {"optimizer": "lion"}, "valid values are adamw, adamw-8bit, paged-adamw-8bit, sgd"),
    ("lora", {"lora_targets": "all-linear,q_proj"}, "all-linear stands alone"),
    ("lora", {"lora_dropout": 1.5}, "--lora-dropout 1.5: outside [0, 0.99]"),
    ("lora", {"lora_rank": 0}, "--lora-rank 0: outside [1, ...)"),
    ("infer_int4", {"grad_accum": 4}, "--grad-accum applies to training methods"),
    ("full", {"grad_accum": 0}, "--grad-accum 0: outside [1, ...)"),
    ("full_fsdp", {"grad_sync": "last"}, "--grad-sync last: there is nothing to hold back without accumulation"),
    ("full_zero3", {"grad_sync": "last", "grad_accum": 2}, "--grad-sync applies to FSDP methods"),
])
def test_a_setting_that_makes_no_sense_for_the_method_is_refused(method, overrides, message):
    with pytest.raises(OverrideError, match=re.escape(message)):
        with_overrides(get_method(method), **overrides)


def test_overrides_name_the_run_and_keep_the_registry_name():
    m = with_overrides(get_method("qlora_gc"), lora_rank=64, lora_targets="all-linear", optimizer="paged-adamw-8bit")
    assert m.name == "qlora_gc" and m.label == "qlora_gc-r64-all-linear-paged-adamw-8bit"
    assert m.lora_r == 64 and m.lora_targets == ("all-linear",) and m.settings()["optimizer"] == "paged-adamw-8bit"
    same = with_overrides(get_method("lora"), lora_rank=8, optimizer="adamw")  # the registry's own values
    assert same.label == "lora" and same == get_method("lora")


def test_methods_at_80_columns_cuts_no_name():
    """What the user types after `profkit record` is printed whole, at 80 columns as at any width."""
    out = invoke("methods", env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in out.stdout
    table_rows = [line.split("│")[1].strip() for line in lines if line.startswith("│")]
    assert table_rows == list(METHODS)


def test_methods_lists_the_gpus_gpu_takes():
    from profkit.core import gpus

    listed = json.loads(invoke("methods", "--gpus", "--json").stdout)
    assert [g["name"] for g in listed] == list(gpus.GPUS)
    table = invoke("methods", "--gpus", env={"COLUMNS": "80"})
    assert "RTX-4090" in table.stdout and all(len(line) <= 80 for line in table.stdout.splitlines())
