"""Which framework wrote a config, recognised by the keys only it uses, and its reader: one module per framework,
each a function that fills a ``Part`` from the file's mapping."""

from __future__ import annotations

from pathlib import Path

from profkit.configs.formats import (
    accelerate,
    axolotl,
    deepspeed,
    litgpt,
    llama_factory,
    peft_adapter,
    torchtune,
    trainer,
)
from profkit.configs.reading import ConfigError, Part

# In order: the first whose test holds reads the file.
FORMATS = [
    ("deepspeed", deepspeed.recognise, deepspeed.read),
    ("accelerate", accelerate.recognise, accelerate.read),
    ("peft", peft_adapter.recognise, peft_adapter.read),
    ("torchtune", torchtune.recognise, torchtune.read),
    ("litgpt", litgpt.recognise, litgpt.read),
    ("axolotl", axolotl.recognise, axolotl.read),
    ("llama-factory", llama_factory.recognise, llama_factory.read),
    ("trainer", trainer.recognise, trainer.read),
]


def read_part(path: Path, data: dict) -> Part:
    for name, recognise, read in FORMATS:
        if recognise(data):
            part = Part(str(path), name)
            read(part, dict(data))
            return part
    raise ConfigError(f"{path}: not a config profkit reads (keys {', '.join(list(data)[:6])}...); it reads "
                      f"{', '.join(n for n, _, _ in FORMATS)} configs")
