"""What one recording run is asked to do. Plain data, JSON-serializable, so the parent CLI can
hand it to the fresh subprocess that runs the method."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from profkit.core.methods import METHODS, get_method, with_overrides
from profkit.core.presets import DEFAULT_PRESET, get_preset


@dataclass(frozen=True)
class RunSettings:
    method: str
    preset: str = DEFAULT_PRESET
    model_path: str | None = None  # a local Hugging Face checkpoint instead of the preset
    dataset_path: str | None = None  # a local text/JSONL file instead of the bundled data
    device: str = "auto"
    batch_size: int | None = None  # None: the preset's default
    seq_len: int | None = None
    max_new_tokens: int | None = None
    warmup_steps: int = 2
    timed_steps: int = 5  # unprofiled steps: clean step time, tokens/s, loss
    profiled_steps: int = 2  # active steps of the time-profiling cycle
    memory_steps: int = 1  # active steps of the memory-profiling cycle
    seed: int = 0
    engine: str = "loop"  # loop: profkit's own training loop; trainer: transformers.Trainer with profkit's callback
    nproc: int = 1  # ranks, each its own process under torchrun; ZeRO partitions across them
    overrides: dict = field(default_factory=dict)  # method settings from the command line (lora_rank=16, ...)
    repeats: int = 1  # repetitions of the whole run, each in a fresh process: the spread between processes

    def resolved(self) -> "RunSettings":
        """Fill workload sizes from the preset, so manifests state what actually ran."""
        p = get_preset(self.preset)
        # Serving is measured one request at a time unless asked (the preset's batch is a training batch).
        inference = self.method in METHODS and METHODS[self.method].kind == "infer"
        return replace(self, batch_size=self.batch_size or (1 if inference else p.batch_size),
                       seq_len=self.seq_len or p.seq_len, max_new_tokens=self.max_new_tokens or p.max_new_tokens)

    def method_spec(self):
        """The registry's method with this run's command-line settings."""
        return with_overrides(get_method(self.method), **self.overrides)

    @property
    def run(self) -> str:
        """The run's directory name: the method with its command-line settings, then the engine when it is not
        profkit's own loop and the rank count when it is more than one, so that such runs sit side by side."""
        return (self.method_spec().label + ("" if self.engine == "loop" else f"-{self.engine}")
                + ("" if self.nproc == 1 else f"-nproc{self.nproc}"))

    def to_argv(self) -> list[str]:
        """The ``profkit record`` arguments that record this run again (the output directory aside): the inverse
        of the command line, for the report's reproduction command."""
        argv = [self.method, *(["--model", self.model_path] if self.model_path else ["--preset", self.preset])]
        if self.dataset_path:
            argv += ["--dataset", self.dataset_path]
        argv += ["--device", self.device]
        generates = self.method in METHODS and METHODS[self.method].kind == "infer"
        for flag, value in (("--batch-size", self.batch_size), ("--seq-len", self.seq_len),
                            ("--max-new-tokens", self.max_new_tokens if generates else None)):
            if value is not None:
                argv += [flag, str(value)]
        argv += ["--warmup-steps", str(self.warmup_steps), "--steps", str(self.timed_steps),
                 "--profiled-steps", str(self.profiled_steps)]
        for flag, value, default in (("--engine", self.engine, "loop"), ("--nproc", self.nproc, 1),
                                     ("--repeats", self.repeats, 1)):
            if value != default:
                argv += [flag, str(value)]
        for option, value in self.overrides.items():  # OVERRIDES' names are the command line's
            flag = "--" + option.replace("_", "-")
            if isinstance(value, bool):
                argv.append(flag if value else f"--no-{flag[2:]}")
            else:
                argv += [flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
        return argv

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunSettings":
        return cls(**data)

    @property
    def total_steps(self) -> int:
        # Each profiling cycle has one warm-up step before its active steps.
        return self.warmup_steps + self.timed_steps + (1 + self.profiled_steps) + (1 + self.memory_steps)
