"""The one live-tensor counter: which tensor storages are alive, and how many bytes they hold.

The CPU probe (``bench.probes.LiveTensorTracker``) and the estimator's tracker
(``estimate.tracker.StepTracker``) both count through ``LiveStorageCounter``, so an estimate
for the CPU counts exactly as the CPU tracker measures.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Generic, TypeVar

import torch

Meta = TypeVar("Meta")

# Called with (storage key, bytes, metadata) when a counted storage dies or is forgotten.
ReleaseHook = Callable[[int, int, Meta], None]


def storage_key(t: torch.Tensor) -> int:
    """The key a storage is counted under: views of one storage share it.

    ``id`` of the untyped storage is stable while the storage lives (PyTorch keeps one Python
    object per storage), and is only reused after its finalizer has uncounted it.
    """
    return id(t.untyped_storage())


def _exact(nbytes: int) -> int:
    return nbytes


class LiveStorageCounter(Generic[Meta]):
    """Counts each tensor storage once, until it is freed or forgotten; ``live`` is their bytes.

    - ``add`` counts a tensor's storage (rounded by ``round_bytes``, e.g. to allocator blocks)
      with a piece of metadata; views and repeats of a counted storage are not counted again;
      meta and sparse tensors own no countable storage.
    - A ``weakref.finalize`` on the storage uncounts it when the storage is freed.
    - ``forget`` uncounts a storage that stands for memory elsewhere (an emulated host copy) and
      ignores it until it dies, so in-place ops that return it do not count it again.
    - ``on_release`` hears of every uncounted storage, freed or forgotten, with its bytes and metadata.
    """

    def __init__(
        self,
        *,
        round_bytes: Callable[[int], int] = _exact,
        on_release: ReleaseHook[Meta] | None = None,
    ) -> None:
        self.live = 0
        self._round_bytes = round_bytes
        self._on_release = on_release
        self._entries: dict[int, tuple[int, Meta]] = {}  # storage key -> (counted bytes, metadata)
        self._ignored: set[int] = set()  # forgotten storages that are still alive

    def add(self, t: torch.Tensor, meta: Meta) -> int:
        """Count ``t``'s storage under ``meta`` unless it is counted or forgotten; the bytes added."""
        if t.device.type == "meta" or t.is_sparse:
            return 0
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._entries or key in self._ignored:
            return 0
        nbytes = self._round_bytes(storage.nbytes())
        self._entries[key] = (nbytes, meta)
        self.live += nbytes
        weakref.finalize(storage, self._freed, key)
        return nbytes

    def lookup(self, t: torch.Tensor) -> tuple[int, Meta] | None:
        """The counted bytes and metadata of ``t``'s storage, or None when it is not counted."""
        return self._entries.get(storage_key(t))

    def relabel(self, t: torch.Tensor, meta: Meta) -> None:
        """Replace the metadata of ``t``'s storage, if it is counted."""
        key = storage_key(t)
        if key in self._entries:
            self._entries[key] = (self._entries[key][0], meta)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting ``t``'s storage and ignore it until it dies: it is memory elsewhere."""
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._ignored:
            return
        if key in self._entries:
            self._release(key)  # the finalizer from ``add`` drops the ignore mark when the storage dies
        else:
            weakref.finalize(storage, self._ignored.discard, key)
        self._ignored.add(key)

    def _freed(self, key: int) -> None:
        self._ignored.discard(key)
        self._release(key)

    def _release(self, key: int) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        nbytes, meta = entry
        self.live -= nbytes
        if self._on_release is not None:
            self._on_release(key, nbytes, meta)
