"""Giving cached memory back in the allocator replay: oversize segments, whole segments, garbage collection. No torch.

Follows c10/cuda/CUDACachingAllocator.cpp (torch 2.11-2.14): ``release_block``,
``release_available_cached_blocks``, ``release_cached_blocks`` (also ``empty_cache``) and
``garbage_collect_cached_blocks``, on the replayed allocator of estimate/allocator.py.
"""

from __future__ import annotations

from typing import Protocol

from ckptbench.config.alloc_conf import AllocatorSettings
from ckptbench.estimate.allocator_expandable import ExpandableSegments
from ckptbench.estimate.allocator_pool import Block, BlockPool
from ckptbench.estimate.allocator_stats import DeviceLimit, Stats


class _Allocator(Protocol):
    """What the release paths use of the replayed allocator (estimate/allocator.py)."""

    settings: AllocatorSettings
    limit: DeviceLimit
    stats: Stats
    pools: dict[bool, BlockPool]
    expandable: ExpandableSegments

    def unreserve(self, nbytes: int, action: str, addr: int) -> None: ...


class CacheRelease:
    """The paths of one replayed allocator that free cached segments (cudaFree) or unmap expandable pages."""

    def __init__(self, allocator: _Allocator) -> None:
        self.allocator = allocator

    def _segment(self, pool: BlockPool, block: Block) -> None:
        """release_block: cudaFree a cached block that is a whole segment."""
        assert not block.is_split() and not block.expandable
        pool.stream_free(block.stream).remove(block)
        self.allocator.unreserve(block.size, "segment_free", block.addr)

    def available(self, pool: BlockPool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: free oversize cached segments, just enough for the request."""
        max_split = self.allocator.settings.max_split_size
        free = pool.free.get(stream)
        if max_split is None or not free:
            return False
        key = max(size, max_split)
        index = free.lower_bound(key)
        if index < len(free) and not free.at(index).expandable:
            self._segment(pool, free.at(index))
            return True
        released = 0
        for block in reversed([free.at(i) for i in range(index)]):  # the largest first
            if released >= key or block.size < max_split:
                break
            if not block.expandable:
                released += block.size
                self._segment(pool, block)
        return released >= key

    def cached(self) -> bool:
        """release_cached_blocks (also empty_cache): free every cached block that is a whole segment."""
        for small in (False, True):  # release_blocks(large_blocks), then release_blocks(small_blocks)
            pool = self.allocator.pools[small]
            grown = []
            for block in pool.all_free():
                if block.expandable:
                    grown.append(block)
                elif not block.is_split():
                    self._segment(pool, block)
            for block in grown:
                self.allocator.expandable.unmap(pool, block)
        return True

    def garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: free the oldest unsplit cached large segments above the threshold."""
        allocator = self.allocator
        allowed = allocator.limit.allowed_bytes or 0
        threshold = int(allocator.settings.garbage_collection_threshold * allowed)
        if allocator.stats.reserved <= threshold:
            return
        target, reclaimed = allocator.stats.reserved - threshold, 0
        pool = allocator.pools[False]
        whole = [b for b in pool.all_free() if not b.is_split()]
        total_age, count = sum(pool.searches - b.gc_base for b in whole), len(whole)
        freed_any = True
        while reclaimed < target and freed_any and count > 0:
            age_threshold = total_age / count
            freed_any = False
            for block in pool.all_free():
                age = pool.searches - block.gc_base
                if not block.is_split() and not block.expandable and age >= age_threshold:
                    freed_any, reclaimed = True, reclaimed + block.size
                    total_age, count = total_age - age, count - 1
                    self._segment(pool, block)
