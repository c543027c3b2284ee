"""Memory by owner from storage lifetimes (``record.storages.StorageLifetimes`` events): at every instant, the live
bytes of each owner, their peak, and each phase's peak. Pure: events and the inventory's storage owners in,
figures out.

An owner comes from what is known of the storage, in this order: the inventory (parameters, buffers, optimizer
state, ZeRO's flat buffers; by device and address), a caller's mark (``gradients``, ``kv_cache``), autograd
saving it for backward (``activations``; ``inputs`` when it existed before the step), a forward pass's result
that outlives the pass (``activations``: the logits the loop holds, a generation step's outputs), else
``temporaries`` for what an op allocated and ``before_step`` for what existed before and nothing names.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

SAVED_BECOMES = {"temporaries": "activations", "before_step": "inputs"}
FORWARD_PHASES = {"forward", "prefill", "decode"}  # profkit's labels of a forward pass


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
    live: dict[int, list] = {}  # storage -> [bytes, owner, allocated during the steps, phase that allocated it]
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
            if previous in FORWARD_PHASES:
                for entry in live.values():  # what the pass made and still lives is its result
                    if entry[1] == "temporaries" and entry[3] == previous:
                        move(entry, -entry[0])
                        entry[1] = "activations"
                        move(entry, entry[0])
            ends[previous] = OwnerPeak(total, t_ns, {k: v for k, v in totals.items() if v})  # the state it left
        previous = phase
        entry = live.get(number)
        if action in ("alloc", "existing"):
            if entry is None:
                owner = owner_of.get((device, address)) or ("temporaries" if action == "alloc" else "before_step")
                live[number] = entry = [0, owner, action == "alloc", phase]
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


def load_lifetimes(path: Path) -> Lifetimes:
    """Read ``storage_lifetimes.json.gz`` (``record.storages``) and attribute it; ValueError names what is wrong."""
    try:
        with gzip.open(path, "rt") as fh:
            data = json.load(fh)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a storage-lifetimes file: {exc}") from None
    try:
        width = len(data["columns"])
        events = [tuple(e) for e in data["events"]]
        owners = {(device, int(address)): str(owner) for device, address, owner in data["owners"]}
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"a damaged storage-lifetimes file: {type(exc).__name__}: {exc}") from None
    if width != 8 or any(len(e) != 8 or not isinstance(e[0], int) or not isinstance(e[3], int) for e in events):
        raise ValueError("a damaged storage-lifetimes file: its events are not (t_ns, action, storage, bytes, "
                         "device, address, op, phase) rows")
    return attribute(events, owners)


# The tracker's owners as the breakdown's memory categories: buffers are frozen state, what autograd saved of
# the batch is an activation (as the profiler files it), ZeRO's other buffers are framework temporaries, and what
# existed before the step with no known owner is unattributed.
CATEGORY_OF_OWNER = {"buffers": "parameters_frozen", "inputs": "activations", "framework": "temporaries",
                     "before_step": "unattributed"}


def categories(peak: OwnerPeak, kv_cache: int = 0) -> dict[str, int]:
    """Bytes per memory category at one instant; an inference run's KV cache (measured to the byte by the
    session) is taken from what the tracker could only call temporaries."""
    out: dict[str, int] = {}
    for owner, nbytes in peak.by_owner.items():
        category = CATEGORY_OF_OWNER.get(owner, owner)
        out[category] = out.get(category, 0) + nbytes
    left = kv_cache
    for source in ("activations", "temporaries"):  # the cache is a forward pass's result that outlives it
        taken = min(left, out.get(source, 0))
        out[source] = out.get(source, 0) - taken
        left -= taken
    if kv_cache:
        out["kv_cache"] = out.get("kv_cache", 0) + kv_cache - left
        out["unattributed"] = out.get("unattributed", 0) - left
    return out
