"""peft's ``adapter_config.json`` (a saved ``PeftConfig``): the adapter's type, rank, alpha and target modules, and
the base model it was trained on."""

from __future__ import annotations

from profkit.configs.formats import common
from profkit.configs.reading import Part, expect


def recognise(data: dict) -> bool:
    return "peft_type" in data


def read(part: Part, data: dict) -> None:
    path = part.path
    kind = str(data.get("peft_type")).upper()
    part.set("model", expect(path, "base_model_name_or_path", data.get("base_model_name_or_path"), str),
             "base_model_name_or_path")
    part.set("adapter", "lora", "peft_type")
    if kind != "LORA":
        rank = data.get("r") or data.get("init_r") or data.get("target_r")
        part.note("peft_type", f"{kind}: an adapter profkit does not model; estimated as LoRA"
                  + (f" of rank {rank} on the same modules" if rank else " of rank 8 on q_proj and v_proj"))
    if rank := expect(path, "r", data.get("r"), int):
        part.set("settings.lora_rank", rank, "r")
    part.set("settings.lora_alpha", expect(path, "lora_alpha", data.get("lora_alpha"), int), "lora_alpha")
    part.set("settings.lora_dropout", expect(path, "lora_dropout", data.get("lora_dropout"), float), "lora_dropout")
    common.lora_targets(part, "target_modules", data.get("target_modules"))
    if expect(path, "use_dora", data.get("use_dora"), bool):
        part.note("use_dora", "DoRA: estimated as LoRA (its magnitude vectors and extra products are not counted)")
    if data.get("modules_to_save"):
        part.note("modules_to_save", "modules trained whole beside the adapters: not counted")
    # A saved adapter says nothing else about training; everything else it holds is peft's bookkeeping.
