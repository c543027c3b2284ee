"""profkit: measure where the memory and the time of LLM fine-tuning and serving methods go.

``profkit.Session`` records a user's own training loop; ``profkit.TrainerCallback`` a Hugging Face Trainer's.
Both are imported on first use, so that ``import profkit`` (and the CLI) does not load torch or transformers.
"""

__version__ = "0.1.0"
__all__ = ["Session", "TrainerCallback"]


def __getattr__(name: str):
    if name in __all__:
        from profkit import api  # heavy: torch and transformers, loaded only when the API is used
        return getattr(api, name)
    raise AttributeError(f"module 'profkit' has no attribute {name!r}")
