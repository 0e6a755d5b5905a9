"""A model of PyTorch's CUDA caching allocator, to turn a stream of allocations into "reserved" memory.

Rules modelled (c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x defaults):
- every request is rounded up to a multiple of 512 B (and at least 512 B);
- requests of at most 1 MiB come from the small pool, carved out of 2 MiB segments; larger requests come
  from the large pool: under 10 MiB they get a 20 MiB segment, from 10 MiB on a segment of the request
  rounded up to 2 MiB;
- a request takes the best-fitting (smallest sufficient) free block of its pool, which is split when the
  remainder is at least 512 B (small pool) or more than 1 MiB (large pool);
- a freed block merges with free neighbours of the same segment; segments are never returned to the
  device (no `empty_cache`, no out-of-memory retry), so reserved only grows;
- with `expandable_segments:True` the large pool is one segment that grows in 2 MiB pages at its end
  when no free block fits (extending a free tail block first), which removes most fragmentation.
Not modelled: several streams, `max_split_size_mb`, garbage-collection thresholds, CUDA graphs.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20  # largest request served by the small pool
SMALL_BUFFER = 2 << 20  # small-pool segment
LARGE_BUFFER = 20 << 20  # segment for large requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    return MIN_BLOCK if nbytes < MIN_BLOCK else (nbytes + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass(eq=False)
class _Block:
    size: int
    free: bool = True
    prev: _Block | None = None
    next: _Block | None = None
    seg: int = 0


@dataclass
class _Pool:
    small: bool
    free: list[tuple[int, int, _Block]] = field(default_factory=list)  # (size, serial, block)
    serial: int = 0
    tail: _Block | None = None  # expandable: the last block of the one segment

    def add(self, block: _Block) -> None:
        self.serial += 1
        bisect.insort(self.free, (block.size, self.serial, block))

    def remove(self, block: _Block) -> None:
        for i in range(bisect.bisect_left(self.free, (block.size, 0, block)), len(self.free)):
            if self.free[i][2] is block:
                del self.free[i]
                return
        raise KeyError("block not in the free list")

    def best_fit(self, size: int) -> _Block | None:
        i = bisect.bisect_left(self.free, (size, 0))
        return self.free[i][2] if i < len(self.free) else None


class CachingAllocator:
    """Replays alloc/free calls; `allocated`, `reserved` and their peaks are in bytes."""

    def __init__(self, expandable_segments: bool = False) -> None:
        self.expandable = expandable_segments
        self.pools = {True: _Pool(small=True), False: _Pool(small=False)}
        self.live: dict[int, tuple[_Block, int, bool]] = {}
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.segments = 0

    def malloc(self, handle: int, nbytes: int) -> None:
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        pool = self.pools[small]
        block = pool.best_fit(size)
        if block is None:
            block = self._grow(pool, size, small)
        else:
            pool.remove(block)
        remaining = block.size - size
        if remaining >= MIN_BLOCK if small else remaining > SMALL_SIZE:
            rest = _Block(remaining, True, block, block.next, block.seg)
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            if pool.tail is block:
                pool.tail = rest
            pool.add(rest)
        block.free = False
        self.live[handle] = (block, size, small)
        self.allocated += size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def _grow(self, pool: _Pool, size: int, small: bool) -> _Block:
        if small:
            seg = SMALL_BUFFER
        elif size < MIN_LARGE_ALLOC and not self.expandable:
            seg = LARGE_BUFFER
        else:
            seg = _round_up(size, ROUND_LARGE)
        if self.expandable and not small:
            tail = pool.tail
            if tail is not None and tail.free:  # map pages after the free tail and extend it
                pool.remove(tail)
                extra = _round_up(size - tail.size, ROUND_LARGE)
                tail.size += extra
                self._reserve(extra)
                return tail
            block = _Block(seg, True, tail, None, 0)
            if tail is not None:
                tail.next = block
            pool.tail = block
            self._reserve(seg)
            return block
        self.segments += 1
        self._reserve(seg)
        return _Block(seg, True, None, None, self.segments)

    def _reserve(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.peak_reserved = max(self.peak_reserved, self.reserved)

    def free(self, handle: int) -> None:
        block, size, small = self.live.pop(handle)
        pool = self.pools[small]
        self.allocated -= size
        block.free = True
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.free and neighbour.seg == block.seg:
                pool.remove(neighbour)
                block.size += neighbour.size
                if neighbour is block.prev:
                    block.prev = neighbour.prev
                    if neighbour.prev is not None:
                        neighbour.prev.next = block
                else:
                    block.next = neighbour.next
                    if neighbour.next is not None:
                        neighbour.next.prev = block
                if pool.tail is neighbour:
                    pool.tail = block
        pool.add(block)
