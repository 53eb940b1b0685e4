"""Expandable segments (``expandable_segments:True``) in the allocator replay. No torch.

Follows c10/cuda/CUDACachingAllocator.cpp (torch 2.11-2.14), Note [Expandable Segments] and
``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``, ``unmap_block``,
``release_expandable_segment``: one segment per stream and pool reserves address space for
1 1/8 of the card and maps physical pages (2 MiB in the small pool, ``large_segment_size`` =
20 MiB in the large pool) as the blocks grow into it; reserved memory is the mapped pages. A
request takes the lowest-addressed free-or-unmapped run that is long enough, mapping what is
missing; blocks split whenever 512 bytes remain; only ``release_cached_blocks`` (a failed
allocation's retry, or empty_cache) unmaps whole free pages.
"""

from __future__ import annotations

from typing import Protocol

from ckptbench.config.alloc_conf import AllocatorSettings
from ckptbench.estimate.allocator_pool import Block, BlockPool, Segment, SortedBlocks

SMALL_PAGE = 2 * 2**20  # kSmallBuffer


def _grown_size(block: Block) -> int:
    """expandable_size: a free block plus the unmapped pages right after it (what it can grow to)."""
    nxt = block.next
    return block.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


class _Allocator(Protocol):
    """What the expandable paths use of the replayed allocator (estimate/allocator.py)."""

    settings: AllocatorSettings

    @property
    def total_bytes(self) -> int: ...
    def device_has(self, nbytes: int) -> bool: ...
    def address(self, nbytes: int) -> int: ...
    def merge(self, pool: BlockPool, dst: Block, src: Block | None) -> None: ...
    def reserve(self, nbytes: int, action: str, addr: int) -> None: ...
    def unreserve(self, nbytes: int, action: str, addr: int) -> None: ...


class ExpandableSegments:
    """The expandable-segment paths of one replayed allocator."""

    def __init__(self, allocator: _Allocator) -> None:
        self.allocator = allocator

    def page(self, small: bool) -> int:
        return SMALL_PAGE if small else self.allocator.settings.large_segment_size

    def best_fit(self, free: SortedBlocks, index: int) -> int:
        """get_free_block's look-ahead: prefer a larger block that can grow less (ties to the first)."""
        while index + 1 < len(free) and free.at(index).expandable:
            if _grown_size(free.at(index + 1)) < _grown_size(free.at(index)):
                index += 1
            else:
                break
        return index

    def allocate(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """try_allocate_expandable_block: a mapped block of at least ``size`` bytes, or None."""
        candidate = self._find(pool, size, stream)
        if not candidate.mapped and not self._map(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            grow = candidate.next
            assert grow is not None and not grow.mapped
            if not self._map(pool, grow, min(size - candidate.size, grow.size)):
                return None
            candidate = grow  # map_block merged the free candidate into it
        pool.stream_free(stream).remove(candidate)
        return candidate

    def _find(self, pool: BlockPool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest address with ``size`` free-or-unmapped bytes, or a new segment."""
        for block in pool.stream_unmapped(stream):
            start = block
            if block.prev is not None and block.prev.allocatable():
                start = block.prev  # a free block right before the unmapped pages grows into them
            run = 0
            walk_: Block | None = start
            while run < size and walk_ is not None and walk_.allocatable():
                run += walk_.size
                walk_ = walk_.next
            if run >= size:
                return start
        page = self.page(pool.small)
        total = self.allocator.total_bytes
        pages = -(-(total + total // 8) // page)  # address space for 1 1/8 of the card
        segment = Segment(self.allocator.address(pages * page), pages * page, stream,
                          small=pool.small, expandable=True, page=page)
        block = Block(segment.addr, segment.size, segment, mapped=False)
        pool.stream_unmapped(stream).add(block)
        return block

    def _map(self, pool: BlockPool, block: Block, size: int) -> bool:
        """map_block: back the first ``size`` bytes of an unmapped block with whole pages."""
        page = block.segment.page
        mapped = min(-(-size // page) * page, block.size)
        if not self.allocator.device_has(mapped):
            return False  # cuMemCreate ran out of memory: the pages created so far are released
        pool.stream_unmapped(block.stream).remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.segment, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            pool.stream_unmapped(block.stream).add(rest)
        for other in (block.prev, block.next):
            self.allocator.merge(pool, block, other)
        pool.cache(block)
        self.allocator.reserve(mapped, "segment_map", block.addr)
        return True

    def unmap(self, pool: BlockPool, block: Block) -> None:
        """unmap_block (+ release_expandable_segment): give back the whole free pages of a cached block."""
        base, page = block.segment.addr, block.segment.page
        begin = base + -(-(block.addr - base) // page) * page
        end = base + ((block.addr + block.size - base) // page) * page
        if begin >= end:
            return
        pool.stream_free(block.stream).remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.segment)
            self._splice(before, block.prev, block)
            pool.cache(before)
        if block.addr + block.size > end:
            after = Block(end, block.addr + block.size - end, block.segment)
            self._splice(after, block, block.next)
            pool.cache(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        for other in (block.prev, block.next):
            self.allocator.merge(pool, block, other)
        pool.stream_unmapped(block.stream).add(block)
        self.allocator.unreserve(end - begin, "segment_unmap", begin)
        if block.prev is None and block.next is None:
            pool.stream_unmapped(block.stream).remove(block)  # release_expandable_segment

    @staticmethod
    def _splice(block: Block, before: Block | None, after: Block | None) -> None:
        """Block::splice: link ``block`` between two neighbours."""
        if before is not None:
            before.next = block
        block.prev = before
        if after is not None:
            after.prev = block
        block.next = after
