"""The stack a run uses (``core.stack``) and what it implies (``predict.mechanisms``): read from the command line,
named stacks, the installed packages and a run's manifest; each mechanism derived from it in one place."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from profkit.cli import app
from profkit.core.methods import get_method, with_overrides
from profkit.core.stack import LOOPS, PACKAGES, Stack, StackError, presets, version_tuple
from profkit.predict.mechanisms import MOE_4BIT, NotModelled, derive, stacked

LLAMA = {"model_type": "llama", "max_position_embeddings": 4096, "hidden_size": 64, "num_attention_heads": 4}


def test_installed_is_what_metadata_says_and_named_as_such():
    from importlib import metadata

    stack = Stack.installed()
    assert stack.transformers == metadata.version("transformers") and stack.torch == metadata.version("torch")
    assert stack.origin["transformers"] == "installed" and stack.loop == "profkit" and stack.engine == "loop"


def test_pairs_over_a_named_stack_over_the_installed():
    stack = Stack.installed().over(Stack.parse("litgpt,transformers=4.40,bitsandbytes=0.42.0"))
    assert (stack.loop, stack.transformers, stack.bitsandbytes) == ("litgpt", "4.40", "0.42.0")
    assert stack.origin == {**stack.origin, "loop": "stack litgpt", "transformers": "command line"}
    assert stack.peft == Stack.installed().peft and stack.origin["peft"] == "installed"
    assert stack.describe().startswith("loop litgpt (stack litgpt); transformers 4.40, bitsandbytes 0.42.0 "
                                       "(command line)")
    assert stack.to_json()["transformers"] == {"value": "4.40", "from": "command line"}


@pytest.mark.parametrize("text, message", [
    ("litgtp", "unknown stack 'litgtp'; named stacks are trainer, axolotl"),
    ("transformer=4.4", "unknown stack part transformer; valid parts are torch, transformers"),
    ("transformers=latest", "transformers=latest: not a version"),
    ("loop=unsloth", "loop 'unsloth': valid loops are profkit, trainer"),
    ("fsdp=fsdp3", "fsdp 'fsdp3': valid values are fsdp2, fsdp1"),
    ("transformers=", "give a value"),
])
def test_a_bad_stack_is_refused_naming_the_valid_values(text, message):
    with pytest.raises(StackError, match=re.escape(message)):
        Stack.parse(text)


def test_every_named_stack_reads_and_says_what_it_is():
    for name, entry in presets().items():
        stack = Stack.parse(name)
        assert stack.loop in LOOPS and entry["what"] and entry["source"]
        assert set(stack.origin.values()) == {f"stack {name}"}


def test_a_manifest_gives_its_versions_and_its_engines_loop():
    stack = Stack.from_manifest({"transformers": "4.57.1", "python": "3.11", "datasets": "3.0", "peft": None},
                                "trainer")
    assert (stack.transformers, stack.peft, stack.loop, stack.engine) == ("4.57.1", None, "trainer", "trainer")
    assert Stack.from_manifest({}, "session").loop == "other"


def test_a_bound_reads_as_the_release_before_it():
    assert version_tuple("<4.36 (the figure's date)") == (4, 35)
    assert version_tuple("4.35.0.dev0") == (4, 35) and version_tuple("not stated") is None


# One row per mechanism: the stack, the method, what it calls for (None: nothing), the note's telling words.
MECHANISMS = [
    ("transformers=4.47", "lora", {"loss": "fp32-shifted"}, "transformers 4.47 computed it for llama"),
    ("transformers=4.45", "lora", {"loss": "fp32-shifted"}, "before 4.46 the model upcast its logits"),
    ("transformers=4.49", "lora", {}, None),
    ("transformers=4.35", "infer_fp16", {"prefill_logits": "all-fp32", "kv_cache": "tuples", "attention": "eager",
                                         "buffers_of": "4.35"}, "generate() as transformers 4.35 ran it"),
    ("transformers=4.40", "lora", {"loss": "fp32-shifted", "buffers_of": "4.40"}, "--buffers-of 4.40"),
    ("bitsandbytes=0.43.1", "qlora", {"bnb_keeps_inputs": True}, "fixed in 0.43.2"),
    ("bitsandbytes=0.43.2", "qlora", {}, None),
    ("litgpt", "qlora", {"quantize_head": True, "kbit_upcast": False, "loss": "logits-dtype",
                         "keeps_previous_logits": True}, "litgpt's loop keeps the previous step's logits"),
    ("llama-recipes", "lora_gc", {"keeps_kv_cache": True}, "checkpointing by FSDP's wrapper"),
    ("llama-recipes", "lora", {}, None),  # without checkpointing attention saves those keys and values anyway
    ("trainer", "lora_fsdp-ga4", {"grad_sync": "last"}, "under no_sync"),
    ("torchtune", "lora_fsdp-ga4", {}, None),
    ("fsdp=fsdp1", "lora_fsdp-ga4", {"grad_sync": "last"}, "under no_sync"),
]


@pytest.mark.parametrize("text, name, expected, words", MECHANISMS, ids=[f"{r[0]}-{r[1]}" for r in MECHANISMS])
def test_each_mechanism_is_derived_from_the_stack(text, name, expected, words):
    base, _, accumulation = name.partition("-ga")
    method = get_method(base)
    if accumulation:
        method = with_overrides(method, grad_accum=int(accumulation))
    stack = Stack.installed().over(Stack.parse(text))
    derived = derive(stack, method, LLAMA)
    assert derived.settings == expected
    if words:
        assert any(words in note for note in derived.notes), derived.notes
    with_overrides(method, **derived.settings)  # each applies to the method it was derived for


def test_a_setting_given_is_never_replaced_and_the_label_names_only_it():
    stack = Stack.installed().over(Stack.parse("litgpt"))
    derived = derive(stack, get_method("lora"), LLAMA, given={"loss"})
    assert "loss" not in derived.settings and derived.settings["keeps_previous_logits"]
    [(method, notes)] = stacked([with_overrides(get_method("lora"), lora_rank=16)], {"lora_rank": 16}, stack, LLAMA)
    assert method.keeps_previous_logits and method.lora_r == 16 and method.label == "lora-r16" and notes


def test_a_4bit_mixture_of_experts_before_transformers_5_is_not_modelled():
    moe = {**LLAMA, "model_type": "mixtral", "num_local_experts": 8}
    with pytest.raises(NotModelled, match=re.escape(MOE_4BIT)):
        derive(Stack.installed().over(Stack.parse("transformers=4.48.1")), get_method("qlora"), moe)
    assert derive(Stack.installed(), get_method("qlora"), moe).settings == {}
    with pytest.raises(NotModelled, match="4-bit MoE"):  # no version known: not today's either
        derive(Stack(), get_method("qlora"), moe)


def test_the_package_list_is_the_manifests():
    from profkit.store.manifest import LIBRARIES

    assert set(PACKAGES) - {"trl"} <= set(LIBRARIES)


def _estimate(*argv):
    return CliRunner().invoke(app, ["estimate", "lora", "--preset", "micro", *argv], env={"COLUMNS": "80"})


def test_an_estimate_names_its_stack_first_and_in_json():
    result = _estimate("--stack", "litgpt,transformers=4.44")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("stack: loop litgpt (stack litgpt); transformers 4.44 (command line)")
    assert "litgpt's loop keeps the previous step's logits" in " ".join(result.output.split())
    [out] = json.loads(_estimate("--stack", "litgpt", "--format", "json").output)
    assert out["stack"]["loop"] == {"value": "litgpt", "from": "stack litgpt"}
    assert out["stack"]["transformers"]["from"] == "installed"
    [plain] = json.loads(_estimate("--format", "json").output)
    assert plain["peak_bytes"] < out["peak_bytes"]  # litgpt's loop holds the previous step's logits


def test_a_bad_stack_on_the_command_line_exits_2():
    result = _estimate("--stack", "unsloth")
    assert result.exit_code == 2 and "--stack: unknown stack 'unsloth'; named stacks are" in result.output


def test_estimate_help_shows_at_most_25_options_and_hides_what_the_stack_derives():
    text = CliRunner().invoke(app, ["estimate", "--help"], env={"COLUMNS": "200"}).output
    shown = re.findall(r"^\s*[│|]?\s*(-\w, )?(--[\w-]+)", text, re.M)
    assert 10 < len(shown) <= 25, shown
    assert "--keeps-previous-logits" not in text and "--stack" in text
    # hidden, still accepted: an expert forces a mechanism the stack does not imply
    assert _estimate("--keeps-previous-logits").exit_code == 0
