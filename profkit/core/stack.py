"""The software a training or generation runs on: the library versions that change what it holds or how long it
takes, and the training loop that drives it. One frozen ``Stack`` per estimate; ``predict.mechanisms`` derives
every version- or loop-dependent mechanism from it, in one place.

Where each part comes from, first found wins: a recorded run's manifest, the user's config file, ``--stack`` on
the command line (``transformers=4.48.1,loop=litgpt``, or a preset's name from ``data/stacks.json``), and for the
rest the packages installed where profkit runs. Each part keeps where it came from, so every estimate can say
what it assumed. Pure data, no torch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, fields, replace
from importlib import metadata

from profkit.core.bundled import bundled

PACKAGES = ("torch", "transformers", "peft", "bitsandbytes", "accelerate", "deepspeed", "trl")
# The loops whose memory differs from one another: profkit's own; transformers' Trainer (TRL's SFTTrainer and
# axolotl's trainer are subclasses); a plain accelerate loop; litgpt's finetune scripts; torchtune's recipes;
# llama-recipes, and its loop before e5970e2 (2023), which kept each step's outputs bound into the next.
LOOPS = ("profkit", "trainer", "accelerate", "axolotl", "litgpt", "torchtune", "llama-recipes",
         "llama-recipes-2023", "other")
FSDP_VERSIONS = ("fsdp2", "fsdp1")
INSTALLED = "installed"
DEFAULT = "default"  # profkit's own loop and FSDP2, where nothing names another

# A version as sources state it: 4.48.1, 4.35.0.dev0, 0.43.0+rocm; a bound (<4.36) where only a date is known.
_VERSION = re.compile(r"^\s*(<)?\s*(\d+)\.(\d+)")


class StackError(ValueError):
    """A stack that cannot be read: the message names the part and the valid values."""


def version_tuple(text: str | None) -> tuple[int, int] | None:
    """A stated version's (major, minor); None where none is stated. A bound, ``<4.36`` (a source that states no
    version but whose date precedes that release), reads as the minor before it: every rule about versions has the
    form "before X", which holds for whatever version ran when X is at or past the bound."""
    parts = _VERSION.match(text or "")
    if parts is None:
        return None
    major, minor = int(parts.group(2)), int(parts.group(3))
    return (major, minor - 1) if parts.group(1) else (major, minor)


def version_named(text: str) -> str:
    """A version as a note names it: the stated one, or the bound a figure's date sets."""
    named = text.split(" (")[0].strip()
    return f"older than {named[1:].strip()} (the figure's date)" if named.startswith("<") else named


def _release(text: str | None) -> tuple[int, ...] | None:
    """major.minor.patch of a stated version, for rules that name a patch release (bitsandbytes 0.43.2)."""
    parts = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(g or 0) for g in parts.groups()) if parts else None


@dataclass(frozen=True)
class Stack:
    """Versions as stated (``None``: not known, today's behaviour assumed and said), the loop, FSDP's version and
    where each came from (part -> "installed", "command line", "preset litgpt", "config FILE", "manifest", ...)."""

    torch: str | None = None
    transformers: str | None = None
    peft: str | None = None
    bitsandbytes: str | None = None
    accelerate: str | None = None
    deepspeed: str | None = None
    trl: str | None = None
    loop: str = "profkit"
    fsdp: str = "fsdp2"
    origin: dict = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self):
        if self.loop not in LOOPS:
            raise StackError(f"loop {self.loop!r}: valid loops are {', '.join(LOOPS)}")
        if self.fsdp not in FSDP_VERSIONS:
            raise StackError(f"fsdp {self.fsdp!r}: valid values are {', '.join(FSDP_VERSIONS)}")

    # ----------------------------------------------------------------------------- where a stack comes from
    @classmethod
    def installed(cls) -> Stack:
        """The packages installed where profkit runs, and profkit's own loop."""
        found = {}
        for package in PACKAGES:
            try:
                found[package] = metadata.version(package)
            except metadata.PackageNotFoundError:
                continue
        return cls(**found, origin={**{part: INSTALLED for part in found}, "loop": DEFAULT, "fsdp": DEFAULT})

    @classmethod
    def from_parts(cls, parts: dict, origin: str) -> Stack:
        """A stack of the parts given (package -> version, ``loop``, ``fsdp``), each from ``origin``; the rest
        unstated. Unknown parts and malformed versions are refused with the valid ones."""
        known = {f.name for f in fields(cls)} - {"origin"}
        unknown = sorted(set(parts) - known)
        if unknown:
            raise StackError(f"unknown stack part {', '.join(unknown)}; valid parts are "
                             f"{', '.join(PACKAGES)}, loop, fsdp")
        for package in set(parts) & set(PACKAGES):
            if version_tuple(str(parts[package])) is None:
                raise StackError(f"{package}={parts[package]}: not a version (4.48.1, 0.43)")
        return cls(**{k: str(v) for k, v in parts.items()}, origin={k: origin for k in parts})

    @classmethod
    def parse(cls, text: str) -> Stack:
        """``--stack``: a preset's name, or ``part=value`` pairs separated by commas, or both
        (``litgpt,transformers=4.40``: the pairs over the preset)."""
        stack = cls()
        pairs = {}
        for word in (w.strip() for w in text.split(",")):
            if not word:
                continue
            if "=" not in word:
                stack = stack.over(preset(word))
                continue
            key, value = (s.strip() for s in word.split("=", 1))
            if not value:
                raise StackError(f"--stack {word}: give a value ({key}=...)")
            pairs[key] = value
        return stack.over(cls.from_parts(pairs, "command line")) if pairs else stack

    @classmethod
    def from_manifest(cls, versions: dict, engine: str) -> Stack:
        """What a recorded run ran on: its manifest's versions and engine."""
        parts = {k: v for k, v in versions.items() if k in PACKAGES and v}
        loop = {"loop": "profkit", "trainer": "trainer"}.get(engine, "other")  # session: the user's own loop
        return cls(**parts, loop=loop, origin={k: "manifest" for k in (*parts, "loop", "fsdp")})

    def over(self, other: Stack) -> Stack:
        """``other``'s stated parts over this stack's (``other`` found first wins)."""
        stated = {k: getattr(other, k) for k in other.origin}
        return replace(self, **stated, origin={**self.origin, **other.origin})

    # ----------------------------------------------------------------------------- what a stack says
    def version(self, package: str) -> tuple[int, int] | None:
        return version_tuple(getattr(self, package))

    def release(self, package: str) -> tuple[int, ...] | None:
        return _release(getattr(self, package))

    def is_bound(self, package: str) -> bool:
        """Whether the version is only a bound (``<4.36``)."""
        return (getattr(self, package) or "").strip().startswith("<")

    def named(self, package: str) -> str:
        return version_named(getattr(self, package) or "")

    @property
    def engine(self) -> str:
        """How the estimate runs the loop: ``loop`` (profkit's own), ``trainer`` (transformers' Trainer through
        accelerate: TRL's and axolotl's are subclasses) or ``session`` (another loop, estimated as profkit's
        without the DeepSpeed config profkit's loop writes)."""
        return {"profkit": "loop", "trainer": "trainer", "axolotl": "trainer", "accelerate": "trainer"}.get(
            self.loop, "session")

    def describe(self) -> str:
        """One line: each stated part, grouped by where it came from."""
        by_origin: dict[str, list[str]] = {}
        for part in ("loop", "fsdp", *PACKAGES):
            value = getattr(self, part)
            if value is None or part not in self.origin or (part == "fsdp" and self.origin[part] == DEFAULT):
                continue
            by_origin.setdefault(self.origin[part], []).append(f"{part} {value}")
        # what the user gave first, what is installed last
        order = sorted(by_origin, key=lambda origin: origin in (DEFAULT, INSTALLED))
        return "; ".join(f"{', '.join(by_origin[o])} ({o})" for o in order)

    def to_json(self) -> dict:
        return {part: {"value": getattr(self, part), "from": self.origin.get(part)}
                for part in (*PACKAGES, "loop", "fsdp") if getattr(self, part) is not None}


def presets() -> dict[str, dict]:
    """The named stacks (``data/stacks.json``): name -> its parts, with what it stands for and its source."""
    return json.loads(bundled("stacks.json").read_text())


def preset(name: str) -> Stack:
    every = presets()
    if name not in every:
        raise StackError(f"unknown stack {name!r}; named stacks are {', '.join(every)} (or part=value pairs: "
                         f"{', '.join(PACKAGES)}, loop, fsdp)")
    parts = {k: v for k, v in every[name].items() if k not in ("what", "source")}
    return Stack.from_parts(parts, f"stack {name}")
