"""What a method does to a model: the plan, the real build and the meta-device build from it, the data and
tokenizer, DeepSpeed ZeRO's configuration. Imports core only (and the model libraries)."""
