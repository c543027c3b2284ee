"""Hugging Face ``Trainer`` integration: a callback that steps a ``profkit.Session`` from the Trainer's own
loop (and so from TRL's trainers, which subclass it), with the model and optimizer the Trainer built --
including DeepSpeed's ZeRO optimizer when the Trainer runs DeepSpeed through accelerate.

This module imports transformers for the callback's base class, which the Trainer requires.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from transformers import TrainerCallback as _TrainerCallback

from profkit.record.session import Session

# TrainingArguments fields that change what a step holds or does; stored in the run's manifest.
RELEVANT_ARGS = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
                 "gradient_checkpointing_kwargs", "bf16", "fp16", "optim", "learning_rate", "max_grad_norm",
                 "max_steps", "seed")


class TrainerCallback(_TrainerCallback):
    """Record a run of ``Trainer.train()`` into ``path``: ``Trainer(..., callbacks=[TrainerCallback(path)])``.

    The Trainer must run for at least ``session.total_steps`` optimizer steps (warm-up + timed + the two
    profiling cycles, 12 with the defaults); a shorter training leaves the run marked ``incomplete``.
    """

    session_class = Session  # profkit.TrainerCallback's records the estimate too (profkit.api)

    def __init__(self, path: str | Path | None = None, *, warmup_steps: int = 2, timed_steps: int = 5,
                 profiled_steps: int = 2, memory_steps: int = 1,
                 session_factory: Callable[[Any, Any], Session] | None = None, stop_when_done: bool = False):
        self._stop_when_done = stop_when_done  # profkit's own Trainer runs only as long as the session needs
        if (path is None) == (session_factory is None):
            raise TypeError("TrainerCallback(path): give the run directory to record into")
        schedule = dict(warmup_steps=warmup_steps, timed_steps=timed_steps, profiled_steps=profiled_steps,
                        memory_steps=memory_steps)
        self._factory = session_factory or (lambda model, optimizer: self.session_class(
            path, model, optimizer, engine="trainer", **schedule))
        self.session: Session | None = None

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.session is not None and not self.session._closed:
            return
        self.session = self._factory(model, optimizer)
        self.session.record.engine = "trainer"
        if is_trainer_ddp(args, self.session):
            self.session.record.model["found"]["data_parallel"] = True
        self.session.record.engine_config = engine_config(args)
        self.session.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.session is not None:
            self.session.step()
            if self._stop_when_done and self.session.done:
                control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        if self.session is not None:
            self.session.close()


def is_trainer_ddp(args, session: Session) -> bool:
    """Whether the Trainer wraps the model in DDP: several processes (accelerate's MULTI_GPU, or torchrun on CPU)
    without DeepSpeed or FSDP, which it hands the callbacks unwrapped."""
    return (getattr(args, "world_size", 1) > 1 and not getattr(args, "deepspeed", None)
            and not getattr(args, "fsdp", None) and not session.record.model["found"].get("fsdp")
            and not session.record.model["found"].get("zero_stage"))


def engine_config(args) -> dict:
    out = {"trainer": {name: getattr(args, name, None) for name in RELEVANT_ARGS}}
    out["trainer"]["optim"] = str(out["trainer"]["optim"]).split(".")[-1].lower()
    hf_ds = getattr(args, "hf_deepspeed_config", None)
    if hf_ds is not None:
        out["deepspeed"] = hf_ds.config  # with Hugging Face's "auto" values filled in
    return out
