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
- expandable segments (``expandable_segments:True``, Note [Expandable Segments],
  ``find_expandable_block``, ``map_block``, ``try_allocate_expandable_block``, ``unmap_block``,
  ``release_expandable_segment``): one segment per stream and pool reserves address space for
  1 1/8 of the card and maps physical pages (2 MiB in the small pool, ``large_segment_size`` =
  20 MiB in the large pool) as the blocks grow into it; reserved memory is the mapped pages. A
  request takes the lowest-addressed free-or-unmapped run that is long enough, mapping what is
  missing; blocks split whenever 512 bytes remain; only ``release_cached_blocks`` (a failed
  allocation's retry, or empty_cache) unmaps whole free pages.

The bookkeeping mirrors the C++ data structures: a ``Block`` is a piece of an
``AllocatorSegment`` (one cudaMalloc, or the mapped pages of an expandable segment), linked to its
neighbours in address order (``prev``/``next``) so that freed neighbours merge; free blocks wait in
a ``BlockPool`` ordered by (stream, size, address) (``BlockComparatorSize``), one pool for small
blocks (<= 1 MiB) and one for large ones; unmapped pages of expandable segments are ordered by
(stream, address) (``BlockComparatorAddress``). Streams are kept apart by one sorted list per stream,
which is what the stream-first comparator gives.
"""

from __future__ import annotations

import bisect
import os
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from types import ModuleType
from typing import Protocol

from ckptbench.config.alloc_conf import AllocatorSettings
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.native_fingerprint import source_hash

MIN_BLOCK = 512  # kMinBlockSize
SMALL_SIZE = 2**20  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * 2**20  # kSmallBuffer: a small-pool segment, and an expandable small-pool page
MIN_LARGE_ALLOC = 10 * 2**20  # kMinLargeAlloc: requests below it get a large_segment_size segment
ROUND_LARGE = 2 * 2**20  # kRoundLarge: larger requests round up to this


# -- limits, counters, out of memory ---------------------------------------------------------------
class AllocatorOOM(Exception):
    """The replayed allocator cannot serve a request (torch raises torch.OutOfMemoryError there)."""

    def __init__(self, size: int, *, allocated: int, reserved: int) -> None:
        super().__init__(f"cannot allocate {size} bytes ({allocated} allocated, {reserved} reserved)")
        self.size, self.allocated, self.reserved = size, allocated, reserved
        self.request: tuple[int, int, int] | None = None  # the request that failed, where ``serve`` was serving


@dataclass(frozen=True)
class DeviceLimit:
    """What the allocator may reserve: the card, the per-process fraction, memory outside the allocator."""

    total_bytes: int  # cudaMemGetInfo's total (torch.cuda.get_device_properties().total_memory)
    fraction: float | None = None  # set_per_process_memory_fraction; None: never set
    outside_bytes: int = 0  # CUDA context, other processes: cudaMalloc fails before the allocator's cap

    @property
    def allowed_bytes(self) -> int | None:
        """allowed_memory_maximum = fraction x total, when a fraction is set."""
        return None if self.fraction is None else int(self.fraction * self.total_bytes)


@dataclass
class Stats:
    """The allocator's counters, as torch.cuda.memory_stats names them."""

    allocated: int = 0
    reserved: int = 0
    peak_allocated: int = 0
    peak_reserved: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    num_device_alloc: int = 0
    num_device_free: int = 0
    # (action, address, bytes) of every segment alloc/free (or expandable map/unmap), when recorded
    segment_events: list[tuple[str, int, int]] = field(default_factory=list)

    def reset_peak(self) -> None:
        self.peak_allocated, self.peak_reserved = self.allocated, self.reserved


# -- segments, blocks, pools -----------------------------------------------------------------------
class AllocatorSegment:
    """One cudaMalloc (``expandable`` False) or one expandable segment's reserved address space."""

    __slots__ = ("addr", "expandable", "page", "size", "small", "stream")

    def __init__(self, addr: int, size: int, stream: int, *, small: bool, expandable: bool, page: int) -> None:
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.expandable, self.page = expandable, page


class Block:
    """A piece of a segment: allocated, free (cached) or, in an expandable segment, unmapped."""

    __slots__ = ("addr", "allocated", "gc_base", "key", "mapped", "next", "prev", "requested", "segment", "size")

    def __init__(self, addr: int, size: int, segment: AllocatorSegment, *, mapped: bool = True) -> None:
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

    def grown_size(self) -> int:
        """expandable_size: a free block plus the unmapped pages right after it (what it can grow to)."""
        nxt = self.next
        return self.size + (nxt.size if nxt is not None and not nxt.mapped else 0)

    def splice(self, before: Block | None, after: Block | None) -> None:
        """Block::splice: link this block between two neighbours."""
        if before is not None:
            before.next = self
        self.prev = before
        if after is not None:
            after.prev = self
        self.next = after


class SortedBlocks:
    """Blocks of one stream, ordered by a key: (size, address) for free blocks, address for unmapped ones.

    A key is one int (``size << 64 | address``, or the address) rather than a tuple: the lists are bisected
    on every request, and ints compare and hash faster; the order is the same."""

    __slots__ = ("blocks", "by_address", "keys")

    def __init__(self, *, by_address: bool = False) -> None:
        self.keys: list[int] = []
        self.blocks: dict[int, Block] = {}
        self.by_address = by_address

    def _key(self, block: Block) -> int:
        return block.addr if self.by_address else (block.size << 64) | block.addr

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

    def pop(self, index: int) -> Block:
        """Take out the block at ``index``."""
        return self.blocks.pop(self.keys.pop(index))

    def lower_bound(self, size: int) -> int:
        """Index of the smallest block of at least ``size`` bytes (len(self) when none)."""
        return bisect.bisect_left(self.keys, size << 64)

    def __iter__(self) -> Iterator[Block]:
        return iter([self.blocks[k] for k in self.keys])


class FreeBlocks(Protocol):
    """The free blocks of one stream and pool in (size, address) order: ``SortedBlocks``, or the C extension's
    ``FreeList`` (the same methods)."""

    def add(self, block: Block) -> None: ...
    def remove(self, block: Block) -> None: ...
    def at(self, index: int) -> Block: ...
    def pop(self, index: int) -> Block: ...
    def lower_bound(self, size: int) -> int: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Block]: ...
    def __contains__(self, block: Block) -> bool: ...


def _load_native() -> ModuleType | None:
    """The optional C fast path (``_replay_native.c``, built by setup.py), bound to this module's classes; None when it
    was not built, when CKPTBENCH_NATIVE=0 asks for the general rules alone, or (with a warning: every request then
    takes the general rules, the same bytes, slower) when the build is older than the source beside it (another
    fingerprint, ``native_fingerprint.py``; an install without the source uses its build as it is) or refuses this
    module's ``Block``/``AllocatorSegment`` (their slots or ``__init__`` are not what it was written for)."""
    if os.environ.get("CKPTBENCH_NATIVE", "1") == "0":
        return None
    try:
        from ckptbench.estimator import _replay_native
    except ImportError:
        return None
    source = source_hash()
    if source is not None and getattr(_replay_native, "SOURCE_HASH", None) != source:
        warnings.warn(
            "ckptbench: the estimator's C part is an older build than its source; estimating with the general rules "
            "in pure Python (the same numbers, slower). Rebuild it: pip install -e .", RuntimeWarning, stacklevel=2,
        )
        return None
    try:
        _replay_native.bind(Block, AllocatorSegment)
    except TypeError as exc:
        warnings.warn(f"ckptbench: {exc}; estimating with the general rules in pure Python (the same numbers, slower). "
                      "Rebuild it: pip install -e .", RuntimeWarning, stacklevel=2)
        return None
    return _replay_native


NATIVE = _load_native()


class BlockPool:
    """Cached free blocks of one kind (small or large) per stream, plus unmapped expandable pages."""

    def __init__(self, *, small: bool, native: ModuleType | None = None) -> None:
        self.small = small
        # One list per stream, made when a stream first caches a block: SortedBlocks, or free lists in C (FreeList).
        self.free: defaultdict[int, FreeBlocks] = defaultdict(SortedBlocks if native is None else native.FreeList)
        self.unmapped: defaultdict[int, SortedBlocks] = defaultdict(partial(SortedBlocks, by_address=True))
        # get_free_blocks_call_count: counts searches while garbage collection is on; a cached
        # block's age is this count minus the count when it was cached (Block::gc_count).
        self.searches = 0

    def cache(self, block: Block) -> None:
        """insert_into_blocks: cache a free block and start its garbage-collection age."""
        block.gc_base = self.searches
        self.free[block.segment.stream].add(block)

    def uncache(self, block: Block) -> None:
        (self.free if block.mapped else self.unmapped)[block.segment.stream].remove(block)

    def all_free(self) -> list[Block]:
        """Every cached block in (stream, size, address) order, as the pool's std::set iterates."""
        return [b for stream in sorted(self.free) for b in self.free[stream]]


# -- the allocator ---------------------------------------------------------------------------------
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


def collects_garbage(settings: AllocatorSettings, limit: DeviceLimit) -> bool:
    """Whether cached blocks are garbage-collected: a threshold, with a memory fraction set."""
    return settings.garbage_collection_threshold > 0 and limit.fraction is not None


def default_rules(settings: AllocatorSettings, limit: DeviceLimit) -> bool:
    """Whether the allocator runs the default settings' rules, which the C part knows: no expandable segments, garbage
    collection, max_split_size or power-of-two rounding."""
    return not (settings.expandable_segments or collects_garbage(settings, limit)
                or any(settings.roundup_power2_divisions) or settings.max_split_size is not None)


class CachingAllocator:
    """One device's caching allocator (DeviceCachingAllocator) for one process."""

    def __init__(
        self, settings: AllocatorSettings, limit: DeviceLimit, *, record_segments: bool = False,
        addresses: list[int] | None = None, native: bool | None = None,
    ) -> None:
        """``native``: the free lists, and ``serve`` under the default settings, in C (``_replay_native``); None: when
        it was built, False: the general rules alone, True: C or RuntimeError."""
        if native and NATIVE is None:
            raise RuntimeError("the C part of the estimator (ckptbench.estimator._replay_native) is not built")
        self._native = None if native is False else NATIVE
        self.settings, self.limit = settings, limit
        self.stats = Stats()
        self.pools = {small: BlockPool(small=small, native=self._native) for small in (True, False)}
        self.record_segments = record_segments
        # Segment addresses: taken from a recorded trace when given (ties between equal-sized cached
        # blocks go to the lower address, as in BlockComparatorSize), else a rising bump pointer.
        self._addresses = list(reversed(addresses or []))
        self._next_addr = 1 << 40
        self.gc_on = collects_garbage(settings, limit)
        self._divisions = any(settings.roundup_power2_divisions)
        # The C loop knows the default settings' rules only (issue 24).
        self._serves_in_c = self._native is not None and default_rules(settings, limit)

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
        block = self._get_free_block(pool, size, stream)
        if block is None:
            alloc_size = self.allocation_size(size)
            block = self._new_block(pool, size, alloc_size, stream)
            if block is None:
                self.stats.num_ooms += 1
                raise AllocatorOOM(alloc_size, allocated=self.stats.allocated, reserved=self.stats.reserved)
        return self._use(pool, block, size, requested)

    def serve(self, requests: Sequence[tuple[int, int, int]], live: dict[int, Block]) -> None:
        """Serve ``(op, key, bytes)`` requests on stream 0 in order: ALLOC allocates ``bytes`` into ``live[key]``
        (``malloc``), any other op frees ``live.pop(key)`` (``free``). A request that cannot be served raises
        AllocatorOOM with ``request`` set to it.

        The replay's hot path (about 4,400 requests a step, issue 24). Under the default settings, where the C part is
        built, its loop serves the requests it can exactly as the general rules would and leaves the others to them
        (``_serve_in_c``); everywhere else every request takes the general rules here."""
        if self._serves_in_c:
            self._serve_in_c(requests, live)
        else:
            self._serve_by_rules(requests, live)

    def _serve_by_rules(self, requests: Sequence[tuple[int, int, int]], live: dict[int, Block]) -> None:
        """``serve``, request by request through the general rules."""
        op, key, nbytes = ALLOC, -1, 0
        try:
            for op, key, nbytes in requests:
                if op == ALLOC:
                    live[key] = self.malloc(nbytes)
                else:
                    self.free(live.pop(key))
        except AllocatorOOM as oom:
            oom.request = (op, key, nbytes)
            raise

    def _serve_in_c(self, requests: Sequence[tuple[int, int, int]], live: dict[int, Block]) -> None:
        """``serve`` in C: it serves requests, new segments included while the fraction and the device have room (and
        no recorded addresses are to be used), until one is left to the general rules (a new segment that needs
        cached ones freed first or runs out, an unknown key...) and says which; that one takes the general rules
        (``_serve_by_rules``), and C goes on from the next."""
        assert self._native is not None
        small_pool, large_pool = self.pools[True], self.pools[False]
        small_free, large_free = small_pool.free[0], large_pool.free[0]
        allowed, limit = self.limit.allowed_bytes, self.limit
        position, end = 0, len(requests)
        while True:
            segments = None if self._addresses else (
                -1 if allowed is None else allowed, limit.total_bytes - limit.outside_bytes,
                self.settings.large_segment_size, self._next_addr,
                self.stats.segment_events if self.record_segments else None,
            )
            position, next_addr = self._native.serve(
                requests, position, live, small_free, large_free, small_pool.searches, large_pool.searches,
                self.stats, ALLOC, segments,
            )
            if segments is not None:  # C made the segments: the bump pointer moved on
                self._next_addr = next_addr
            if position >= end:
                return
            self._serve_by_rules(requests[position:position + 1], live)
            position += 1

    def _new_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int) -> Block | None:
        """malloc's slow path: collect garbage, then a new segment, then free cached ones and retry."""
        if self.gc_on:
            self._garbage_collect()
        block = self._alloc_block(pool, size, alloc_size, stream, retry=False)
        if block is None and self._release_available(pool, size, stream):
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
        segment = block.segment
        if segment.small or segment.expandable:
            return remaining >= MIN_BLOCK
        max_split = self.settings.max_split_size
        return (max_split is None or size < max_split) and remaining > SMALL_SIZE

    def free(self, block: Block) -> None:
        """free -> free_block: return the block to its pool, merged with free neighbours."""
        assert block.allocated, "double free"
        block.allocated = False
        self.stats.allocated -= block.size
        pool = self.pools[block.segment.small]
        for other in (block.prev, block.next):
            self._merge(pool, block, other)
        pool.cache(block)

    def _merge(self, pool: BlockPool, dst: Block, src: Block | None) -> None:
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
        if free is None:
            return None
        index = free.lower_bound(size)
        if index >= len(free):
            return None
        block = free.at(index)
        if block.segment.expandable:
            index = self._expandable_best_fit(free, index)
            block = free.at(index)
        max_split = self.settings.max_split_size
        if max_split is not None:
            if size < max_split <= block.size:
                return None  # an oversize block never serves a request that could split it
            if size >= max_split and block.size >= size + self.settings.max_non_split_rounding:
                return None
        return free.pop(index)

    def _alloc_block(self, pool: BlockPool, size: int, alloc_size: int, stream: int, *, retry: bool) -> Block | None:
        """alloc_block: a new segment (or mapped pages), unless the fraction or the device is exhausted."""
        if retry:
            self.stats.num_alloc_retries += 1
        allowed = self.limit.allowed_bytes
        if allowed is not None and self.stats.reserved + alloc_size > allowed:
            return None
        if self.settings.expandable_segments:
            return self._allocate_expandable(pool, size, stream)
        if not self._device_has(alloc_size):
            return None
        segment = AllocatorSegment(self._address(alloc_size), alloc_size, stream, small=pool.small,
                                   expandable=False, page=0)
        self._reserve(alloc_size, "segment_alloc", segment.addr)
        return Block(segment.addr, alloc_size, segment)

    def _device_has(self, nbytes: int) -> bool:
        """Whether cudaMalloc (or cuMemCreate) of ``nbytes`` succeeds: the device's free memory."""
        return self.stats.reserved + nbytes <= self.limit.total_bytes - self.limit.outside_bytes

    def _address(self, nbytes: int) -> int:
        if self._addresses:
            return self._addresses.pop()
        addr = self._next_addr
        self._next_addr += -(-nbytes // ROUND_LARGE) * ROUND_LARGE
        return addr

    def _reserve(self, nbytes: int, action: str, addr: int) -> None:
        stats = self.stats
        stats.reserved += nbytes
        stats.num_device_alloc += 1
        if stats.reserved > stats.peak_reserved:
            stats.peak_reserved = stats.reserved
        if self.record_segments:
            stats.segment_events.append((action, addr, nbytes))

    def _unreserve(self, nbytes: int, action: str, addr: int) -> None:
        self.stats.reserved -= nbytes
        self.stats.num_device_free += 1
        if self.record_segments:
            self.stats.segment_events.append((action, addr, nbytes))

    # -- expandable segments ---------------------------------------------------------------------
    def _expandable_best_fit(self, free: FreeBlocks, index: int) -> int:
        """get_free_block's look-ahead: prefer a larger block that can grow less (ties to the first)."""
        while index + 1 < len(free) and free.at(index).expandable:
            if free.at(index + 1).grown_size() < free.at(index).grown_size():
                index += 1
            else:
                break
        return index

    def _allocate_expandable(self, pool: BlockPool, size: int, stream: int) -> Block | None:
        """try_allocate_expandable_block: a mapped block of at least ``size`` bytes, or None."""
        candidate = self._find_expandable(pool, size, stream)
        if not candidate.mapped and not self._map(pool, candidate, min(candidate.size, size)):
            return None
        while candidate.size < size:
            grow = candidate.next
            assert grow is not None and not grow.mapped
            if not self._map(pool, grow, min(size - candidate.size, grow.size)):
                return None
            candidate = grow  # map_block merged the free candidate into it
        pool.free[stream].remove(candidate)
        return candidate

    def _find_expandable(self, pool: BlockPool, size: int, stream: int) -> Block:
        """find_expandable_block: the lowest address with ``size`` free-or-unmapped bytes, or a new segment."""
        for block in pool.unmapped[stream]:
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
        page = SMALL_BUFFER if pool.small else self.settings.large_segment_size
        total = self.limit.total_bytes
        pages = -(-(total + total // 8) // page)  # address space for 1 1/8 of the card
        segment = AllocatorSegment(self._address(pages * page), pages * page, stream,
                                   small=pool.small, expandable=True, page=page)
        block = Block(segment.addr, segment.size, segment, mapped=False)
        pool.unmapped[stream].add(block)
        return block

    def _map(self, pool: BlockPool, block: Block, size: int) -> bool:
        """map_block: back the first ``size`` bytes of an unmapped block with whole pages."""
        page = block.segment.page
        mapped = min(-(-size // page) * page, block.size)
        if not self._device_has(mapped):
            return False  # cuMemCreate ran out of memory: the pages created so far are released
        pool.unmapped[block.stream].remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.segment, mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, mapped
            pool.unmapped[block.stream].add(rest)
        for other in (block.prev, block.next):
            self._merge(pool, block, other)
        pool.cache(block)
        self._reserve(mapped, "segment_map", block.addr)
        return True

    def _unmap(self, pool: BlockPool, block: Block) -> None:
        """unmap_block (+ release_expandable_segment): give back the whole free pages of a cached block."""
        base, page = block.segment.addr, block.segment.page
        begin = base + -(-(block.addr - base) // page) * page
        end = base + ((block.addr + block.size - base) // page) * page
        if begin >= end:
            return
        pool.free[block.stream].remove(block)
        if begin > block.addr:
            before = Block(block.addr, begin - block.addr, block.segment)
            before.splice(block.prev, block)
            pool.cache(before)
        if block.addr + block.size > end:
            after = Block(end, block.addr + block.size - end, block.segment)
            after.splice(block, block.next)
            pool.cache(after)
        block.addr, block.size, block.mapped = begin, end - begin, False
        for other in (block.prev, block.next):
            self._merge(pool, block, other)
        pool.unmapped[block.stream].add(block)
        self._unreserve(end - begin, "segment_unmap", begin)
        if block.prev is None and block.next is None:
            pool.unmapped[block.stream].remove(block)  # release_expandable_segment

    # -- giving cached memory back ---------------------------------------------------------------
    def _release_block(self, pool: BlockPool, block: Block) -> None:
        """release_block: cudaFree a cached block that is a whole segment."""
        assert not block.is_split() and not block.expandable
        pool.free[block.stream].remove(block)
        self._unreserve(block.size, "segment_free", block.addr)

    def _release_available(self, pool: BlockPool, size: int, stream: int) -> bool:
        """release_available_cached_blocks: free oversize cached segments, just enough for the request."""
        max_split = self.settings.max_split_size
        free = pool.free.get(stream)
        if max_split is None or not free:
            return False
        key = max(size, max_split)
        index = free.lower_bound(key)
        if index < len(free) and not free.at(index).expandable:
            self._release_block(pool, free.at(index))
            return True
        released = 0
        for block in reversed([free.at(i) for i in range(index)]):  # the largest first
            if released >= key or block.size < max_split:
                break
            if not block.expandable:
                released += block.size
                self._release_block(pool, block)
        return released >= key

    def release_cached(self) -> bool:
        """release_cached_blocks (also empty_cache): free every cached block that is a whole segment."""
        for small in (False, True):  # release_blocks(large_blocks), then release_blocks(small_blocks)
            pool = self.pools[small]
            grown = []
            for block in pool.all_free():
                if block.expandable:
                    grown.append(block)
                elif not block.is_split():
                    self._release_block(pool, block)
            for block in grown:
                self._unmap(pool, block)
        return True

    def _garbage_collect(self) -> None:
        """garbage_collect_cached_blocks: free the oldest unsplit cached large segments above the threshold."""
        allowed = self.limit.allowed_bytes or 0
        threshold = int(self.settings.garbage_collection_threshold * allowed)
        if self.stats.reserved <= threshold:
            return
        target, reclaimed = self.stats.reserved - threshold, 0
        pool = self.pools[False]
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
                    self._release_block(pool, block)

    # -- state -----------------------------------------------------------------------------------
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
