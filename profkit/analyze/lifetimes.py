"""Memory by owner from storage lifetimes (``record.storages.StorageLifetimes`` events): at every instant, the live
bytes of each owner, their peak, and each phase's peak. Pure: events and the inventory's storage owners in,
figures out.

An owner comes from what is known of the storage, in this order: the inventory (parameters, buffers, optimizer
state, ZeRO's flat buffers; by device and address), a caller's mark (``gradients``, ``kv_cache``), autograd
saving it for backward (``activations``; ``inputs`` when it existed before the step), else ``temporaries`` for
what an op allocated and ``before_step`` for what existed before and nothing names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SAVED_BECOMES = {"temporaries": "activations", "before_step": "inputs"}


@dataclass
class OwnerPeak:
    bytes: int = 0
    t_ns: int = 0
    by_owner: dict[str, int] = field(default_factory=dict)


@dataclass
class Lifetimes:
    peak: OwnerPeak  # the whole run's
    phase_peaks: dict[str, OwnerPeak]  # the peak while work of each phase ran
    phase_ends: dict[str, OwnerPeak]  # what was live when each phase's last event happened
    largest: dict[str, int]  # each owner's own largest live bytes
    allocated_peak: int  # the peak of what ops allocated during the steps (what existed before left out)
    events: int


def attribute(events: list[tuple], owner_of: dict[tuple[str, int], str]) -> Lifetimes:
    """``events``: ``(t_ns, action, storage, bytes, device, address, op, phase)`` rows in the order they happened."""
    live: dict[int, list] = {}  # storage -> [bytes, owner, allocated during the steps]
    totals: dict[str, int] = {}
    total = allocated = allocated_peak = 0
    peak, phases, ends, largest = OwnerPeak(), {}, {}, {}

    def move(entry: list, delta: int) -> None:
        nonlocal total, allocated
        owner = entry[1]
        if delta:
            totals[owner] = totals.get(owner, 0) + delta
            total += delta
            allocated += delta if entry[2] else 0
            if totals[owner] > largest.get(owner, 0):
                largest[owner] = totals[owner]

    previous = None
    for t_ns, action, number, nbytes, device, address, _op, phase in sorted(events, key=lambda e: e[0]):
        if phase != previous and previous is not None:
            ends[previous] = OwnerPeak(total, t_ns, {k: v for k, v in totals.items() if v})  # the state it left
        previous = phase
        entry = live.get(number)
        if action in ("alloc", "existing"):
            if entry is None:
                owner = owner_of.get((device, address)) or ("temporaries" if action == "alloc" else "before_step")
                live[number] = entry = [0, owner, action == "alloc"]
                move(entry, nbytes)
                entry[0] = nbytes
        elif entry is None:
            continue
        elif action == "free":
            del live[number]
            move(entry, -entry[0])
        elif action == "resize":
            move(entry, nbytes - entry[0])
            entry[0] = nbytes
        elif action == "saved" or action.startswith("owner:"):
            owner = SAVED_BECOMES.get(entry[1]) if action == "saved" else action.removeprefix("owner:")
            if owner is not None and owner != entry[1]:
                move(entry, -entry[0])
                entry[1] = owner
                move(entry, entry[0])
        allocated_peak = max(allocated_peak, allocated)
        if total > peak.bytes:
            peak = OwnerPeak(total, t_ns, {k: v for k, v in totals.items() if v})
        at = phases.get(phase)
        if at is None or total > at.bytes:
            phases[phase] = OwnerPeak(total, t_ns, {k: v for k, v in totals.items() if v})
    if previous is not None:
        ends[previous] = OwnerPeak(total, 0, {k: v for k, v in totals.items() if v})
    return Lifetimes(peak, phases, ends, largest, allocated_peak, len(events))
