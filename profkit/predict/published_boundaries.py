"""Published fit boundaries (``tests/data/published/boundaries.csv``: a setting that ran and, where stated, the next
that ran out of memory, varying the batch or the sequence length) beside what the estimate says of each.

Each row is read as the wide set's figures are (``published.read_figure``: every setting the estimate needs must be
stated, and none is guessed), with the varied dimension at the value that ran and at the value that ran out of
memory; each is then estimated in full and checked against the GPU it ran on with no margin (``fit.Device``: the
step replayed through the caching allocator with the room the device has). The published boundary lies between
the two values, so the estimate agrees with it where it fits at the first and not at the second: the boundary
``profkit fit`` would find is then within the source's own step. A row that states one side only is checked on
that side.

A binary setting that decides a 4-bit footprint but that a row does not state (bitsandbytes' double quantization)
is estimated both ways: the verdict stands where both agree, and the row is "undecided" where they do not.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from collections.abc import Callable
from profkit.model.build import sequence_limit
from profkit.predict.estimate import EstimateError, estimate
from profkit.predict.fit import Device
from profkit.predict.published import config_of, read_figure, within_positions
from profkit.predict.published_throughput import NotPredicted, _gpu, _model

VERDICTS = ("agrees", "OOM predicted where it ran", "fit predicted where it ran out of memory", "undecided",
            "not estimated")


def _words_double_quant(text: str) -> str:
    """Double quantization as a 4-bit row's quantization text states it: "True", "False" or "" (not stated)."""
    text = text.lower()
    if re.search(r"no double|double[_ ]quant\w*\s*(=|:)?\s*false|without double", text):
        return "False"
    if re.search(r"double[_ ]quant|\bdq\b", text):
        return "True"
    return ""


def _precision(r) -> tuple[str, str]:
    """The precision in profkit's terms, and the assumption taken. A source's "bf16" on weights loaded in bf16
    (the Trainer's ``--bf16`` over ``torch_dtype=bfloat16``) is autocast over a half-precision base: profkit's
    ``bf16-mixed`` for a method with a frozen base, ``bf16-pure`` for full fine-tuning, whose every weight (and so its
    gradient and optimizer state) is in bf16."""
    text = r.precision.strip()
    if re.match(r"bf16\b(?!-)", text) and "bf16 weights" in text:
        name = "bf16-pure" if r.method == "full" else "bf16-mixed"
        return name, f"{text}: weights in bf16 under autocast ({name})"
    return text, ""


def loss_of_kernels(loop: str) -> tuple[str, str]:
    """The loss a row's loop computes where it names kernels that replace PyTorch's, and the assumption taken.
    Liger's kernels include its fused linear cross-entropy (the LM head and the loss by chunks, profkit's
    ``chunked``); its other kernels (RMSNorm, RoPE, SwiGLU) are estimated as the ops they replace. fms-acceleration's
    fused ops without Liger compute a fused cross-entropy over the whole logits, a form profkit does not have."""
    text = loop.lower()
    if "liger" in text:
        return "liger-fused-linear-cross-entropy", ("Liger's other kernels (RMSNorm, RoPE, SwiGLU) and any fused "
                                                    "LoRA matmuls estimated as the PyTorch ops they replace")
    if "fast-kernels" in text or "foak" in text:
        raise NotPredicted("a fused cross-entropy over the whole logits (fms-acceleration's fused ops): not one of "
                           "profkit's loss forms")
    return "", ""


def figure_row(r, value: int, double_quant: str = "", model: str | None = None) -> SimpleNamespace:
    """The wide set's columns for one boundary row with its varied dimension at ``value`` (``model``: named as the
    configuration found for it is); NotPredicted where its loop computes a loss profkit has no form of."""
    precision, _ = _precision(r)
    batch, seq = r.batch_size, r.seq_len
    if r.varied == "batch_size":
        batch = str(value)
    elif r.varied == "seq_len":
        seq = str(value)
    return SimpleNamespace(
        model=model or r.model, kind="train", method=r.method, lora_r=r.lora_r, lora_alpha="", lora_targets=r.lora_targets,
        quant_type=r.quant, double_quant=double_quant or _words_double_quant(r.quant), kbit_upcast="",
        precision=precision, optimizer=r.optimizer, gradient_checkpointing=r.gradient_checkpointing,
        batch_size=batch, seq_len=seq, max_new_tokens="", gpu=r.gpu, gpu_count=r.gpu_count or "1",
        sharding=r.sharding, offload=r.offload, transformers=r.transformers_version,
        loss=loss_of_kernels(r.loop)[0], grad_accum="",
        bitsandbytes="", loop=r.loop)


def _model_entry(r, configs: dict, find_model: Callable[[str], dict | None] = lambda _: None) -> tuple[str, dict]:
    """The row's model configuration: ``find_model`` of its Hugging Face id (the caller's way of finding a model as
    a user names it: ``configs.models`` with profkit's catalogue, a layer above this one), else the published sets'
    models.json by the row's name."""
    found = find_model(r.hf_model_id.split(" (")[0].strip())
    return (r.model, {"config": found}) if found is not None else _model(r.model, configs)


def _value(text: str, what: str) -> int | None:
    """A boundary's value as a whole number, None where the row leaves it empty; NotPredicted naming it otherwise."""
    if not text.strip():
        return None
    if not text.strip().isdigit():
        raise NotPredicted(f"{what} is not a whole number ({text.strip()})")
    return int(text)


def verdict(fits_at_fits: bool | None, fits_at_oom: bool | None) -> str:
    """The estimate against the published boundary: it agrees where it fits where the source ran and does not
    where the source ran out of memory (None: the row does not state that side)."""
    if fits_at_fits is False:
        return VERDICTS[1]
    if fits_at_oom is True:
        return VERDICTS[2]
    return VERDICTS[0]


def _checked(r, key: str, entry: dict, config, value: int, device: Device, variants: list[str]) -> dict:
    """Whether the row's setting at ``value`` fits ``device``, under each unstated variant; NotPredicted if the row
    does not determine an estimate. ``config``: the model's, built once for the row."""
    results = {}
    for dq in variants:
        figure = read_figure(figure_row(r, value, dq, model=key), {key: entry})
        if figure.method is None:
            raise NotPredicted(figure.reason)
        seq_len, capped = within_positions(figure.seq_len, figure.seq_len, sequence_limit(config))
        if capped:
            figure = replace(figure, seq_len=seq_len, assumed=(*figure.assumed, capped))
        try:
            e = estimate(figure.method, config, figure.batch_size, figure.seq_len, figure.world_size, "cuda",
                         key, figure.engine)
        except EstimateError as exc:
            raise NotPredicted(f"the estimate refused: {exc}") from None
        check = device.check(e)
        results[dq] = {"fits": check["fits"], "peak_bytes": check["peak_bytes"],
                       "device_used_bytes": check["device_used_bytes"], "method": figure.method.label,
                       "world_size": figure.world_size, "assumed": figure.assumed}
    return results


def compare_boundaries(table: Path, models: Path | None = None, split: str | None = None,
                       find_model: Callable[[str], dict | None] = lambda _: None,
                       progress=lambda text: None) -> pd.DataFrame:
    """One row per published boundary (``split``: only those): the estimate's verdict at the value that ran
    (``fits_at_fits``) and at the one that ran out of memory (``fits_at_oom``), against the GPU each ran on, or the
    reason there is none. ``find_model``: a Hugging Face id's configuration (a dict), or None."""
    configs = json.loads((models or table.with_name("models.json")).read_text())
    rows = []
    for n, r in pd.read_csv(table, dtype=str, keep_default_na=False).iterrows():
        if split and r.split != split:
            continue
        progress(f"{n + 1}: {r.model}, {r.method}, {r.varied}")
        row = {"split": r.split, "project": r.project, "model": r.model, "method": r.method, "varied": r.varied,
               "fits_value": None, "oom_value": None, "gpu": r.gpu, "gpu_count": r.gpu_count,
               "profkit_method": "", "world_size": None, "fits_at_fits": None, "fits_at_oom": None,
               "peak_at_fits_gb": None, "peak_at_oom_gb": None, "verdict": VERDICTS[4], "reason": "", "assumed": ""}
        try:
            fits_value, oom_value = _value(r.fits_value, "the value that ran"), _value(r.oom_value, "the value that "
                                                                                       "ran out of memory")
            row.update(fits_value=fits_value, oom_value=oom_value)
            if fits_value is None and oom_value is None:
                raise NotPredicted("neither a value that ran nor one that ran out of memory is stated")
            key, entry = _model_entry(r, configs, find_model)
            device = Device(_gpu(r.gpu).memory_bytes, margin=0.0, name=r.gpu)
            stated = _words_double_quant(r.quant)
            variants = ["True", "False"] if r.method == "qlora" and not stated else [stated]
            config = config_of(entry)
            seen = {side: _checked(r, key, entry, config, value, device, variants)
                    for side, value in (("fits", fits_value), ("oom", oom_value)) if value is not None}
            verdicts = {verdict(seen["fits"][dq]["fits"] if "fits" in seen else None,
                                seen["oom"][dq]["fits"] if "oom" in seen else None) for dq in variants}
            first = next(iter(seen.values()))[variants[0]]
            assumed = list(first["assumed"]) + [a for a in (_precision(r)[1], loss_of_kernels(r.loop)[1]) if a]
            if len(variants) > 1:
                assumed.append("double quantization not stated: estimated with and without it")
            row.update(profkit_method=first["method"], world_size=first["world_size"],
                       verdict=verdicts.pop() if len(verdicts) == 1 else VERDICTS[3], assumed="; ".join(assumed))
            for side in seen:
                fits = {v["fits"] for v in seen[side].values()}
                row[f"fits_at_{side}"] = fits.pop() if len(fits) == 1 else None
                row[f"peak_at_{side}_gb"] = " / ".join(f"{v['peak_bytes'] / 1e9:.2f}" for v in seen[side].values())
            if row["verdict"] == VERDICTS[3]:
                row["reason"] = "the verdict turns on double quantization, which the source does not state"
        except NotPredicted as exc:
            row["reason"] = str(exc)
        rows.append(row)
    return pd.DataFrame(rows)
