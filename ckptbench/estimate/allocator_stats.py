"""What the replayed caching allocator may reserve (``DeviceLimit``), its counters (``Stats``) and its OOM. No torch."""

from __future__ import annotations

from dataclasses import dataclass, field


class AllocatorOOM(Exception):
    """The replayed allocator cannot serve a request (torch raises torch.OutOfMemoryError there)."""

    def __init__(self, size: int, *, allocated: int, reserved: int) -> None:
        super().__init__(f"cannot allocate {size} bytes ({allocated} allocated, {reserved} reserved)")
        self.size, self.allocated, self.reserved = size, allocated, reserved


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
