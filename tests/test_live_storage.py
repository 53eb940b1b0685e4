"""The live-tensor counter that the CPU probe and the estimator's tracker share."""

from __future__ import annotations

import gc

import pytest
import torch

from ckptbench.bench.probes import LiveTensorTracker
from ckptbench.estimate.device_model import CudaKernels
from ckptbench.estimate.live_storage import LiveStorageCounter


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
