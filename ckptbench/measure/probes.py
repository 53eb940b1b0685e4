"""Memory and time measurement behind one interface: CUDA allocator stats, or a CPU live-tensor tracker."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

from ckptbench.estimator.live_storage import (
    CountingMode,
    LiveStorageCounter,
    creates_storage,
    storage_tensors,
)
from ckptbench.results.record import PointMemory


class Probe(Protocol):
    """What the runner needs to measure a point, whatever the device."""

    kind: str

    def sync(self) -> None: ...
    def now(self) -> float: ...
    def allocated(self) -> int: ...
    def reset_peak(self) -> None: ...
    def peak_allocated(self) -> int: ...
    def peak_reserved(self) -> int: ...
    def counters(self) -> dict[str, int]: ...
    def release(self) -> None: ...
    def adopt(self, tensors: Iterable[Any]) -> None: ...
    def outside_allocator(self) -> int | None: ...


class CudaProbe:
    """torch.cuda memory statistics and synchronized wall-clock time."""

    kind = "cuda"

    def __init__(self, device: torch.device, *, cap_bytes: int | None = None) -> None:
        self.device = device
        total = torch.cuda.get_device_properties(device).total_memory
        # The caching allocator refuses to reserve more than this fraction: a smaller card. Set it
        # (or lift it) every time: the fraction is per process and outlives an earlier probe.
        fraction = 1.0 if cap_bytes is None else min(1.0, cap_bytes / total)
        torch.cuda.set_per_process_memory_fraction(fraction, device)
        self.fraction = fraction

    def sync(self) -> None:
        torch.cuda.synchronize(self.device)

    def now(self) -> float:
        return time.perf_counter()

    def allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak_allocated(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def peak_reserved(self) -> int:
        return torch.cuda.max_memory_reserved(self.device)

    def counters(self) -> dict[str, int]:
        stats = torch.cuda.memory_stats(self.device)
        return {"num_alloc_retries": int(stats.get("num_alloc_retries", 0)), "num_ooms": int(stats.get("num_ooms", 0))}

    def release(self) -> None:
        torch.cuda.empty_cache()

    def adopt(self, tensors: Iterable[Any]) -> None:
        """Nothing to do: the CUDA allocator already counts every tensor."""

    def outside_allocator(self) -> int | None:
        """Device memory in use but not reserved by this process's caching allocator: its CUDA context and
        library kernels (and any other process on the card)."""
        free, total = torch.cuda.mem_get_info(self.device)
        return max(0, total - free - torch.cuda.memory_reserved(self.device))


class LiveTensorTracker(CountingMode):
    """Counts the bytes of live tensor storages created by every dispatched op (and registered ones).

    The counting is ``LiveStorageCounter``'s (each storage once, views share it, uncounted when
    freed), the one the estimator counts with, so the running total is the memory a caching-free
    allocator would hold. An optional cap makes an allocation past it raise
    ``torch.OutOfMemoryError``, like a small card would.
    """

    def __init__(self, *, cap_bytes: int | None = None) -> None:
        super().__init__()
        self.cap_bytes = cap_bytes
        self.peak = 0
        self.num_ooms = 0
        self.storages: LiveStorageCounter[None] = LiveStorageCounter(on_resize=self._resized)

    def _resized(self, _key: int, change: int, _meta: None, _nbytes: int) -> None:
        if change > 0 and self.cap_bytes is not None and self.live > self.cap_bytes:
            self.num_ooms += 1
            raise torch.OutOfMemoryError(
                f"CPU tracker: a storage grew by {change / 2**20:.2f} MiB to {self.live / 2**20:.2f} MiB live; "
                f"the cap is {self.cap_bytes / 2**20:.2f} MiB"
            )
        self.peak = max(self.peak, self.live)

    @property
    def live(self) -> int:
        """Bytes of the storages counted now."""
        return self.storages.live

    def track(self, tensors: Iterable[Any]) -> None:
        """Count tensors created before tracking began (parameters, optimizer state)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.storages.add(t, None)
        self.peak = max(self.peak, self.live)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting ``t``'s storage: it stands for memory elsewhere (emulated host offload)."""
        self.storages.forget(t)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        before = self.live
        for t in tree_leaves(out) if creates_storage(func) else ():
            if isinstance(t, torch.Tensor):
                self.storages.add(t, None)
        if self.cap_bytes is not None and self.live > self.cap_bytes:
            self.num_ooms += 1
            grew = self.live - before
            del out
            raise torch.OutOfMemoryError(
                f"CPU tracker: tried to allocate {grew / 2**20:.2f} MiB in {func} "
                f"with {before / 2**20:.2f} MiB live; the cap is {self.cap_bytes / 2**20:.2f} MiB"
            )
        self.peak = max(self.peak, self.live)
        return out


class TrackerProbe:
    """CPU probe: a live-tensor tracker stands in for the CUDA allocator (reserved equals allocated)."""

    kind = "cpu-tracker"

    def __init__(self, *, cap_bytes: int | None = None) -> None:
        self.tracker = LiveTensorTracker(cap_bytes=cap_bytes)

    def sync(self) -> None:
        pass

    def now(self) -> float:
        return time.perf_counter()

    def allocated(self) -> int:
        return self.tracker.live

    def reset_peak(self) -> None:
        self.tracker.peak = self.tracker.live

    def peak_allocated(self) -> int:
        return self.tracker.peak

    def peak_reserved(self) -> int:
        return self.tracker.peak

    def counters(self) -> dict[str, int]:
        return {"num_alloc_retries": 0, "num_ooms": self.tracker.num_ooms}

    def release(self) -> None:
        pass

    def adopt(self, tensors: Iterable[Any]) -> None:
        """Count tensors created outside the tracker (the model's parameters and buffers, the batch)."""
        self.tracker.track(tensors)

    def outside_allocator(self) -> int | None:
        return None


class ElsewhereProbe:
    """The probe of a sweep whose points all run in other processes (fanned out as jobs): it names the
    probe those processes measure with, and measures nothing here (no CUDA context in this process)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind

    def sync(self) -> None:
        pass

    def now(self) -> float:
        return time.perf_counter()

    def allocated(self) -> int:
        return 0

    def reset_peak(self) -> None:
        pass

    def peak_allocated(self) -> int:
        return 0

    def peak_reserved(self) -> int:
        return 0

    def outside_allocator(self) -> int | None:
        return None

    def counters(self) -> dict[str, int]:
        return {"num_alloc_retries": 0, "num_ooms": 0}

    def release(self) -> None:
        pass

    def adopt(self, tensors: Iterable[Any]) -> None:
        pass


LEAK_TOLERANCE_BYTES = 1 << 20  # 1 MiB: allocator bookkeeping and tiny caches stay below it


def leak_check(probe: Probe, baseline: int | None, memory: PointMemory) -> PointMemory:
    """``memory`` with whether the point left memory allocated: the allocated bytes after it against its
    baseline (unchanged without a baseline: the point failed before it had one)."""
    if baseline is None:
        return memory
    after = probe.allocated()
    leak = after - baseline
    return memory.updated(
        baseline_allocated_bytes=baseline, after_point_allocated_bytes=after, leaked_bytes=leak,
        leaked=leak > LEAK_TOLERANCE_BYTES,
    )


def tensor_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages among ``tensors`` (views and repeats counted once)."""
    seen: set[int] = set()
    total = 0
    for t in (inner for x in tensors if isinstance(x, torch.Tensor) for inner in storage_tensors(x)):
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            key = storage.data_ptr() if storage.data_ptr() else id(storage)
            if key not in seen:
                seen.add(key)
                total += storage.nbytes()
    return total
