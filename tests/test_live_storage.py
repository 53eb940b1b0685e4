"""The live-tensor counter that the CPU probe and the estimator's tracker share."""

from __future__ import annotations

import gc

import pytest
import torch

from ckptbench.estimator.device_model import CudaKernels
from ckptbench.estimator.live_storage import LiveStorageCounter
from ckptbench.measure.probes import LiveTensorTracker


def _counter() -> tuple[LiveStorageCounter[str], list[tuple[int, str]]]:
    released: list[tuple[int, str]] = []
    counter: LiveStorageCounter[str] = LiveStorageCounter(on_release=lambda _key, n, meta: released.append((n, meta)))
    return counter, released


def test_each_storage_is_counted_once_and_uncounted_when_freed() -> None:
    counter, released = _counter()
    t = torch.empty(256)  # 1 KiB
    assert counter.add(t, "a") == 1024
    assert counter.add(t[10:], "b") == 0 and counter.add(t.view(16, 16), "c") == 0  # views share it
    assert counter.add(torch.empty(8, device="meta"), "meta") == 0  # no memory to count
    assert counter.live == 1024 and counter.lookup(t[3:]) == (1024, "a")
    counter.relabel(t, "z")
    del t
    gc.collect()
    assert counter.live == 0 and released == [(1024, "z")]


def test_bytes_are_rounded_as_the_target_allocator_rounds_them() -> None:
    counter: LiveStorageCounter[None] = LiveStorageCounter(round_bytes=CudaKernels().block_bytes)
    t = torch.empty(3, dtype=torch.uint8)
    assert counter.add(t, None) == 512 and counter.live == 512


def test_forgotten_storages_are_released_once_and_not_counted_again_until_they_die() -> None:
    counter, released = _counter()
    host = torch.empty(256)
    counter.add(host, "host")
    counter.forget(host)
    counter.forget(host)
    assert counter.live == 0 and released == [(1024, "host")]
    assert counter.add(host, "again") == 0  # e.g. the result of ``host.copy_(...)``
    never_counted = torch.empty(64)
    counter.forget(never_counted)
    assert counter.add(never_counted, "late") == 0
    del host, never_counted
    gc.collect()
    assert released == [(1024, "host")]  # dying after being forgotten releases nothing more
    fresh = torch.empty(64)
    assert counter.add(fresh, "fresh") == 256 and counter.live == 256


def test_cpu_tracker_counts_through_the_counter_and_caps_like_a_small_card() -> None:
    tracker = LiveTensorTracker(cap_bytes=4096)
    weights = torch.empty(256)
    tracker.track([weights, weights[1:]])
    assert tracker.live == tracker.peak == 1024
    with tracker:
        a = torch.ones(512)  # 2 KiB more
        del a
        with pytest.raises(torch.OutOfMemoryError, match="CPU tracker: tried to allocate"):
            torch.ones(1024)  # 4 KiB on top of 1 KiB
    gc.collect()
    assert tracker.live == 1024 and tracker.peak == 3072 and tracker.num_ooms == 1


def test_resized_storages_are_recounted_while_a_tracker_watches() -> None:
    """FSDP2 frees and refills an unsharded parameter by resizing its storage in place (no op that a
    dispatch mode sees): a tracker follows the resize; outside a tracker nothing is patched."""
    tracker = LiveTensorTracker()
    with tracker:
        gathered = torch.empty(256)  # 1 KiB, counted when made
        gathered.untyped_storage().resize_(0)  # FSDP2's free_storage
        assert tracker.live == 0
        gathered.untyped_storage().resize_(2048)  # alloc_storage, to a larger size here
        assert tracker.live == 2048 and tracker.peak == 2048
    gathered.untyped_storage().resize_(0)  # not watched any more: the count stays
    assert tracker.live == 2048
    assert torch.UntypedStorage.resize_ is not None and "tell" not in torch.UntypedStorage.resize_.__name__


def test_a_dtensor_is_counted_through_its_local_shard() -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        counter, _ = _counter()
        local = torch.empty(64)
        shard = DTensor.from_local(local, init_device_mesh("cpu", (1,)), run_check=False)
        assert counter.add(shard, "param") == 256 and counter.lookup(local) == (256, "param")
    finally:
        dist.destroy_process_group()


def test_views_never_start_counting_a_storage() -> None:
    """A storage first seen through a view was made where no mode sees it (a communication backend's
    buffer, e.g. gloo's reduce-scatter clone): the tracker leaves it out, as the estimator does."""
    hidden = torch.empty(256)  # made before the tracker: like a buffer a backend makes off the main thread
    tracker = LiveTensorTracker()
    with tracker:
        chunks = hidden.chunk(2)  # a view op
        fresh = chunks[0] + 1  # a new storage
    assert tracker.live == fresh.untyped_storage().nbytes() == 512

