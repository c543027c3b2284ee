"""What a stack does that profkit's loop with today's libraries does not, derived in one place: from a ``Stack`` (the
library versions and the loop) and a model's configuration, the method settings that reproduce it (the loss form,
generate()'s logits and caches, the attention a version picks, the per-layer tables older transformers built,
bitsandbytes' kept inputs, the previous step's logits a loop keeps, a KV cache built in training, FSDP1's
accumulation under no_sync, the 4-bit LM head of Lightning's plugin) and a note for each. A setting the user or
their config gave is never replaced.

Every rule was read from the libraries' own code at the versions named; where profkit models no form for a
stack's behaviour, ``NotModelled`` says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from profkit.core.methods import Method, with_overrides
from profkit.core.stack import Stack
from profkit.model.legacy_buffers import builds_tables


class NotModelled(ValueError):
    """A stack's behaviour profkit does not model; the message says which."""


@dataclass
class Mechanisms:
    """The settings a stack calls for (``with_overrides``' names) and the notes that say why."""

    settings: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def set(self, name: str, value, note: str = "") -> None:
        self.settings[name] = value
        if note:
            self.notes.append(note)


# What profkit builds (transformers 5) is not what a figure from transformers 4 ran.
MOE_4BIT = ("4-bit MoE: transformers 5 keeps the experts as 3-D tensors that bitsandbytes does not quantize (fp32 "
            "after peft's k-bit preparation), where transformers 4 quantized one Linear per expert: another "
            "computation than the figure's")

# The loss transformers computed before 4.49, read from its 4.41.2, 4.45.2 and 4.48.1 sources. 4.46-4.48: the models
# that call ForCausalLMLoss (an fp32 copy of the logits, then a shifted copy of it); Granite-MoE and GPT-Neo upcast
# the same way in their own code. All of them: the models whose own loss took the logits as they came (a shifted
# copy in their dtype). Before 4.46 the first group upcast inside the model (``logits.float()``) and took the same
# shifted fp32 copy; its 16-bit logits were freed at once, so the form holds one 16-bit copy of the logits more than
# those versions did, at the end of forward only (the estimate says so).
FP32_SHIFTED_4_46 = frozenset(
    ["aria", "bamba", "cohere", "cohere2", "diffllama", "emu3", "gemma", "gemma2", "glm", "granite", "jamba", "jetmoe", "llama", "mistral", "mixtral", "mllama", "nemotron", "olmo", "olmo2", "olmoe", "persimmon", "phi", "phi3", "phimoe", "qwen2", "qwen2_moe", "stablelm", "starcoder2", "zamba", "granitemoe", "gpt_neo"])
LOGITS_DTYPE_BEFORE_4_49 = frozenset({"gpt_bigcode", "opt", "bloom", "falcon", "gpt_neox"})

UPCAST_IN_FORWARD = (": before 4.46 the model upcast its logits in its forward and freed the 16-bit ones, one "
                     "16-bit copy of the logits fewer at the end of forward than this form holds")
EAGER_NOTE = ("attention op by op (--attention eager): transformers {} predates attn_implementation (4.36), so its "
              "models kept each layer's attention matrix where SDPA or flash attention keeps none")
BUFFERS_NOTE = ("the tables transformers {} built in every layer (rotary cos and sin tables over every position, "
                "causal-mask tables), which the installed one does not (--buffers-of {})")
# Models whose training forward went on building the KV cache under their own gradient checkpointing (use_cache as
# the configuration set it, true by default), until the release that turned it off there: GPTBigCode until 4.53,
# where its layers became GradientCheckpointingLayer (read in each release's modeling code, 4.31 to 4.53).
CACHE_UNDER_CHECKPOINTING = {"gpt_bigcode": (4, 53)}
CACHE_NOTE = ("transformers {} built {}'s KV cache in training under its own gradient checkpointing, and the "
              "outputs held it to the loss (--keeps-kv-cache)")
# Loops that accumulate under FSDP with no_sync (set_requires_gradient_sync(False)) until the last micro-batch:
# accelerate's accumulate(), so the Trainer's and its subclasses'; Lightning's (litgpt). torchtitan's and
# torchtune's reduce-scatter every micro-batch.
ACCUMULATE_UNDER_NO_SYNC = ("trainer", "axolotl", "accelerate", "litgpt")
KEEPS_PREVIOUS_LOGITS = ("litgpt", "llama-recipes-2023")
# Loops that apply checkpointing outside the model (FSDP's checkpoint wrapper) while use_cache stays on.
CACHE_UNDER_OUTER_CHECKPOINTING = ("llama-recipes", "llama-recipes-2023")


def _of(name: str) -> str:
    """A loop's name as a possessive: litgpt's, llama-recipes'."""
    return name + ("'" if name.endswith("s") else "'s")


def experts(config: dict) -> int:
    return max(int(config.get(key) or 0) for key in ("num_local_experts", "num_experts", "n_routed_experts"))


def loss_of_version(version: str | None, model_type: str) -> str:
    """The ``--loss`` form a transformers version computed for ``model_type``; ``NotModelled`` where profkit has
    none for it. No version stated: transformers 5's."""
    stated = Stack(transformers=version).version("transformers")
    if stated is None or stated >= (4, 49):
        return "fp32"
    if model_type in LOGITS_DTYPE_BEFORE_4_49:
        return "logits-dtype"
    if model_type in FP32_SHIFTED_4_46:  # before 4.46 an upcast in the model's forward, then the same shifted copy
        return "fp32-shifted"
    raise NotModelled(f"the loss transformers {version} computed for {model_type or 'this model'} is not one of the "
                      "forms profkit models (--loss)")


def generate_of_version(version: str | None, model_type: str) -> dict[str, str]:
    """How a transformers version ran generate(), where it differs from today's (``Method.prefill_logits`` and
    ``kv_cache``): before 4.45 the prompt pass computed every position's logits, which the Llama family (the models
    4.46 gave ``ForCausalLMLoss``, the upcast moving into it) upcast to fp32 in its forward; before 4.36 each pass
    returned new key and value tuples. No version stated: today's."""
    stated = Stack(transformers=version).version("transformers")
    forms: dict[str, str] = {}
    if stated is not None and stated < (4, 45):
        forms["prefill_logits"] = "all-fp32" if model_type in FP32_SHIFTED_4_46 else "all"
    if stated is not None and stated < (4, 36):
        forms["kv_cache"] = "tuples"
    return forms


def attention_of_version(version: str | None) -> str | None:
    """``eager`` where a transformers version predates ``attn_implementation`` (4.36): its models computed attention
    op by op, each layer keeping its attention matrix for backward; None otherwise (SDPA, transformers' default
    since)."""
    stated = Stack(transformers=version).version("transformers")
    return "eager" if stated is not None and stated < (4, 36) else None


def buffers_of(stack: Stack, model_type: str) -> str | None:
    """The --buffers-of a stack's transformers calls for: its version where that version built per-layer tables for
    ``model_type`` (a bound, only where every version before it did); None elsewhere."""
    stated = stack.version("transformers")
    if stated is None or not builds_tables(model_type, stated, or_earlier=stack.is_bound("transformers")):
        return None
    return f"{stated[0]}.{stated[1]}"


def derive(stack: Stack, method: Method, config: dict, given=()) -> Mechanisms:
    """The settings ``stack`` calls for with ``method`` on a model of ``config`` (a configuration's dict), leaving
    those in ``given`` (set by the user or their config) alone."""
    out = Mechanisms()
    model_type = config.get("model_type", "")
    transformers = stack.version("transformers")
    if method.quantization and experts(config) > 1 and (transformers is None or transformers < (5, 0)):
        raise NotModelled(MOE_4BIT)
    if method.kind == "infer":
        _generation(stack, model_type, given, out)
    else:
        _training(stack, method, config, given, out)
    if "buffers_of" not in given and (tables := buffers_of(stack, model_type)):
        out.set("buffers_of", tables, BUFFERS_NOTE.format(stack.named("transformers"), tables))
    if method.kind == "train":
        _kv_cache_in_training(stack, method, config, given, out)
    return out


def _generation(stack: Stack, model_type: str, given, out: Mechanisms) -> None:
    forms = {k: v for k, v in generate_of_version(stack.transformers, model_type).items() if k not in given}
    if forms:
        out.settings.update(forms)
        out.notes.append(f"generate() as transformers {stack.named('transformers')} ran it ("
                         + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in forms.items()) + ")")
    _attention(stack, given, out)


def _attention(stack: Stack, given, out: Mechanisms) -> None:
    if "attention" not in given and (attention := attention_of_version(stack.transformers)):
        out.set("attention", attention, EAGER_NOTE.format(stack.named("transformers")))


def _training(stack: Stack, method: Method, config: dict, given, out: Mechanisms) -> None:
    if method.quantization:
        _bitsandbytes(stack, given, out)
        if stack.loop == "litgpt":
            if "quantize_head" not in given:
                out.set("quantize_head", True, "the LM head in 4 bits too, quantized from fp16 (--quantize-head), "
                        "as Lightning's bitsandbytes plugin (litgpt's) converts every Linear layer")
            if "kbit_upcast" not in given:
                out.set("kbit_upcast", False, "no peft k-bit preparation (litgpt quantizes with Lightning's "
                        "plugin): the other weights stay in the load dtype (--no-kbit-upcast)")
    if "loss" not in given:
        _loss(stack, config.get("model_type", ""), out)
    if method.fsdp and method.grad_accum > 1 and "grad_sync" not in given and (
            stack.fsdp == "fsdp1" or stack.loop in ACCUMULATE_UNDER_NO_SYNC):
        out.set("grad_sync", "last", "FSDP's accumulation under no_sync (--grad-sync last), as accelerate and "
                "Lightning run it")
    _attention(stack, given, out)
    if stack.loop in KEEPS_PREVIOUS_LOGITS and "keeps_previous_logits" not in given:
        out.set("keeps_previous_logits", True, f"{_of(stack.loop)} loop keeps the previous step's logits, and the graph "
                "behind them, until the next forward returns (--keeps-previous-logits)")


def _bitsandbytes(stack: Stack, given, out: Mechanisms) -> None:
    if "bnb_keeps_inputs" in given:
        return
    release = stack.release("bitsandbytes")
    if release is None:
        out.notes.append("bitsandbytes version not stated: 0.43.2 or later, whose 4-bit layers keep no input for "
                         "backward (earlier ones did: --bnb-keeps-inputs)")
    elif release < (0, 43, 2):
        out.set("bnb_keeps_inputs", True, f"bitsandbytes {stack.bitsandbytes.split(' (')[0].strip()}: each 4-bit "
                "layer keeps its input for backward (--bnb-keeps-inputs, fixed in 0.43.2)")


def _loss(stack: Stack, model_type: str, out: Mechanisms) -> None:
    if stack.loop == "litgpt":
        out.set("loss", "logits-dtype", "the loss litgpt's chunked_cross_entropy computes, over the logits in "
                "their dtype (--loss logits-dtype)")
        return
    form = loss_of_version(stack.transformers, model_type)
    if form == "fp32":
        return
    note = (f"the loss as transformers {stack.named('transformers')} computed it for {model_type} (--loss {form})"
            + (UPCAST_IN_FORWARD if form == "fp32-shifted" and stack.version("transformers") < (4, 46) else ""))
    out.set("loss", form, note)


def _kv_cache_in_training(stack: Stack, method: Method, config: dict, given, out: Mechanisms) -> None:
    if "keeps_kv_cache" in given or not method.gradient_checkpointing:
        return  # without checkpointing attention saves those keys and values for backward anyway
    if stack.loop in CACHE_UNDER_OUTER_CHECKPOINTING:
        out.set("keeps_kv_cache", True, f"{_of(stack.loop)} forward builds transformers' KV cache (checkpointing by "
                "FSDP's wrapper, which transformers does not see) and its outputs hold it (--keeps-kv-cache)")
        return
    until = CACHE_UNDER_CHECKPOINTING.get(config.get("model_type", ""))
    stated = stack.version("transformers")
    if until is not None and stated is not None and stated < until and config.get("use_cache", True):
        out.set("keeps_kv_cache", True, CACHE_NOTE.format(stack.named("transformers"), config["model_type"]))


def stacked_run(methods: list[Method], given: dict, stack: Stack, settings) -> list[tuple[Method, list[str]]]:
    """``stacked`` for the model ``RunSettings`` name (a preset or a local checkpoint's configuration)."""
    from profkit.model.build import model_config  # transformers: only where a model is named

    return stacked(methods, given, stack, model_config(settings).to_dict())


def stacked(methods: list[Method], given: dict, stack: Stack, config: dict) -> list[tuple[Method, list[str]]]:
    """Each method with the settings ``stack`` calls for beside those ``given`` (the command line's or a config's,
    by ``with_overrides``' names), and the notes that say why; ``NotModelled`` where the stack's behaviour is not
    modelled."""
    out = []
    for method in methods:
        derived = derive(stack, method, config, given=set(given))
        if derived.settings:  # named by the user's settings alone: the stack is named beside the estimate
            method = replace(with_overrides(method, **derived.settings), variant=method.variant)
        out.append((method, derived.notes))
    return out
