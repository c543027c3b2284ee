import subprocess
import sys
from dataclasses import replace

import pytest

from profkit.methods import METHODS, UnknownMethodError, get_method, qlora, resolve, with_gc

TRAINING = ["full", "full_gc", "lora", "lora_gc", "qlora", "qlora_gc", "lora_zero2", "lora_zero3", "lora_zero2_gc",
            "lora_zero3_gc", "qlora_zero2", "qlora_zero3", "qlora_zero2_gc", "qlora_zero3_gc"]


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
    assert m.learning_rate == (2e-5 if name.startswith("full") else 2e-4)


def test_variants_are_derived_in_a_line():
    assert with_gc(qlora()) == replace(METHODS["qlora_gc"])
    assert METHODS["qlora_gc"].lora_r == 8 and METHODS["qlora_gc"].lora_alpha == 16


def test_unknown_method_lists_valid_names():
    with pytest.raises(UnknownMethodError) as exc:
        resolve(["lora", "lroa"])
    assert "lroa" in str(exc.value) and "qlora_zero3_gc" in str(exc.value)


def test_registry_imports_no_torch():
    code = "import sys, profkit.methods, profkit.presets, profkit.store; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_analysis_imports_no_torch():
    code = ("import sys, profkit.analyze, profkit.report.tables; "
            "assert 'torch' not in sys.modules, 'analysis must run without torch'")
    subprocess.run([sys.executable, "-c", code], check=True)
