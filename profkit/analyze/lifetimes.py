"""Memory by owner from storage lifetimes (``record.storages.StorageLifetimes`` events): at every instant, the live
bytes of each owner, their peak, and each phase's peak. Pure: events and the inventory's storage owners in,
figures out.

An owner comes from what is known of the storage, in this order: the inventory (parameters, buffers, optimizer
state, ZeRO's flat buffers; by device and address), a caller's mark (``gradients``, ``kv_cache``), autograd
saving it for backward (``activations``; ``inputs`` when it existed before the step), a forward op computing
it from the batch (``activations``, as torch's memory profiler files them: the logits, the loss, a generation
step's outputs), else ``temporaries`` for what another op allocated and ``before_step`` for what existed
before and nothing names.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

from profkit.store import LIFETIME_EVENT_COLUMNS

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
    largest_category: dict[str, int]  # each memory category's own largest live bytes (CATEGORY_OF_OWNER)
    allocated_peak: int  # the peak of what ops allocated during the steps (what existed before left out)
    events: int
    live_at_start: int = 0  # what was live when following began (the inventory's storages)


def owners_of(events: list[tuple], owner_of: dict[tuple[str, int], str]) -> dict[int, str]:
    """Each storage's owner, from everything known of it over its life: where it came from (the inventory, what
    a forward op computed from the batch, another op, or live before the step), whether autograd saved it, and
    what a caller marked it. ``events`` sorted by time."""
    owner: dict[int, str] = {}
    for _t, action, number, _nbytes, device, address, _op, phase, inputs in events:
        if action in ("alloc", "existing"):
            if number not in owner:
                owner[number] = owner_of.get((device, address)) or (
                    ("activations" if phase in FORWARD_PHASES and _from_the_batch(inputs, owner) else "temporaries")
                    if action == "alloc" else "before_step")
                if owner[number] == "activations" and action == "alloc":
                    for n in inputs:  # what the forward pass read from before the step is its input: the batch
                        if owner.get(n) == "before_step":
                            owner[n] = "inputs"
        elif number not in owner:
            continue
        elif action == "saved":
            owner[number] = SAVED_BECOMES.get(owner[number], owner[number])
        elif action.startswith("owner:"):
            owner[number] = action.removeprefix("owner:")
    return owner


# torch's memory profiler floods activations from the batch the same way (_memory_profiler._set_activations): an
# op's output is one when some input is the batch or an activation, and every other input is a weight or a
# temporary. What a forward op computes from the weights alone (ZeRO-3's gathered parameter, QLoRA's dequantized
# weight) is a temporary; an op that reads a gradient or optimizer state is not the forward pass's.
FROM_THE_BATCH = {"activations", "inputs", "before_step"}
ALSO_READ = {"parameters_trainable", "parameters_frozen", "parameters_quantized", "parameters_unsharded", "buffers",
             "temporaries"}


def _from_the_batch(inputs, owner: dict[int, str]) -> bool:
    read = {owner.get(n, "before_step") for n in inputs}
    return bool(read & FROM_THE_BATCH) and read <= FROM_THE_BATCH | ALSO_READ


def attribute(events: list[tuple], owner_of: dict[tuple[str, int], str]) -> Lifetimes:
    """``events``: ``store.LIFETIME_EVENT_COLUMNS`` rows. A storage's bytes count under its owner for its whole
    life, as the profiler's memory timeline files them: the log-softmax output autograd saves a moment after
    allocating it is an activation at that moment too, so a peak there is not split between temporaries and
    activations by when the owner became known."""
    events = sorted(events, key=lambda e: e[0])
    owner = owners_of(events, owner_of)
    live: dict[int, tuple[int, bool]] = {}  # storage -> bytes, allocated during the steps
    totals: dict[str, int] = {}
    category_totals: dict[str, int] = {}
    total = allocated = allocated_peak = 0
    peak, phases, ends, largest, largest_category = OwnerPeak(), {}, {}, {}, {}
    live_at_start, started = 0, False

    def snapshot(t_ns: int) -> OwnerPeak:
        return OwnerPeak(total, t_ns, {k: v for k, v in totals.items() if v})

    previous = None
    for t_ns, action, number, nbytes, _device, _address, _op, phase, _inputs in events:
        if not started and action != "existing":
            started, live_at_start = True, total  # the tracker declares what it knows first, then follows
        if phase != previous and previous is not None:
            ends[previous] = snapshot(t_ns)  # the state it left
        previous = phase
        if action in ("alloc", "existing"):
            if number in live or number not in owner:
                continue
            before, fresh = 0, action == "alloc"
        elif action == "free" and number in live:
            before, fresh = live.pop(number)
            nbytes = 0
        elif action == "resize" and number in live:
            before, fresh = live[number]
        else:
            continue
        if action != "free":
            live[number] = (nbytes, fresh)
        delta = nbytes - before
        if delta:
            who = owner[number]
            totals[who] = totals.get(who, 0) + delta
            largest[who] = max(largest.get(who, 0), totals[who])
            category = CATEGORY_OF_OWNER.get(who, who)
            category_totals[category] = category_totals.get(category, 0) + delta
            largest_category[category] = max(largest_category.get(category, 0), category_totals[category])
            total += delta
            allocated += delta if fresh else 0
            allocated_peak = max(allocated_peak, allocated)
            if total > peak.bytes:
                peak = snapshot(t_ns)
        at = phases.get(phase)
        if at is None or total > at.bytes:
            phases[phase] = snapshot(t_ns)
    if previous is not None:
        ends[previous] = snapshot(0)
    return Lifetimes(peak, phases, ends, largest, largest_category, allocated_peak, len(events), live_at_start)


@dataclass
class LifetimeEvents:
    """A storage-lifetimes file as read: its events, the inventory's owners by (device, address), and the followed
    step's window in Unix microseconds (None in files written before it was recorded)."""

    events: list[tuple]
    owners: dict[tuple[str, int], str]
    window_us: tuple[int, int] | None


def read_lifetimes(path: Path) -> LifetimeEvents:
    """Read ``storage_lifetimes.json.gz`` (``record.storages``); ValueError names what is wrong."""
    try:
        with gzip.open(path, "rt") as fh:
            data = json.load(fh)
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not a storage-lifetimes file: {exc}") from None
    try:
        columns, rows = data["columns"], data["events"]
        owners = {(device, int(address)): str(owner) for device, address, owner in data["owners"]}
        window = data.get("followed_unix_us")
        window = (int(window[0]), int(window[1])) if window is not None else None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ValueError(f"a damaged storage-lifetimes file: {type(exc).__name__}: {exc}") from None
    width = len(LIFETIME_EVENT_COLUMNS)
    if columns != list(LIFETIME_EVENT_COLUMNS) or not isinstance(rows, list) or any(
            not isinstance(e, list) or len(e) != width or not isinstance(e[0], int) or not isinstance(e[3], int)
            or not isinstance(e[-1], list) for e in rows):
        raise ValueError("a damaged storage-lifetimes file (or one from an older profkit): its events are not "
                         f"({', '.join(LIFETIME_EVENT_COLUMNS)}) rows")
    return LifetimeEvents([(*e[:-1], tuple(e[-1])) for e in rows], owners, window)


def load_lifetimes(path: Path) -> Lifetimes:
    """Read ``storage_lifetimes.json.gz`` and attribute it; ValueError names what is wrong."""
    read = read_lifetimes(path)
    return attribute(read.events, read.owners)


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
