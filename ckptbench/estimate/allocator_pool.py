"""The caching allocator's bookkeeping: blocks, segments and the per-stream pools of cached blocks. No torch.

Mirrors the data structures of c10/cuda/CUDACachingAllocator.cpp (torch 2.11-2.14): a ``Block`` is
a piece of a segment (one cudaMalloc, or the mapped pages of an expandable segment), linked to its
neighbours in address order (``prev``/``next``) so that freed neighbours merge; free blocks wait in
a ``BlockPool`` ordered by (stream, size, address) (``BlockComparatorSize``), one pool for small
blocks (<= 1 MiB) and one for large ones; unmapped pages of expandable segments are ordered by
(stream, address) (``BlockComparatorAddress``). Streams are kept apart by one sorted list per stream,
which is what the stream-first comparator gives.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator


class Segment:
    """One cudaMalloc (``expandable`` False) or one expandable segment's reserved address space."""

    __slots__ = ("addr", "expandable", "page", "size", "small", "stream")

    def __init__(self, addr: int, size: int, stream: int, *, small: bool, expandable: bool, page: int) -> None:
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.expandable, self.page = expandable, page


class Block:
    """A piece of a segment: allocated, free (cached) or, in an expandable segment, unmapped."""

    __slots__ = ("addr", "allocated", "gc_base", "key", "mapped", "next", "prev", "requested", "segment", "size")

    def __init__(self, addr: int, size: int, segment: Segment, *, mapped: bool = True) -> None:
        self.addr, self.size, self.segment, self.mapped = addr, size, segment, mapped
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None
        self.gc_base = 0  # the pool's get_free_block count when the block was cached (garbage collection)
        self.requested = 0  # bytes asked for (before rounding)
        self.key = -1  # the allocation it serves

    @property
    def stream(self) -> int:
        return self.segment.stream

    @property
    def small(self) -> bool:
        return self.segment.small

    @property
    def expandable(self) -> bool:
        return self.segment.expandable

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def allocatable(self) -> bool:
        """Free or unmapped: find_expandable_block may grow into it."""
        return not self.allocated


class SortedBlocks:
    """Blocks of one stream, ordered by a key: (size, address) for free blocks, address for unmapped ones."""

    __slots__ = ("blocks", "by_address", "keys")

    def __init__(self, *, by_address: bool = False) -> None:
        self.keys: list[tuple[int, int]] = []
        self.blocks: dict[tuple[int, int], Block] = {}
        self.by_address = by_address

    def _key(self, block: Block) -> tuple[int, int]:
        return (block.addr, 0) if self.by_address else (block.size, block.addr)

    def add(self, block: Block) -> None:
        key = self._key(block)
        bisect.insort(self.keys, key)
        self.blocks[key] = block

    def remove(self, block: Block) -> None:
        key = self._key(block)
        del self.blocks[key]
        del self.keys[bisect.bisect_left(self.keys, key)]

    def __contains__(self, block: Block) -> bool:
        return self.blocks.get(self._key(block)) is block

    def __len__(self) -> int:
        return len(self.keys)

    def at(self, index: int) -> Block:
        return self.blocks[self.keys[index]]

    def lower_bound(self, size: int) -> int:
        """Index of the smallest block of at least ``size`` bytes (len(self) when none)."""
        return bisect.bisect_left(self.keys, (size, -1))

    def __iter__(self) -> Iterator[Block]:
        return iter([self.blocks[k] for k in self.keys])


class BlockPool:
    """Cached free blocks of one kind (small or large) per stream, plus unmapped expandable pages."""

    def __init__(self, *, small: bool) -> None:
        self.small = small
        self.free: dict[int, SortedBlocks] = {}
        self.unmapped: dict[int, SortedBlocks] = {}
        # get_free_blocks_call_count: counts searches while garbage collection is on; a cached
        # block's age is this count minus the count when it was cached (Block::gc_count).
        self.searches = 0

    def stream_free(self, stream: int) -> SortedBlocks:
        found = self.free.get(stream)
        if found is None:
            found = self.free[stream] = SortedBlocks()
        return found

    def stream_unmapped(self, stream: int) -> SortedBlocks:
        found = self.unmapped.get(stream)
        if found is None:
            found = self.unmapped[stream] = SortedBlocks(by_address=True)
        return found

    def cache(self, block: Block) -> None:
        """insert_into_blocks: cache a free block and start its garbage-collection age."""
        block.gc_base = self.searches
        self.stream_free(block.stream).add(block)

    def uncache(self, block: Block) -> None:
        (self.stream_free(block.stream) if block.mapped else self.stream_unmapped(block.stream)).remove(block)

    def all_free(self) -> list[Block]:
        """Every cached block in (stream, size, address) order, as the pool's std::set iterates."""
        return [b for stream in sorted(self.free) for b in self.free[stream]]
