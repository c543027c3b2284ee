"""The training configs users already write (axolotl, torchtune, litgpt, LLaMA-Factory, transformers' and TRL's
arguments, peft's adapter_config.json, DeepSpeed's JSON, accelerate's YAML), read into one ``ConfigReading``:
the method, its settings, the workload, the model and the stack."""

from profkit.configs.files import read_configs
from profkit.configs.reading import ConfigError, ConfigReading

__all__ = ["ConfigError", "ConfigReading", "read_configs"]
