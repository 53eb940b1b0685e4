"""Activation offloading: saved-tensor hooks that keep saved activations in host memory and count them."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch


class HostOffload:
    """Pack hooks copy each saved tensor to (pinned) host memory; unpack copies it back.

    Like ``torch.autograd.graph.save_on_cpu``, but it counts the live and peak host bytes it holds,
    so a sweep can report the host memory that offloading costs. ``copy_cpu`` also offloads tensors
    that already live on the CPU: only for emulating offloading in CPU tests, where ``on_alloc`` lets a
    memory tracker treat the copies as host memory.
    """

    def __init__(
        self,
        *,
        pin_memory: bool,
        copy_cpu: bool = False,
        on_alloc: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        self.pin_memory = pin_memory
        self.copy_cpu = copy_cpu
        self.on_alloc = on_alloc
        self.live_bytes = 0
        self.peak_bytes = 0

    def _release(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def pack(self, tensor: torch.Tensor) -> Any:
        if tensor.device.type == "cpu" and not self.copy_cpu:
            return tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=self.pin_memory)
        if self.on_alloc is not None:
            self.on_alloc(host)
        # Non-blocking into pinned memory: the copy is ordered on the current stream before any reuse.
        host.copy_(tensor, non_blocking=self.pin_memory)
        nbytes = host.numel() * host.element_size()
        self.live_bytes += nbytes
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(host, self._release, nbytes)
        return (tensor.device, host)

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        device, host = packed
        return host.to(device, non_blocking=self.pin_memory)

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Offload every tensor autograd saves inside the block."""
        with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
            yield
