"""What one recording run is asked to do. Plain data, JSON-serializable, so the parent CLI can
hand it to the fresh subprocess that runs the method."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from profkit.core.methods import METHODS, SETTINGS, get_method, with_overrides
from profkit.core.options import CommandOption
from profkit.core.presets import DEFAULT_PRESET, PRESETS, get_preset


def _option(default, flag: str, help: str, type_: type, minimum: float | None = None,
            choices: tuple[str, ...] = ()):
    """A field that the command line sets (``profkit record``'s options are made from these)."""
    return field(default=default, metadata={"option": CommandOption(flag, help, type_, minimum, None, choices)})


DEVICES = ("auto", "cpu", "cuda")
ENGINES = ("loop", "trainer")


@dataclass(frozen=True)
class RunSettings:
    method: str
    preset: str = _option(DEFAULT_PRESET, "--preset", f"Model preset with random weights ({', '.join(PRESETS)}).",
                          str, choices=tuple(PRESETS))
    model_path: str | None = _option(None, "--model", "A local Hugging Face checkpoint (and tokenizer) instead of a "
                                     "preset; estimates read only its config.json.", Path)
    dataset_path: str | None = _option(None, "--dataset", "A local .txt or .jsonl file instead of the bundled data.",
                                       Path)
    device: str = _option("auto", "--device", f"{', '.join(DEVICES)}.", str, choices=DEVICES)
    batch_size: int | None = _option(None, "--batch-size", "Batch size (default: the preset's; 1 for generation).",
                                     int, minimum=1)
    seq_len: int | None = _option(None, "--seq-len", "Sequence length; for generation, the prompt's (default: the "
                                  "preset's).", int, minimum=8)
    max_new_tokens: int | None = _option(None, "--max-new-tokens", "Tokens generated per prompt by inference "
                                         "methods (default: the preset's).", int, minimum=1)
    warmup_steps: int = _option(2, "--warmup-steps", "Warm-up steps before anything is measured.", int, minimum=0)
    timed_steps: int = _option(5, "--steps", "Timed steps without the profiler (step time, tokens/s).", int,
                               minimum=1)
    profiled_steps: int = _option(2, "--profiled-steps", "Active steps of the time-profiling cycle.", int, minimum=1)
    memory_steps: int = 1  # active steps of the memory-profiling cycle
    seed: int = 0
    # The caching allocator held to this many bytes (torch.cuda.set_per_process_memory_fraction): a GPU with less
    # memory emulated on a larger one, as the GPU check does to hold `profkit fit` to recordings. CUDA only.
    memory_limit_bytes: int | None = None
    engine: str = _option("loop", "--engine", "loop: profkit's own training loop; trainer: transformers.Trainer "
                          "with profkit's callback, a DeepSpeed config with Hugging Face's \"auto\" sizes, or "
                          "accelerate's FSDP2 plugin.", str, choices=ENGINES)
    nproc: int = _option(1, "--nproc", "Ranks to launch with torchrun (gloo on CPU, NCCL on GPUs); ZeRO and FSDP "
                         "shard across them. Each rank records into rank<k>/ of the run.", int, minimum=1)
    overrides: dict = field(default_factory=dict)  # method settings from the command line (lora_rank=16, ...)
    repeats: int = _option(1, "--repeats", "Record each method this many times, each in fresh processes, as "
                           "repetitions of one run (rep<k>/): the spread that comparisons must exceed.", int,
                           minimum=1)

    @staticmethod
    def options() -> dict[str, tuple[CommandOption, object]]:
        """The fields the command line sets: name -> (its option, its default)."""
        return {f.name: (f.metadata["option"], f.default) for f in fields(RunSettings) if "option" in f.metadata}

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
        of the command line, made from the same options, for the report's reproduction command."""
        generates = self.method in METHODS and METHODS[self.method].kind == "infer"
        argv = [self.method]
        for name, (option, _) in self.options().items():  # every one, so a change of defaults cannot change it
            value = getattr(self, name)
            if value is None or (name == "preset" and self.model_path) or (name == "max_new_tokens" and not generates):
                continue
            argv += option.words(value)
        for name, value in self.overrides.items():  # SETTINGS' keys are the command line's names
            argv += SETTINGS[name].option.words(value)
        return argv

    @classmethod
    def from_options(cls, values: dict, **others) -> "RunSettings":
        """Settings from the command line's values (a path is stored resolved, as a string)."""
        return cls(**{k: str(Path(v).resolve()) if isinstance(v, Path) else v for k, v in values.items()}, **others)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "RunSettings":
        return cls(**data)

    @property
    def total_steps(self) -> int:
        # Each profiling cycle has one warm-up step before its active steps.
        return self.warmup_steps + self.timed_steps + (1 + self.profiled_steps) + (1 + self.memory_steps)
