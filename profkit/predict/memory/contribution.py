"""What one owner or mechanism adds to a training step, and the sum of several."""

from __future__ import annotations

from dataclasses import dataclass, field

INSTANTS = ("forward", "backward", "optimizer")  # a training step's instants, in order


@dataclass
class Contribution:
    """Bytes by category at each instant (``INSTANTS``), the named parts behind them (``detail``), what the estimate
    says of them (``notes``) and what lies in pinned host memory instead (``host``). Bytes may be negative: a part
    that moves memory another counted (ZeRO partitioning the parameters, offload moving them to the host)."""

    instants: dict[str, dict[str, int]] = field(default_factory=dict)
    detail: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    host: dict[str, int] = field(default_factory=dict)

    def add(self, category: str, forward: int = 0, backward: int = 0, optimizer: int = 0) -> Contribution:
        """``category`` grows by these bytes at each instant."""
        for instant, size in zip(INSTANTS, (forward, backward, optimizer)):
            held = self.instants.setdefault(instant, {})
            held[category] = held.get(category, 0) + size
        return self

    def throughout(self, category: str, size: int) -> Contribution:
        """``category`` holds ``size`` more bytes at every instant."""
        return self.add(category, size, size, size)

    def at(self, instant: str, category: str) -> int:
        return self.instants.get(instant, {}).get(category, 0)


def combine(parts: list[Contribution]) -> Contribution:
    """The parts summed: bytes added category by category, detail merged in order (a later part's value for a name
    replaces an earlier one's in its place), notes and host bytes in order."""
    total = Contribution({instant: {} for instant in INSTANTS})
    for part in parts:
        for instant, categories in part.instants.items():
            for category, size in categories.items():
                total.add(category, **{instant: size})
        total.detail.update(part.detail)
        total.notes += part.notes
        total.host.update(part.host)
    return total
