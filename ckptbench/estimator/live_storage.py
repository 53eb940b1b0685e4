"""The one live-tensor counter: which tensor storages are alive, and how many bytes they hold.

The CPU probe (``bench.probes.LiveTensorTracker``) and the estimator's tracker
(``estimate.tracker.StepTracker``) both count through ``LiveStorageCounter``, so an estimate
for the CPU counts exactly as the CPU tracker measures.

Two things sharded training (FSDP2) adds, handled here for both:

- a DTensor is a wrapper without storage of its own: its local shard holds the bytes, so wrapper
  subclasses are counted through their inner tensors (``storage_tensors``);
- FSDP2 frees and re-allocates an unsharded parameter by resizing its storage in place
  (``UntypedStorage.resize_``, which no dispatch mode sees): while a counter watches
  (``watching_resizes``), a resize of a counted storage changes its counted bytes.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, Self, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass

Meta = TypeVar("Meta")

# Called with (storage key, bytes, metadata) when a counted storage dies or is forgotten.
ReleaseHook = Callable[[int, int, Meta], None]
# Called with (storage key, change in counted bytes, metadata, the storage's new size in bytes) when a
# counted storage is resized; metadata it returns replaces the storage's.
ResizeHook = Callable[[int, int, Meta, int], "Meta | None"]


def creates_storage(func: Any) -> bool:
    """Whether an op's outputs may hold storage not counted yet: every op but views.

    A view shares its input's storage, counted when that was made. A storage that first shows up
    through a view was made where no dispatch mode sees it: a communication backend's own buffer
    (gloo's reduce-scatter all-reduces a clone of its input and hands out a chunk of it; its worker
    thread frees it at a time no tracker controls). Such buffers are not the training step's
    tensors, and on a GPU NCCL keeps its own outside PyTorch's allocator: neither is counted.
    """
    return not getattr(func, "is_view", False)


def storage_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The tensors that own ``t``'s memory: ``t``, or the inner tensors of a wrapper subclass (a DTensor's
    local shard), recursively."""
    if not is_traceable_wrapper_subclass(t):
        return [t]
    names, _ = t.__tensor_flatten__()
    inner = [getattr(t, name) for name in names]  # a DTensor also names its (tensor-like) device mesh
    return [leaf for x in inner if isinstance(x, torch.Tensor) for leaf in storage_tensors(x)]


def storage_key(t: torch.Tensor) -> int:
    """The key a storage is counted under: views of one storage share it.

    ``id`` of the untyped storage is stable while the storage lives (PyTorch keeps one Python
    object per storage), and is only reused after its weak reference's callback has uncounted it.
    """
    return id(t.untyped_storage())


class _StorageRef(weakref.ref[torch.UntypedStorage]):
    """A weak reference to a counted (or forgotten) storage that carries the storage's key to its callback."""

    __slots__ = ("key",)
    key: int


def _exact(nbytes: int) -> int:
    return nbytes


class LiveStorageCounter(Generic[Meta]):
    """Counts each tensor storage once, until it is freed or forgotten; ``live`` is their bytes.

    - ``add`` counts a tensor's storage (rounded by ``round_bytes``, e.g. to allocator blocks)
      with a piece of metadata; views and repeats of a counted storage are not counted again;
      meta and sparse tensors own no countable storage.
    - A weak reference to the storage, with a callback, uncounts it when the storage is freed (the counter keeps the
      reference until then: a ``weakref.finalize``, Python code per storage, cost 4% of a short model's trace).
    - ``forget`` uncounts a storage that stands for memory elsewhere (an emulated host copy) and
      ignores it until it dies, so in-place ops that return it do not count it again.
    - ``on_release`` hears of every uncounted storage, freed or forgotten, with its bytes and metadata.
    """

    def __init__(
        self,
        *,
        round_bytes: Callable[[int], int] = _exact,
        on_release: ReleaseHook[Meta] | None = None,
        on_resize: ResizeHook[Meta] | None = None,
    ) -> None:
        self.live = 0
        self._round_bytes = round_bytes
        self._on_release = on_release
        self._on_resize = on_resize
        self._entries: dict[int, tuple[int, Meta]] = {}  # storage key -> (counted bytes, metadata)
        self._ignored: set[int] = set()  # forgotten storages that are still alive
        self._refs: dict[int, _StorageRef] = {}  # storage key -> the weak reference that tells of its death

    def add(self, t: torch.Tensor, meta: Meta) -> int:
        """Count ``t``'s storage under ``meta`` unless it is counted or forgotten; the bytes added."""
        if is_traceable_wrapper_subclass(t):
            return sum(self.add(inner, meta) for inner in storage_tensors(t))
        if t.device.type == "meta" or t.is_sparse:
            return 0
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._entries or key in self._ignored:
            return 0
        nbytes = self._round_bytes(storage.nbytes())
        self._entries[key] = (nbytes, meta)
        self.live += nbytes
        self._watch(storage, key)
        return nbytes

    def lookup(self, t: torch.Tensor) -> tuple[int, Meta] | None:
        """The counted bytes and metadata of ``t``'s storage, or None when it is not counted."""
        return self._entries.get(storage_key(t))

    def relabel(self, t: torch.Tensor, meta: Meta) -> None:
        """Replace the metadata of ``t``'s storage, if it is counted."""
        key = storage_key(t)
        if key in self._entries:
            self._entries[key] = (self._entries[key][0], meta)

    def resized(self, storage: torch.UntypedStorage) -> None:
        """A storage changed size in place: count its new size if it is counted."""
        key = id(storage)
        entry = self._entries.get(key)
        if entry is None:
            return
        nbytes, meta = entry
        change = self._round_bytes(storage.nbytes()) - nbytes
        if change:
            self._entries[key] = (nbytes + change, meta)
            self.live += change
            if self._on_resize is not None:
                replaced = self._on_resize(key, change, meta, storage.nbytes())
                if replaced is not None:
                    self._entries[key] = (nbytes + change, replaced)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting ``t``'s storage and ignore it until it dies: it is memory elsewhere."""
        if is_traceable_wrapper_subclass(t):
            for inner in storage_tensors(t):
                self.forget(inner)
            return
        storage = t.untyped_storage()
        key = id(storage)
        if key in self._ignored:
            return
        if key in self._entries:
            self._release(key)  # the reference from ``add`` drops the ignore mark when the storage dies
        else:
            self._watch(storage, key)
        self._ignored.add(key)

    def _watch(self, storage: torch.UntypedStorage, key: int) -> None:
        ref = _StorageRef(storage, self._freed)
        ref.key = key
        self._refs[key] = ref

    def _freed(self, ref: _StorageRef) -> None:
        key = ref.key
        self._refs.pop(key, None)
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


_WATCHERS: list[LiveStorageCounter[Any]] = []
_RESIZE = torch.UntypedStorage.resize_


def _resize_and_tell(storage: torch.UntypedStorage, size: int) -> Any:
    result = _RESIZE(storage, size)
    for counter in tuple(_WATCHERS):
        counter.resized(storage)
    return result


@contextlib.contextmanager
def watching_resizes(counter: LiveStorageCounter[Any]) -> Iterator[None]:
    """Tell ``counter`` of every ``UntypedStorage.resize_`` in the block (the method is patched meanwhile)."""
    if not _WATCHERS:
        torch.UntypedStorage.resize_ = _resize_and_tell  # type: ignore[method-assign,assignment]
    _WATCHERS.append(counter)
    try:
        yield
    finally:
        _WATCHERS.remove(counter)
        if not _WATCHERS:
            torch.UntypedStorage.resize_ = _RESIZE  # type: ignore[method-assign]


class CountingMode(TorchDispatchMode):
    """A dispatch mode that counts with a LiveStorageCounter (``storages``, set by the subclass): while it
    is on, in-place storage resizes (FSDP2 freeing and refilling parameters) are counted too."""

    storages: LiveStorageCounter[Any]

    def __init__(self) -> None:
        super().__init__()
        self._watching: list[contextlib.AbstractContextManager[None]] = []

    def __enter__(self) -> Self:
        watch = watching_resizes(self.storages)
        watch.__enter__()
        self._watching.append(watch)
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._watching.pop().__exit__(None, None, None)
