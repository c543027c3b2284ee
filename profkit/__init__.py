"""profkit: measure where the memory and the time of LLM fine-tuning and serving methods go."""

__version__ = "0.1.0"
