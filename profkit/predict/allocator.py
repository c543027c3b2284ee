"""The CUDA caching allocator's block policy, replayed on a stream of allocations and frees.

What ``max_memory_reserved`` (and so most of nvidia-smi's figure) shows is not the allocated peak: the caching
allocator rounds each request, carves it from cached blocks or from a new segment obtained with ``cudaMalloc``,
splits and merges blocks, and never returns a segment unless an allocation fails. The same allocations in a
different order reserve a different amount. PyTorch exposes only the allocator itself, which needs a GPU, so its
policy is written out here from ``c10/cuda/CUDACachingAllocator.cpp`` (native backend, default settings: no
``expandable_segments``, no ``max_split_size_mb``, no power-of-two rounding):

- a request is rounded up to a multiple of 512 bytes;
- up to 1 MiB it comes from the small pool, whose segments are 2 MiB; larger ones from the large pool, whose
  segments are 20 MiB for requests under 10 MiB and the request rounded up to 2 MiB otherwise;
- the smallest cached block of the same pool and stream that fits is used (best fit, then lowest address);
- the rest of a block is split off when it is at least 512 bytes (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours of its segment;
- when ``cudaMalloc`` fails (the device is full: ``capacity``), every segment whose blocks are all free goes back
  to the driver and the request is tried again; if it still does not fit, the allocation fails (out of memory).

tests/test_allocator_model.py holds this to real allocator snapshots: replaying their recorded allocations and
frees, it opens the same segments, in the same order and of the same sizes, as the allocator did.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MIN_BLOCK = 512
SMALL_REQUEST = 1 << 20  # kSmallSize: the largest request served from the small pool
SMALL_SEGMENT = 2 << 20  # kSmallBuffer
LARGE_SEGMENT = 20 << 20  # kLargeBuffer: the segment of a large-pool request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
LARGE_ROUNDING = 2 << 20  # kRoundLarge


def rounded(size: int) -> int:
    """The block size the allocator serves for a request of ``size`` bytes."""
    return MIN_BLOCK if size < MIN_BLOCK else MIN_BLOCK * -(-size // MIN_BLOCK)


def segment_size(block: int) -> int:
    """The bytes ``cudaMalloc`` is asked for when no cached block fits a rounded request of ``block`` bytes."""
    if block <= SMALL_REQUEST:
        return SMALL_SEGMENT
    if block < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return LARGE_ROUNDING * -(-block // LARGE_ROUNDING)


@dataclass(eq=False)
class _Block:
    size: int
    address: int
    small: bool
    stream: int
    prev: _Block | None = None
    next: _Block | None = None
    allocated: bool = False

    def key(self) -> tuple[int, int, int]:
        return self.stream, self.size, self.address


class OutOfMemory(Exception):
    def __init__(self, requested: int, allocated: int, reserved: int, capacity: int):
        self.requested, self.allocated, self.reserved, self.capacity = requested, allocated, reserved, capacity
        super().__init__(f"a request of {requested} bytes does not fit: {allocated} allocated, {reserved} reserved "
                         f"of {capacity}")


class CachingAllocator:
    """Allocated and reserved bytes, now and at their peaks, of a stream of ``malloc(handle, bytes)`` and
    ``free(handle)`` calls; ``segments`` lists every ``cudaMalloc`` in order. ``capacity``: the bytes ``cudaMalloc``
    can give (None: unbounded); ``released``, what was given back to make room."""

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.released = 0
        self._free: dict[bool, list[tuple[tuple[int, int, int], _Block]]] = {True: [], False: []}
        self._blocks: dict[object, _Block] = {}
        self._next_address = 0
        self.segments: list[int] = []
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def malloc(self, handle, size: int, stream: int = 0) -> None:
        if handle in self._blocks:
            raise ValueError(f"allocation {handle!r} is already live")
        size = rounded(size)
        small = size <= SMALL_REQUEST
        pool = self._free[small]
        i = bisect.bisect_left(pool, ((stream, size, -1),))
        if i < len(pool) and pool[i][1].stream == stream:
            block = pool.pop(i)[1]
        else:
            segment = segment_size(size)
            if self.capacity is not None and self.reserved + segment > self.capacity:
                self._release_cached()
                if self.reserved + segment > self.capacity:
                    raise OutOfMemory(size, self.allocated, self.reserved, self.capacity)
            block = _Block(segment, self._next_address, small, stream)
            self._next_address += segment
            self.segments.append(segment)
            self.reserved += segment
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block.size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_REQUEST:
            tail = _Block(rest, block.address + size, small, stream, prev=block, next=block.next)
            if block.next is not None:
                block.next.prev = tail
            block.next, block.size = tail, size
            self._cache(tail)
        block.allocated = True
        self._blocks[handle] = block
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, handle) -> None:
        block = self._blocks.pop(handle)
        block.allocated = False
        self.allocated -= block.size
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._uncache(prev)
            prev.size += block.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            block = prev
        if nxt is not None and not nxt.allocated:
            self._uncache(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = block
        self._cache(block)

    def _release_cached(self) -> None:
        """Every segment that is one free block goes back to the driver, as the allocator does when cudaMalloc fails
        (``release_cached_blocks``)."""
        for small, pool in self._free.items():
            kept = []
            for entry in pool:
                block = entry[1]
                if block.prev is None and block.next is None:  # one free block: the whole segment is free
                    self.reserved -= block.size
                    self.released += block.size
                else:
                    kept.append(entry)
            self._free[small] = kept

    def live(self, handle) -> bool:
        return handle in self._blocks

    def _cache(self, block: _Block) -> None:
        bisect.insort(self._free[block.small], (block.key(), block))

    def _uncache(self, block: _Block) -> None:
        pool = self._free[block.small]
        i = bisect.bisect_left(pool, (block.key(),))
        del pool[i]
