"""The caching-allocator replay against hand-worked scenarios, one per rule of CUDACachingAllocator.cpp.

Every expected number is worked out in the comment next to it from the rule being tested (MiB = 2**20).
"""

from __future__ import annotations

import pytest

from ckptbench.config.alloc_conf import AllocatorSettings, parse_alloc_conf
from ckptbench.estimator.allocator import AllocatorOOM, CachingAllocator, DeviceLimit, round_power2_division

KIB, MIB, GIB = 2**10, 2**20, 2**30


def make(conf: str = "", *, total: int = 80 * GIB, fraction: float | None = None, outside: int = 0) -> CachingAllocator:
    return CachingAllocator(parse_alloc_conf(conf), DeviceLimit(total, fraction, outside), record_segments=True)


def segments(a: CachingAllocator) -> list[tuple[str, int]]:
    return [(action, size) for action, _, size in a.stats.segment_events]


# -- sizes --------------------------------------------------------------------------------------------


def test_requests_round_up_to_512_bytes() -> None:
    a = make()
    assert [a.round_size(n) for n in (1, 511, 512, 513, 1536, 10 * MIB + 1)] == [
        512, 512, 512, 1024, 1536, 10 * MIB + 512,
    ]


def test_power2_divisions_follow_torchs_worked_example() -> None:
    # roundup_power2_next_division's comment: 1200 lies between 1024 and 2048; 4 divisions are
    # 1024, 1280, 1536, 1792, so 1200 rounds to 1280. Powers of two stay; one division is the next power.
    assert round_power2_division(1200, 4) == 1280
    assert round_power2_division(1024, 4) == 1024
    assert round_power2_division(1300, 4) == 1536
    assert round_power2_division(1025, 1) == 2048


def test_roundup_power2_divisions_apply_per_size_interval() -> None:
    a = make("roundup_power2_divisions:[2:4,>:8]")
    # Below 1 MiB the first interval (index 0) applies; '2' is index 1 and '[2:4' also fills index 0.
    # 600 KiB > 512 x 4: floor 512 KiB, 4 steps of 128 KiB -> 640 KiB.
    assert a.round_size(600 * KIB) == 640 * KIB
    # 3 MiB + 1: interval index 1 (2-4 MiB) -> 4 divisions of 512 KiB -> 3.5 MiB.
    assert a.round_size(3 * MIB + 1) == 3 * MIB + 512 * KIB
    # 5 MiB: index 2 is '>' -> 8 divisions of 512 KiB between 4 and 8 MiB -> 5 MiB exactly.
    assert a.round_size(5 * MIB) == 5 * MIB
    # Not above 512 x divisions: plain 512-byte rounding (1000 bytes with 4 divisions -> 1024).
    assert a.round_size(1000) == 1024


# -- pools and segments ------------------------------------------------------------------------------


def test_small_pool_packs_requests_into_2mib_segments() -> None:
    a = make()
    first = a.malloc(MIB)  # <= 1 MiB: small pool, a 2 MiB segment, split (1 MiB >= 512 B remains)
    second = a.malloc(MIB)  # takes the cached remainder
    assert (first.size, second.size, a.stats.reserved) == (MIB, MIB, 2 * MIB)
    assert second.addr == first.addr + MIB
    third = a.malloc(MIB + 1)  # 1 MiB + 512 is large: a 20 MiB segment, 19 MiB - 512 cached
    assert (third.size, a.stats.reserved) == (MIB + 512, 22 * MIB)
    assert segments(a) == [("segment_alloc", 2 * MIB), ("segment_alloc", 20 * MIB)]


def test_small_blocks_split_when_512_bytes_remain() -> None:
    a = make()
    a.malloc(MIB)  # a 2 MiB small segment: 1 MiB cached
    a.malloc(MIB - 1024)  # 1024 bytes remain (>= 512): split off and cached
    c = a.malloc(512)  # from the 1024-byte block: 512 remain, still enough to split
    d = a.malloc(512)  # ... so the last 512 bytes serve this one
    assert (c.size, d.size, d.addr - c.addr, a.stats.reserved) == (512, 512, 512, 2 * MIB)


def test_large_requests_under_10mib_share_a_20mib_segment() -> None:
    a = make()
    blocks = [a.malloc(6 * MIB) for _ in range(3)]  # 6 + 6 in one 20 MiB segment (8 MiB left, split),
    # then 6 of the remaining 8 (2 MiB left: > 1 MiB, split); the segment is shared by all three
    assert a.stats.reserved == 20 * MIB and {b.segment for b in blocks} == {blocks[0].segment}
    a.malloc(3 * MIB)  # 2 MiB cached remainder is too small: a second 20 MiB segment
    assert a.stats.reserved == 40 * MIB


@pytest.mark.parametrize(
    ("request_bytes", "block", "reserved"),
    [
        (43 * MIB, 44 * MIB, 44 * MIB),  # rounded to 2 MiB; 1 MiB would remain: not > 1 MiB, not split
        (43 * MIB + 4 * KIB, 44 * MIB, 44 * MIB),  # 1 MiB - 4 KiB remains: not split either
        (41 * MIB - 4 * KIB, 41 * MIB - 4 * KIB, 42 * MIB),  # 1 MiB + 4 KiB remains: split off
        (10 * MIB, 10 * MIB, 10 * MIB),  # 10 MiB exactly is rounded to 2 MiB, not given 20 MiB
    ],
)
def test_large_requests_round_to_2mib_and_split_only_above_1mib(request_bytes: int, block: int, reserved: int) -> None:
    a = make()
    assert a.malloc(request_bytes).size == block
    assert a.stats.reserved == reserved


def test_best_fit_takes_the_smallest_cached_block_that_fits() -> None:
    a = make()
    held = [a.malloc(n * MIB) for n in (30, 40, 50)]
    for b in held:
        a.free(b)
    chosen = a.malloc(35 * MIB)  # 40 MiB is the smallest >= 35; 5 MiB remain (> 1 MiB): split
    assert chosen.addr == held[1].addr and chosen.size == 35 * MIB
    assert a.stats.reserved == 120 * MIB  # nothing new was reserved


def test_streams_do_not_share_cached_blocks() -> None:
    a = make()
    a.free(a.malloc(40 * MIB, stream=1))
    a.malloc(40 * MIB, stream=0)  # the cached 40 MiB block belongs to stream 1
    assert a.stats.reserved == 80 * MIB


def test_freed_neighbours_merge_and_only_whole_segments_are_released() -> None:
    a = make()
    seg = a.malloc(60 * MIB)
    a.free(seg)  # one 60 MiB cached segment
    p, q, r = a.malloc(20 * MIB), a.malloc(20 * MIB), a.malloc(20 * MIB)  # split 20 | 40, then 20 | 20
    assert {p.segment, q.segment, r.segment} == {seg.segment} and a.stats.reserved == 60 * MIB
    a.free(q)
    a.release_cached()  # the segment still holds p and r: nothing can be given back
    assert a.stats.reserved == 60 * MIB
    a.free(p)
    a.free(r)  # p merged with q; r merges with both: one free 60 MiB block
    a.release_cached()
    assert a.stats.reserved == 0
    assert segments(a) == [("segment_alloc", 60 * MIB), ("segment_free", 60 * MIB)]


# -- oversize blocks ---------------------------------------------------------------------------------


def test_max_split_size_keeps_oversize_blocks_whole() -> None:
    a = make("max_split_size_mb:100")
    big = a.malloc(200 * MIB)
    a.free(big)
    small = a.malloc(50 * MIB)  # below max_split_size: may not take the 200 MiB oversize block
    assert small.segment is not big.segment and a.stats.reserved == 250 * MIB
    a.free(small)
    near = a.malloc(190 * MIB)  # oversize request, within 20 MiB (max_non_split_rounding) of 200 MiB
    assert near.segment is big.segment and near.size == 200 * MIB  # served whole, never split
    a.free(near)
    far = a.malloc(150 * MIB)  # 200 >= 150 + 20: too wasteful, a new segment
    assert far.segment is not big.segment


def test_max_non_split_rounding_widens_what_an_oversize_block_serves() -> None:
    a = make("max_split_size_mb:100,max_non_split_rounding_mb:60")
    a.free(a.malloc(200 * MIB))
    assert a.malloc(150 * MIB).size == 200 * MIB  # 200 < 150 + 60: the cached block serves it
    assert a.stats.reserved == 200 * MIB


def test_release_available_frees_oversize_segments_before_flushing_everything() -> None:
    # fraction 0.5 of 1 GiB: 512 MiB allowed. 300 MiB oversize cached + a 100 MiB block in use.
    a = make("max_split_size_mb:200", total=GIB, fraction=0.5)
    a.free(a.malloc(300 * MIB))
    keep = a.malloc(100 * MIB)  # below max_split: cannot use the 300 MiB block; 400 MiB reserved
    assert a.stats.reserved == 400 * MIB
    a.malloc(250 * MIB)  # 400 + 250 > 512; the 300 MiB oversize segment is released, then it fits
    assert a.stats.num_alloc_retries == 0  # release_available_cached_blocks is not a counted retry
    assert a.stats.reserved == 350 * MIB and keep.allocated


# -- garbage collection and the memory fraction ------------------------------------------------------


def _gc_scenario(a: CachingAllocator) -> None:
    """Cache 100, 150 and 200 MiB segments (in that order), hold 300 MiB, then ask for 250 MiB."""
    for size in (100, 150, 200):
        a.free(a.malloc(size * MIB))  # none fits the next, larger request: each is a new segment
    a.malloc(300 * MIB)
    a.malloc(250 * MIB)


def test_garbage_collection_frees_the_oldest_cached_segments_above_the_threshold() -> None:
    # 1 GiB card, fraction 1.0, threshold 0.5: collect when a new segment is needed past 512 MiB.
    a = make("garbage_collection_threshold:0.5", total=GIB, fraction=1.0)
    _gc_scenario(a)
    # The 250 MiB request is the 5th search; 750 MiB reserved > 512: reclaim at least 238 MiB.
    # Ages (searches since cached): 100 MiB: 5 - 1 = 4, 150 MiB: 3, 200 MiB: 2; mean 3. One pass in
    # size order frees those aged >= 3 (100 and 150 MiB: 250 MiB reclaimed, enough), keeps 200 MiB.
    assert segments(a)[-3:] == [("segment_free", 100 * MIB), ("segment_free", 150 * MIB), ("segment_alloc", 250 * MIB)]
    assert a.stats.reserved == (750 - 250 + 250) * MIB


def test_garbage_collection_frees_blocks_exactly_as_old_as_the_average() -> None:
    a = make("garbage_collection_threshold:0.5", total=GIB, fraction=1.0)
    first, second = a.malloc(100 * MIB), a.malloc(150 * MIB)  # searches 1 and 2
    a.free(first)
    a.free(second)  # both cached at search count 2: the same age from now on
    a.malloc(300 * MIB)  # search 3: 550 MiB reserved > 512
    a.malloc(250 * MIB)  # search 4: both aged 2, the mean age 2: both are freed (age >= mean)
    assert segments(a)[-3:] == [("segment_free", 100 * MIB), ("segment_free", 150 * MIB), ("segment_alloc", 250 * MIB)]
    assert a.stats.reserved == 550 * MIB


def test_garbage_collection_needs_a_memory_fraction() -> None:
    a = make("garbage_collection_threshold:0.5", total=GIB)  # no fraction set: never collects
    _gc_scenario(a)
    assert a.stats.reserved == (100 + 150 + 200 + 300 + 250) * MIB


def test_fraction_cap_retries_after_freeing_the_cache_then_runs_out() -> None:
    a = make(total=GIB, fraction=0.5)  # 512 MiB allowed
    a.free(a.malloc(300 * MIB))
    kept = a.malloc(100 * MIB)  # from the cached 300 MiB segment (split, 200 MiB left): nothing new
    a.free(a.malloc(150 * MIB))  # from the 200 MiB remainder; freed, it merges back
    assert a.stats.reserved == 300 * MIB and kept.allocated
    with pytest.raises(AllocatorOOM) as oom:
        a.malloc(400 * MIB)  # 300 + 400 > 512: flush the cache, but the segment holds 'kept': retry fails
    assert oom.value.size == 400 * MIB and oom.value.reserved == 300 * MIB
    assert (a.stats.num_alloc_retries, a.stats.num_ooms) == (1, 1)


def test_fraction_cap_retry_succeeds_when_the_cache_can_be_freed() -> None:
    a = make(total=GIB, fraction=0.5)
    a.free(a.malloc(300 * MIB))  # 300 MiB cached, unsplit
    block = a.malloc(400 * MIB)  # 300 + 400 > 512: flush the cache (retry), then 400 fits
    assert (block.size, a.stats.reserved, a.stats.num_alloc_retries, a.stats.num_ooms) == (400 * MIB, 400 * MIB, 1, 0)
    assert segments(a) == [("segment_alloc", 300 * MIB), ("segment_free", 300 * MIB), ("segment_alloc", 400 * MIB)]


def test_the_device_runs_out_before_the_fraction_when_the_context_takes_memory() -> None:
    a = make(total=GIB, fraction=1.0, outside=500 * MIB)  # the CUDA context: 524 MiB left for segments
    a.malloc(500 * MIB)
    with pytest.raises(AllocatorOOM) as oom:
        a.malloc(30 * MIB)  # 500 + 30 > 524: cudaMalloc fails, nothing cached to free, retry fails
    assert oom.value.size == 30 * MIB and (a.stats.num_alloc_retries, a.stats.num_ooms) == (1, 1)


# -- expandable segments -----------------------------------------------------------------------------


def test_expandable_segments_map_20mib_pages_and_grow_in_place() -> None:
    a = make("expandable_segments:True")
    x = a.malloc(43 * MIB)  # 3 pages of 20 MiB mapped; the block is not rounded to 2 MiB: 17 MiB stay free
    assert (x.size, a.stats.reserved) == (43 * MIB, 60 * MIB)
    y = a.malloc(5 * MIB)  # from the free 17 MiB
    assert a.stats.reserved == 60 * MIB and y.addr == x.addr + 43 * MIB
    a.free(x)
    z = a.malloc(50 * MIB)  # no free block of 50 MiB; the 12 MiB free tail grows: 2 more pages mapped
    assert z.addr == y.addr + 5 * MIB and a.stats.reserved == 100 * MIB
    a.free(y)
    a.free(z)
    a.release_cached()  # every page is free again: unmapped, the segment released
    assert a.stats.reserved == 0
    assert segments(a) == [("segment_map", 60 * MIB), ("segment_map", 40 * MIB), ("segment_unmap", 100 * MIB)]


def test_expandable_small_pool_uses_2mib_pages() -> None:
    a = make("expandable_segments:True")
    a.malloc(700 * KIB)  # one 2 MiB page; 1348 KiB free
    a.malloc(700 * KIB)  # 648 KiB free
    a.malloc(700 * KIB)  # the 648 KiB tail grows by one more 2 MiB page
    assert a.stats.reserved == 4 * MIB


def test_settings_defaults_match_torch() -> None:
    s = AllocatorSettings()
    assert (s.max_split_size, s.max_non_split_rounding, s.large_segment_size) == (None, 20 * MIB, 20 * MIB)
    assert s.divisions(64 * MIB) == 0 and not s.expandable_segments
