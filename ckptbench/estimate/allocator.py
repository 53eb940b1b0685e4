"""A replay of PyTorch's CUDA caching allocator: where each block goes, what is reserved, when it runs out.

Written from the algorithm of ``DeviceCachingAllocator`` in c10/cuda/CUDACachingAllocator.cpp
(torch 2.11-2.14; the function each rule follows is named next to it). No torch: it runs on the
estimator's ordered stream of allocations and frees, or on one recorded on a GPU.

- ``round_size``: requests are rounded up to 512 bytes, or to a power-of-two division when
  ``roundup_power2_divisions`` asks for it;
- ``get_pool`` / ``get_allocation_size``: up to 1 MiB from the small pool, which cudaMallocs 2 MiB
  segments; larger requests from the large pool: below 10 MiB a 20 MiB segment
  (``large_segment_size_mb``), else the request rounded up to 2 MiB;
- ``get_free_block``: best fit among the cached blocks of the same stream and pool; an oversize
  cached block (>= ``max_split_size``) serves only oversize requests within
  ``max_non_split_rounding`` of its size;
- ``should_split`` / ``alloc_found_block``: the rest of a block becomes a cached block when at least
  512 bytes remain (small pool, expandable segments) or more than 1 MiB remains (large pool, and
  the request is below ``max_split_size``);
- ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours of its segment;
- ``malloc``: no cached block fits -> garbage collection (``garbage_collection_threshold``, only
  with a memory fraction set) -> a new segment -> free oversize cached segments
  (``release_available_cached_blocks``) and retry -> free every unsplit cached segment
  (``release_cached_blocks``) and retry, counted in ``num_alloc_retries`` -> out of memory;
- ``alloc_block``: a new segment fails past ``fraction x total`` (set_per_process_memory_fraction)
  or past what the device has left (cudaMalloc; the CUDA context and other processes' memory are
  outside the allocator);
- expandable segments (``expandable_segments:True``) live in estimate/allocator_expandable.py; giving
  cached segments back in estimate/allocator_release.py; limits, counters and OOM in estimate/allocator_stats.py.
"""

from __future__ import annotations

from ckptbench.config.alloc_conf import KLARGE_BUFFER, AllocatorSettings
from ckptbench.estimate.allocator_expandable import ExpandableSegments
from ckptbench.estimate.allocator_pool import Block, BlockPool, Segment
from ckptbench.estimate.allocator_release import CacheRelease
from ckptbench.estimate.allocator_stats import AllocatorOOM, DeviceLimit, Stats

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 2**20  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * 2**20  # kSmallBuffer: a small-pool segment
MIN_LARGE_ALLOC = 10 * 2**20  # kMinLargeAlloc: requests below it get a large_segment_size segment
ROUND_LARGE = 2 * 2**20  # kRoundLarge: larger requests round up to this


def round_power2_division(size: int, divisions: int) -> int:
    """roundup_power2_next_division: the next of ``divisions`` equal steps between two powers of two."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


class CachingAllocator:
    """One device's caching allocator (DeviceCachingAllocator) for one process."""

    def __init__(
        self, settings: AllocatorSettings, limit: DeviceLimit, *, record_segments: bool = False,
        addresses: list[int] | None = None,
    ) -> None:
        self.settings, self.limit = settings, limit
        self.stats = Stats()
        self.pools = {True: BlockPool(small=True), False: BlockPool(small=False)}
        self.record_segments = record_segments
        # Segment addresses: taken from a recorded trace when given (ties between equal-sized cached
        # blocks go to the lower address, as in BlockComparatorSize), else a rising bump pointer.
        self._addresses = list(reversed(addresses or []))
        self._next_addr = 1 << 40
        self.expandable = ExpandableSegments(self)
        self.release = CacheRelease(self)
        self.gc_on = settings.garbage_collection_threshold > 0 and limit.fraction is not None
        self._divisions = any(settings.roundup_power2_divisions)

    # -- sizes -----------------------------------------------------------------------------------
    def round_size(self, size: int) -> int:
        """round_size: 512-byte multiples, or a power-of-two division above divisions x 512 bytes."""
        if size < MIN_BLOCK:
            return MIN_BLOCK
        if not self._divisions:
            return -(-size // MIN_BLOCK) * MIN_BLOCK
        divisions = self.settings.divisions(size)
        if divisions > 1 and size > MIN_BLOCK * divisions:
            return round_power2_division(size, divisions)
        return -(-size // MIN_BLOCK) * MIN_BLOCK

    def allocation_size(self, size: int) -> int:
        """get_allocation_size: the segment a request needs when nothing cached fits."""
        if size <= SMALL_SIZE:
            return SMALL_BUFFER
        if size < MIN_LARGE_ALLOC:
            return self.settings.large_segment_size
        return -(-size // ROUND_LARGE) * ROUND_LARGE

    # -- malloc / free ---------------------------------------------------------------------------
    def malloc(self, requested: int, stream: int = 0) -> Block:
        """DeviceCachingAllocator::malloc: a block for ``requested`` bytes, or AllocatorOOM."""
        size = self.round_size(requested)
        pool = self.pools[size <= SMALL_SIZE]
        alloc_size = self.allocation_size(size)
        block = self._get_free_block(pool, size, stream) or self._new_block(pool, size, alloc_size, stream)
        if block is None:
            self.stats.num_ooms += 1
            raise AllocatorOOM(alloc_size, allocated=self.stats.allocated, reserved=self.stats.reserved)
        return self._use(pool, block, size, requested)

    def _new_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int) -> Block | None:
        """malloc's slow path: collect garbage, then a new segment, then free cached ones and retry."""
        if self.gc_on:
            self.release.garbage_collect()
        block = self._alloc_block(pool, size, alloc_size, stream, retry=False)
        if block is None and self.release.available(pool, size, stream):
            block = self._alloc_block(pool, size, alloc_size, stream, retry=False)
        if block is None and self.release_cached():  # free every unsplit cached segment: a counted retry
            block = self._alloc_block(pool, size, alloc_size, stream, retry=True)
        return block

    def _use(self, pool: BlockPool, block: Block, size: int, requested: int) -> Block:
        """alloc_found_block: split off the rest when should_split says so; mark allocated."""
        if self._should_split(block, size):
            rest = Block(block.addr + size, block.size - size, block.segment)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            pool.cache(rest)
        block.allocated, block.requested = True, requested
        stats = self.stats
        stats.allocated += block.size
        if stats.allocated > stats.peak_allocated:
            stats.peak_allocated = stats.allocated
        return block

    def _should_split(self, block: Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or block.expandable:
            return remaining >= MIN_BLOCK
        max_split = self.settings.max_split_size
        return (max_split is None or size < max_split) and remaining > SMALL_SIZE

    def free(self, block: Block) -> None:
        """free -> free_block: return the block to its pool, merged with free neighbours."""
        assert block.allocated, "double free"
        block.allocated = False
        self.stats.allocated -= block.size
        pool = self.pools[block.small]
        for other in (block.prev, block.next):
            self.merge(pool, block, other)
        pool.cache(block)

    def merge(self, pool: BlockPool, dst: Block, src: Block | None) -> None:
        """try_merge_blocks: absorb a free neighbour with the same mapping state."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        pool.uncache(src)
        if dst.prev is src:
            dst.addr, dst.prev = src.addr, src.prev
            if src.prev is not None:
                src.prev.next = dst
        else:
            dst.next = src.next
            if src.next is not None:
                src.next.prev = dst
        dst.size += src.size

    # -- finding and creating blocks -------------------------------------------------------------
    def _get_free_block(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """get_free_block: the smallest cached block of at least ``size`` bytes, within the oversize rules."""
        if self.gc_on:
            pool.searches += 1  # ages cached blocks only while garbage collection is on
        free = pool.free.get(stream)
        if not free:
            return None
        index = free.lower_bound(size)
        if index >= len(free):
            return None
        if free.at(index).expandable:
            index = self.expandable.best_fit(free, index)
            if index is None:
                return None
        block = free.at(index)
        max_split = self.settings.max_split_size
        if max_split is not None:
            if size < max_split <= block.size:
                return None  # an oversize block never serves a request that could split it
            if size >= max_split and block.size >= size + self.settings.max_non_split_rounding:
                return None
        free.remove(block)
        return block

    def _alloc_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int, *, retry: bool) -> Block | None:
        """alloc_block: a new segment (or mapped pages), unless the fraction or the device is exhausted."""
        if retry:
            self.stats.num_alloc_retries += 1
        allowed = self.limit.allowed_bytes
        if allowed is not None and self.stats.reserved + alloc_size > allowed:
            return None
        if self.settings.expandable_segments:
            return self.expandable.allocate(pool, size, stream)
        if not self.device_has(alloc_size):
            return None
        segment = Segment(self.address(alloc_size), alloc_size, stream, small=pool.small, expandable=False, page=0)
        self.reserve(alloc_size, "segment_alloc", segment.addr)
        return Block(segment.addr, alloc_size, segment)

    @property
    def total_bytes(self) -> int:
        return self.limit.total_bytes

    def device_has(self, nbytes: int) -> bool:
        """Whether cudaMalloc (or cuMemCreate) of ``nbytes`` succeeds: the device's free memory."""
        return self.stats.reserved + nbytes <= self.limit.total_bytes - self.limit.outside_bytes

    def address(self, nbytes: int) -> int:
        if self._addresses:
            return self._addresses.pop()
        addr = self._next_addr
        self._next_addr += -(-nbytes // ROUND_LARGE) * ROUND_LARGE
        return addr

    def reserve(self, nbytes: int, action: str, addr: int) -> None:
        stats = self.stats
        stats.reserved += nbytes
        stats.num_device_alloc += 1
        if stats.reserved > stats.peak_reserved:
            stats.peak_reserved = stats.reserved
        if self.record_segments:
            stats.segment_events.append((action, addr, nbytes))

    def unreserve(self, nbytes: int, action: str, addr: int) -> None:
        self.stats.reserved -= nbytes
        self.stats.num_device_free += 1
        if self.record_segments:
            self.stats.segment_events.append((action, addr, nbytes))

    # -- giving memory back (estimate/allocator_release.py) ---------------------------------------
    def release_cached(self) -> bool:
        """release_cached_blocks (also empty_cache): free every cached block that is a whole segment."""
        return self.release.cached()

    def reset_peak(self) -> None:
        """torch.cuda.reset_peak_memory_stats."""
        self.stats.reset_peak()

    def large_pool_state(self) -> tuple[int, tuple[tuple[int, int, int], ...]]:
        """Reserved bytes and the large pool's cached blocks (stream, address, size): when two steps end
        in the same state, the next step repeats the last one there."""
        pool = self.pools[False]
        blocks = [(s, b.addr, b.size) for s in sorted(pool.free) for b in pool.free[s]]
        blocks += [(s, b.addr, -b.size) for s in sorted(pool.unmapped) for b in pool.unmapped[s]]
        return self.stats.reserved, tuple(blocks)


__all__ = ["KLARGE_BUFFER", "AllocatorOOM", "CachingAllocator", "DeviceLimit", "Stats", "round_power2_division"]
