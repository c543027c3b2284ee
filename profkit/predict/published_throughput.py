"""Published measured training throughputs (``tests/data/published/throughput.csv``) beside the predicted step
time for the same settings: tokens per second per GPU, or the reason a figure is not predicted.

A figure is predicted only where every setting the prediction needs is stated (model, GPU, method, checkpointing,
sharding, precision, batch and sequence, and for a step time what a step holds); a setting not stated is never
guessed. Whole-run times need the run's token count, which the sources do not state, so they are not predicted.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd

from profkit.core import gpus
from profkit.core.methods import METHODS, OverrideError, with_overrides
from profkit.model.build import sequence_limit
from profkit.predict.estimate import EstimateError
from profkit.predict.mechanisms import MOE_4BIT
from profkit.predict.published import config_of, within_positions
from profkit.predict.step_time import predict

SHARDING = {"none": "", "fsdp": "_fsdp", "zero2": "_zero2", "zero3": "_zero3"}
NUMBER = re.compile(r"^\s*(\d+)\b")


class NotPredicted(Exception):
    pass


def _number(text: str, what: str) -> int:
    m = NUMBER.match(text or "")
    if not m:
        raise NotPredicted(f"{what} not stated")
    return int(m.group(1))


def _squeeze(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _model(text: str, configs: dict) -> tuple[str, dict]:
    """The models.json entry one of whose names the figure's model names (punctuation aside), the longest name
    first (Llama-2-70b before Llama-2-7b)."""
    wanted = _squeeze(text.split(" (")[0])
    names = sorted(((_squeeze(n), key) for key, entry in configs.items() for n in [key, *entry.get("names", [])]),
                   key=lambda x: -len(x[0]))
    for name, key in names:
        if name and name in wanted:
            entry = configs[key]
            if "config" not in entry:
                raise NotPredicted(f"{key}: {entry.get('unsupported', 'no configuration')}")
            return key, entry
    raise NotPredicted(f"no configuration for {text.split(' (')[0]}")


def _within(part: str, whole: str) -> bool:
    """``part`` in ``whole``; a part that ends in a digit not followed by another: an A10 is not an A100."""
    tail = r"(?![0-9])" if part[-1:].isdigit() else ""
    return bool(part) and re.search(re.escape(part) + tail, whole) is not None


def _gpus(text: str) -> list[gpus.Gpu]:
    """The GPUs a figure's text may name: one, or the variants of one chip that share its multiprocessors and
    16-bit peak and differ in memory and bandwidth only ("A100": 40 or 80 GB, SXM or PCIe), each predicted."""
    if text.strip() in ("", "unstated") or text.strip().startswith("not stated"):
        raise NotPredicted(f"GPU not stated ({text})")
    try:
        return [_gpu(text)]
    except NotPredicted as exc:
        chip = re.search(r"\b([A-Z]+\d+[A-Z]?)\b", re.sub(r"\s*\(.*", "", text).removeprefix("NVIDIA "))
        variants = [g for g in gpus.GPUS.values() if chip and g.key.split("-")[0] == chip.group(1)]
        if len(variants) > 1 and len({(g.sms, g.tflops.get("bf16")) for g in variants}) == 1:
            return variants
        raise NotPredicted(str(exc)) from None


def _gpu(text: str) -> gpus.Gpu:
    if "not stated" in text or re.fullmatch(r"NVIDIA (A100|H100)", text.strip()):
        raise NotPredicted(f"GPU variant not stated ({text})")
    plain = re.sub(r"\s*\(.*", "", text).strip()
    plain = plain + "B" if plain.endswith("80G") else plain
    for candidate in (plain, plain.removeprefix("NVIDIA ").removeprefix("Tesla ")):
        try:
            return gpus.find(candidate)
        except gpus.UnknownGpu:
            continue
    squeezed = _squeeze(plain)
    matches = [g for g in gpus.GPUS.values()
               if any(_within(_squeeze(n), squeezed) for n in g.names)]
    if len(matches) > 1:  # the words in brackets may say which ("DGX-H100, 80GB SXM")
        said = _squeeze(text)
        form = [g for g in matches if _squeeze(g.key.split("-", 1)[-1]) in said]
        matches = form if len(form) == 1 else matches
    words = set(re.findall(r"[a-z0-9]+", text.lower()))
    if not matches:  # the key's words, all in the text ("H100 80GB SXM": H100-SXM)
        matches = [g for g in gpus.GPUS.values() if {w.lower() for w in g.key.split("-")} <= words]
    if not matches:  # the chip named, its variant not ("A100 80GB": SXM or PCIe?), its memory perhaps
        matches = [g for g in gpus.GPUS.values() if g.key.split("-")[0].lower() in words
                   and any(ch.isdigit() for ch in g.key.split("-")[0])]
        sizes = {g.key: {w.lower() for w in g.key.split("-") if re.fullmatch(r"\d+GB", w)} for g in matches}
        if any(sizes[g.key] & words for g in matches):
            matches = [g for g in matches if sizes[g.key] & words]
    # De-duplicate (a GPU matched by two names), then: variants that the prediction cannot tell apart (the same
    # 16-bit peak, bandwidths within 10%: A100 80GB SXM or PCIe) are one answer, named as an assumption.
    matches = list({g.key: g for g in matches}.values())
    if len(matches) > 1 and len({g.tflops.get("bf16") for g in matches}) == 1 and \
            max(g.bytes_per_s for g in matches) <= 1.1 * min(g.bytes_per_s for g in matches):
        return matches[0]
    if len(matches) == 1:
        return matches[0]
    raise NotPredicted(f"{text}: not in profkit's GPU table" if not matches else f"{text}: which of "
                       f"{', '.join(g.key for g in matches)} is not stated")


def _method(r):
    if r.method not in ("full", "lora", "qlora"):
        raise NotPredicted(f"method {r.method} not modelled")
    framework = r.framework.lower()
    if "compile" in framework and not re.search(r"compile\w*\s*(off|disabled|false|=\s*false)", framework):
        raise NotPredicted("torch.compile: the prediction is for eager PyTorch (compiled kernels fuse the ops it "
                           "counts one by one)")
    if r.packing != "yes":
        raise NotPredicted("batches not packed, or not said: how much of each is padding is not stated")
    if "GPTQ" in r.notes or "Int4" in r.model:
        raise NotPredicted("a GPTQ int4 base, not NF4")
    if r.gc not in ("yes", "no"):
        raise NotPredicted("gradient checkpointing not stated")
    n = _number(r.n_gpus, "GPU count")
    sharding = r.sharding if r.sharding != "unstated" or n > 1 else "none"
    if sharding == "ddp":
        raise NotPredicted("data parallelism (DDP) is not modelled in the step time")
    if sharding not in SHARDING:
        raise NotPredicted(f"sharding {r.sharding}")
    if n > 1 and sharding == "none":
        raise NotPredicted(f"{n} GPUs without sharding stated")
    if r.offload not in ("none", "unstated") or (r.offload == "unstated" and sharding in ("zero2", "zero3")):
        raise NotPredicted(f"offload {r.offload}: the host's optimizer step is not predicted (a lower bound only)")
    if r.precision in ("fp32", "unstated"):
        raise NotPredicted(f"precision {r.precision}: the prediction is for 16-bit training")
    name = r.method + SHARDING[sharding] + ("_gc" if r.gc == "yes" else "")
    if name not in METHODS:
        raise NotPredicted(f"{name}: no such method in profkit")
    method = METHODS[name]
    if r.method != "full":
        rank = _number(r.lora_rank, "LoRA rank")
        targets = r.lora_targets.strip()
        if targets.lower() in ("", "unstated", "n/a"):
            raise NotPredicted("LoRA targets not stated")
        overrides = {"lora_rank": rank}
        if targets.lower() in ("all-linear", "all linear", "all"):
            overrides["lora_targets"] = "all-linear"
        elif re.fullmatch(r"[a-z_]+(,\s*[a-z_]+)*", targets):
            # "q,k,v,o" is the sources' shorthand for the attention projections
            names = [f"{t}_proj" if t in ("q", "k", "v", "o") else t for t in targets.replace(" ", "").split(",")]
            overrides["lora_targets"] = ",".join(names)
        else:
            raise NotPredicted(f"LoRA targets {targets or 'unstated'}")
        try:
            method = with_overrides(method, **overrides)
        except OverrideError as exc:
            raise NotPredicted(str(exc)) from None
    return method, n


def measured_tokens_per_gpu(r, batch: int, seq: int, n: int) -> float:
    """The figure as tokens per second per GPU, or NotPredicted where what it counts is not stated."""
    value, unit, counted = float(r.measured), r.unit, r.what_counted.lower()
    if unit == "tokens/s/gpu":
        return value
    if unit == "tokens/s":
        if n == 1 or "aggregate" in counted or "total" in counted:
            return value / n
        if "per gpu" in counted or "per device" in counted:
            return value
        raise NotPredicted("tokens/s per GPU or for the job: not stated")
    if unit in ("s/step", "min per 1000 iterations"):
        if "most likely" in counted or "inferred" in counted:
            raise NotPredicted("what the source's step holds is inferred, not stated")
        seconds = value if unit == "s/step" else value * 60 / 1000
        micro = "micro" in counted or unit == "min per 1000 iterations"
        accumulation = 1 if micro else _number(r.grad_accum, "gradient accumulation")
        return batch * seq * accumulation / seconds
    if unit == "samples/s":
        if r.packing != "yes":
            raise NotPredicted("samples/s without packing: the tokens per sample are not stated")
        return value * seq / n
    raise NotPredicted(f"{unit}: a whole run's time needs its token count, which is not stated")


def compare_throughput(table: Path, models: Path | None = None, split: str | None = None) -> pd.DataFrame:
    configs = json.loads((models or table.with_name("models.json")).read_text())
    rows, cache, limits = [], {}, {}
    for _, r in pd.read_csv(table, dtype=str, keep_default_na=False).iterrows():
        if split and r.split != split:
            continue
        row = {"split": r.split, "source": r.source, "model": r.model, "gpu": r.gpu, "n_gpus": r.n_gpus,
               "method": r.method, "unit": r.unit, "measured": r.measured}
        try:
            key, entry = _model(r.model, configs)
            candidates = _gpus(r.gpu)
            method, n = _method(r)
            batch, seq = _number(r.batch_per_device, "batch"), _number(r.seq_len, "sequence length")
            if key not in limits:
                limits[key] = sequence_limit(config_of(entry))
            seq, assumed = within_positions(seq, seq, limits[key])
            measured = measured_tokens_per_gpu(r, batch, seq, n)
            for gpu in candidates:
                if not gpu.tflops.get("bf16") and not gpu.tflops.get("fp16"):
                    raise NotPredicted(f"{gpu.key}: no 16-bit peak in profkit's GPU table")
            config = entry["config"]
            if method.quantization and max(config.get("num_local_experts", 0), config.get("num_experts", 0)) > 1:
                raise NotPredicted(MOE_4BIT)
            steps = []
            for gpu in candidates:
                k = (key, method, batch, seq, gpu.key, n)
                if k not in cache:
                    cache[k] = predict(method, config_of(entry), batch, seq, gpu, n)
                steps.append(cache[k])
            each = [batch * seq / st.seconds for st in steps]
            # A variant not stated: the geometric mean of the variants' predictions, and their range beside it.
            predicted = math.prod(each) ** (1 / len(each))
            row.update(profkit_method=method.label, batch=batch, seq_len=seq,
                       gpu_key=" or ".join(g.key for g in candidates), measured_tokens_per_gpu_s=measured,
                       predicted_tokens_per_gpu_s=predicted, predicted_range=f"{min(each):.3g}-{max(each):.3g}",
                       error=predicted / measured - 1, bound="/".join(sorted({st.bound for st in steps})), reason="",
                       assumed=assumed)
        except NotPredicted as exc:
            row["reason"] = str(exc)
        except EstimateError as exc:
            row["reason"] = f"the prediction refused: {exc}"
        rows.append(row)
    return pd.DataFrame(rows)
