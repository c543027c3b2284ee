"""Owners of the CUDA allocator's blocks: its recorded history (the run's ``memory_snapshot.pickle``) matched to the
storage lifetimes of the same step, so the owner breakdown and everything the dispatcher never saw (an op's own
workspace, Inductor's kernel buffers, a communication library's buffers) come from one record, the allocator's.
Pure: a loaded snapshot and the lifetimes' events in, figures out.

Matching: the followed step's window (the tracker's own clock in Unix microseconds, the clock of the history's
``time_us``) holds the history's allocations; each is matched to the next storage the tracker saw allocated at the
same address with the same size (rounded up to the allocator's 512-byte blocks), in order. A block with no such
storage was allocated outside the dispatcher. Blocks allocated before the history began are known by address
from the inventory (parameters, optimizer state), else they existed before the step and nothing names them.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

from profkit.analyze.lifetimes import CATEGORY_OF_OWNER, owners_of
from profkit.analyze.snapshot import ACTIVE  # the block states that hold an allocation

BLOCK = 512  # the caching allocator's smallest block, and the multiple it rounds every request up to
UNSEEN = "unseen"  # allocated where the dispatcher could not see it


def _rounded(nbytes: int) -> int:
    return max(BLOCK, -(-nbytes // BLOCK) * BLOCK)


@dataclass
class AllocatorOwners:
    device: str
    peak_bytes: int  # the allocator's allocated bytes at its peak inside the followed step
    by_category: dict[str, int]  # at that peak, the breakdown's memory categories (UNSEEN under unattributed)
    unseen_bytes: int  # at that peak, blocks no storage of the tracker's matches
    matched: int  # the window's allocations matched to a storage
    allocations: int  # the window's allocations
    notes: list[str] = field(default_factory=list)


def attribute_history(snapshot: dict, events: list[tuple], static_owner: dict[tuple[str, int], str],
                      window_us: tuple[float, float], device_index: int) -> AllocatorOwners | None:
    """The owner breakdown at the allocator's peak inside ``window_us`` on one CUDA device. ``events``: the
    lifetimes' rows (``store.LIFETIME_EVENT_COLUMNS``); ``static_owner``: the inventory's owners by (device,
    address). None when the snapshot holds no history for the device or none of it falls in the window."""
    traces = snapshot.get("device_traces") or []
    history = traces[device_index] if device_index < len(traces) else None
    device = f"cuda:{device_index}"
    start, end = window_us
    if not history or not any(start <= e.get("time_us", -1) <= end for e in history):
        return None
    events = sorted(events, key=lambda e: e[0])
    owner = owners_of(events, static_owner)
    expected: dict[int, deque] = defaultdict(deque)  # address -> the storages allocated there, in order
    known = {a: o for (d, a), o in static_owner.items() if d == device}  # what existed before, by address
    for _t, action, number, nbytes, ev_device, address, *_ in events:
        if ev_device != device:
            continue
        if action == "alloc":
            expected[address].append((number, _rounded(nbytes)))
        elif action == "existing" and number in owner:
            known.setdefault(address, owner[number])  # the batch, read by the forward pass: an input

    def category(who: str) -> str:
        return CATEGORY_OF_OWNER.get(who, who)

    # What was live before the history began: blocks still live at the dump, and those freed during it.
    seen: set[int] = set()
    before: dict[int, int] = {}
    for e in history:
        if e.get("action") == "alloc":
            seen.add(e.get("addr"))
        elif e.get("action") == "free_completed" and e.get("addr") not in seen:
            before[e.get("addr")] = e.get("size", 0)
    for segment in snapshot.get("segments") or []:
        if segment.get("device", 0) != device_index:
            continue
        address = segment.get("address", 0)
        for block in segment.get("blocks") or []:
            if block.get("state") in ACTIVE and address not in seen:
                before[address] = block.get("requested_size") or block.get("size", 0)
            address += block.get("size", 0)

    live: dict[int, tuple[int, str]] = {a: (n, category(known.get(a, "before_step"))) for a, n in before.items()}
    total = sum(n for n, _ in live.values())
    best, best_live, matched, allocations = -1, {}, 0, 0
    for e in sorted(history, key=lambda e: e.get("time_us", 0)):
        action, address, size, t = e.get("action"), e.get("addr"), e.get("size", 0), e.get("time_us", 0)
        inside = start <= t <= end
        if action == "alloc":
            who = "temporaries"  # allocated in the cycle outside the followed step: the tracker cannot say
            queue = expected.get(address)
            if inside:
                allocations += 1
                who = UNSEEN
                if queue and queue[0][1] == _rounded(size):
                    who = category(owner.get(queue.popleft()[0], "temporaries"))
                    matched += 1
            live[address] = (size, who)
            total += size
        elif action == "free_completed" and address in live:
            total -= live.pop(address)[0]
        else:
            continue
        if inside and total > best:
            best, best_live = total, dict(live)
    by_category: dict[str, int] = {}
    for nbytes, who in best_live.values():
        key = "unattributed" if who == UNSEEN else who
        by_category[key] = by_category.get(key, 0) + nbytes
    unseen = sum(n for n, who in best_live.values() if who == UNSEEN)
    notes = []
    if allocations and matched < allocations:
        notes.append(f"{device}: {allocations - matched:,} of the followed step's {allocations:,} allocations were made "
                     f"outside the dispatcher ({unseen:,} bytes of them live at the allocator's peak, unattributed)")
    return AllocatorOwners(device, max(best, 0), by_category, unseen, matched, allocations, notes)
