"""Live bytes of a step run under fake tensors, split by category and by segment of the step (the byte
categories, their vectors and the ``StepSegment`` they describe are in estimator/step_trace.py: no torch in those).

``StepTracker`` is a ``TorchDispatchMode`` stacked on top of ``FakeTensorMode``. It counts
every storage once when an op creates it and uncounts it when the storage dies, through the
same ``LiveStorageCounter`` (estimator/live_storage.py) as the CPU ``LiveTensorTracker``
(measure/probes.py), so the running total is the memory a caching-free allocator would hold and
a CPU-target estimate counts as the CPU tracker measures. On top of that it

- tags each storage with a category (parameters, gradients, optimizer state, activations,
  logits and loss, transient buffers, other), so the bytes at the peak can be explained;
- cuts the step into segments (``mark``): one per decoder-layer forward and backward, plus the
  parts before and after the layers, each with its start, peak and end byte vectors, so that
  ckptbench.estimator.estimator can re-assemble the step of a model with more layers;
- asks a kernel model (estimator/device_model.py) how the target device's allocator rounds each
  storage and which scratch buffers a kernel holds while it runs (these never surface as
  tensors, so they are added to the peak of the op that uses them);
- logs every allocation and free in execution order (``events``, estimator/events.py), with the
  segment it happened in, for the caching-allocator replay;
- counts every op's class, FLOPs and bytes in the open segment (``ops``, estimator/op_costs.py), for the
  step-time model; it counts no memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._pytree import tree_leaves

from ckptbench.estimator.device_model import KernelModel
from ckptbench.estimator.events import EventLog
from ckptbench.estimator.live_storage import (
    CountingMode,
    LiveStorageCounter,
    creates_storage,
    storage_key,
    storage_tensors,
)
from ckptbench.estimator.op_costs import OpCounter
from ckptbench.estimator.record import CATEGORIES
from ckptbench.estimator.step_trace import ACTIVATIONS, OTHER, TRANSIENT, StepSegment, Vector, add, is_layer, only

_LOCAL_SCALAR = torch.ops.aten._local_scalar_dense.default
_UNSCALE = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
_DEVICE = torch.ops.prim.device.default
_META = torch.device("meta")


class StepTracker(CountingMode):
    """Counts live storage bytes per category and records per-segment start/peak/end vectors.

    Which storages are live, and their bytes as the target allocator rounds them, is the
    ``LiveStorageCounter``'s (the CPU probe counts with the same one); each counted storage
    carries its category and the number of the segment that allocated it.
    """

    def __init__(self, kernels: KernelModel, *, defer_shared: bool = False) -> None:
        super().__init__()
        self.kernels = kernels
        self.tag = OTHER
        self.by_cat = [0] * len(CATEGORIES)
        self.segments: list[StepSegment] = []
        # Frees moved out of segments: (segment they happened in, bytes, kind); see ``share``.
        self.releases: list[tuple[str, Vector, str]] = []
        self.release_events: list[tuple[str, str, int]] = []  # the same frees: (segment, kind, event id)
        # Allocations that carry a layer's output up, or a gradient down: {event id: producing segment}.
        self.roles: dict[int, str] = {}
        # Where each decoder layer's input was freed: {layer: (segment, bytes)}; see ``note_input``.
        self.input_frees: dict[int, tuple[str, Vector]] = {}
        # Bytes a layer segment allocated and a non-layer segment freed: {(freeing, allocating): bytes}.
        self.crossings: dict[tuple[str, str], Vector] = {}
        self.pending_label: str | None = None  # a segment to open right before the next op
        self.defer_shared = defer_shared
        self.events = EventLog()
        self.ops = OpCounter()  # each op's FLOPs and bytes per segment (no memory counted there)
        # The fake mode's key of the op just dispatched, where it has one (FastKeyFakeTensorMode.op_key): what the op
        # counter keeps an op's cost by. Set by the trace once the mode is made.
        self.op_key: Callable[[Any], Any] | None = None
        # Storage metadata: (category, number of the segment that allocated it, allocation event id).
        self.storages: LiveStorageCounter[tuple[int, int, int]] = LiveStorageCounter(
            round_bytes=kernels.block_bytes, on_release=self._released, on_resize=self._resized
        )
        self._shared: dict[int, str] = {}
        self._inputs: dict[int, int] = {}
        self._deferred: list[tuple[int, int, str, int]] = []  # (bytes, category, kind, event id)
        self._forgetting = False
        self._labels: list[str] = []
        self._zero_flags: set[int] = set()
        self._label: str | None = None
        self._start: Vector = tuple(self.by_cat)
        self._peak_live = 0
        self._peak_vec: Vector = self._start

    @property
    def live(self) -> int:
        """Bytes live now: counted storages, reserved workspaces, and frees deferred to the segment's end."""
        return sum(self.by_cat)

    # -- counting -------------------------------------------------------------------------
    def adopt(self, tensors: Iterable[Any], category: int) -> None:
        """Count tensors created outside the mode (or move counted ones) under ``category``."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._add(t, category)
                self.reclassify(t, category)
        self._touch()

    def reclassify(self, t: torch.Tensor, category: int) -> None:
        """Move a counted storage to another category (a gradient once it lands in ``.grad``)."""
        for inner in storage_tensors(t):
            entry = self.storages.lookup(inner)
            if entry is not None:
                nbytes, (old, seg, eid) = entry
                self.by_cat[old] -= nbytes
                self.by_cat[category] += nbytes
                self.storages.relabel(inner, (category, seg, eid))

    def share(self, tensors: Iterable[Any], kind: str = "shared") -> None:
        """Mark storages whose free depends on the layout, not on one layer.

        ``shared``: what every decoder layer receives (position ids, rotary tables), freed by the
        lowest layer holding it; ``input0``: layer 0's input, which transformers also holds until
        the model's forward returns. With ``defer_shared`` such a free is moved to the end of its
        segment and recorded in ``releases``, so that segment costs do not include it.
        """
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._shared[storage_key(t)] = kind

    def note_input(self, layer: int, t: torch.Tensor) -> None:
        """Record where a decoder layer's input gets freed (``input_frees``)."""
        self._inputs[storage_key(t)] = layer

    def note_output(self, t: torch.Tensor, producer: str | None = None) -> None:
        """Record that ``t`` is what segment ``producer`` (default: the open one) hands to the next."""
        entry = self.storages.lookup(t)
        label = producer or self._label
        if entry is not None and entry[0] and label is not None:
            self.roles.setdefault(entry[1][2], label)

    def forget(self, t: torch.Tensor) -> None:
        """Stop counting a storage that lives in host memory on the target (not on the GPU)."""
        self._forgetting = True
        try:
            self.storages.forget(t)
        finally:
            self._forgetting = False

    @property
    def labels(self) -> tuple[str, ...]:
        """Every segment label so far, in order (an event's segment number indexes it)."""
        return tuple(self._labels)

    @property
    def segment_number(self) -> int:
        """The number of the open segment (-1 before the first mark)."""
        return len(self._labels) - 1

    def _add(self, t: torch.Tensor, category: int) -> None:
        seg, eid = self.segment_number, self.events.reserve_id()
        added = self.storages.add(t, (category, seg, eid))
        if added:
            self.events.alloc(t.untyped_storage().nbytes(), seg)
        self.by_cat[category] += added

    def _released(self, key: int, nbytes: int, meta: tuple[int, int, int]) -> None:
        """A counted storage was freed (or forgotten): take its bytes off, now or at the segment's end."""
        category, seg, eid = meta
        if nbytes and self._forgetting:
            self.events.drop(eid, self.segment_number)
        if key in self._inputs and self._label is not None:
            self.input_frees[self._inputs.pop(key)] = (self._label, only(category, nbytes))
        kind = self._shared.pop(key, None)  # the key may be reused by a new storage: keep only the bytes
        if self.defer_shared and kind is not None:
            self._deferred.append((nbytes, category, kind, eid if nbytes else -1))
            return
        if nbytes and not self._forgetting:
            self.events.free(eid, self.segment_number)
        self.by_cat[category] -= nbytes
        if seg >= 0 and self._label is not None and is_layer(self._labels[seg]) and not is_layer(self._label):
            pair = (self._label, self._labels[seg])
            self.crossings[pair] = add(self.crossings.get(pair, (0,) * len(CATEGORIES)), only(category, nbytes))

    def _resized(self, _key: int, change: int, meta: tuple[int, int, int], nbytes: int) -> tuple[int, int, int]:
        """A counted storage was resized in place (FSDP2 freeing or refilling an unsharded parameter): for the
        allocator replay, its old block is freed and a block of the new size allocated."""
        category, seg, eid = meta
        self.by_cat[category] += change
        if eid >= 0:
            self.events.free(eid, self.segment_number)
        eid = self.events.alloc(nbytes, self.segment_number) if nbytes else -1
        self._touch()
        return category, seg, eid

    def _touch(self, extra: int = 0) -> None:
        live = self.live + extra
        if live > self._peak_live:
            self._peak_live = live
            vec = list(self.by_cat)
            vec[TRANSIENT] += extra
            self._peak_vec = tuple(vec)

    # -- segments -------------------------------------------------------------------------
    def mark(self, label: str) -> None:
        """Close the open segment (if any), apply deferred frees, and open one called ``label``."""
        if self._label is not None:
            self.segments.append(StepSegment(self._label, self._start, self._peak_vec, tuple(self.by_cat)))
            for nbytes, category, kind, eid in self._deferred:
                self.by_cat[category] -= nbytes
                self.releases.append((self._label, only(category, nbytes), kind))
                if eid >= 0:
                    self.events.free(eid, self.segment_number)
                    self.release_events.append((self._label, kind, eid))
            self._deferred.clear()
        now = tuple(self.by_cat)
        self._labels.append(label)
        self._label, self._start = label, now
        self._peak_live, self._peak_vec = self.live, now

    # -- dispatch -------------------------------------------------------------------------
    def _scalar(self, t: torch.Tensor) -> bool | int | float:
        """A value for ``.item()`` on a fake tensor (it holds none): the one a healthy real step sees."""
        if t.dtype == torch.bool:
            return True  # transformers: "every row is one unpacked sequence" (no explicit mask is built)
        if storage_key(t) in self._zero_flags:
            return 0.0  # GradScaler's found_inf: no overflow, so the optimizer steps
        return 1.0 if t.is_floating_point() else 1  # e.g. Adam's step count (any positive value)

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._disable_dynamo`` around ``__torch_dispatch__``: a trace never compiles (see fake_mode.py)."""
        return False

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.pending_label is not None:
            label, self.pending_label = self.pending_label, None
            self.mark(label)
        if func is _DEVICE and type(args[0]) is FakeTensor:
            # A tensor's device, asked about two thirds of a step's dispatches (autograd, checkpointing): answered
            # as FakeTensor answers it, without the trip back through the dispatcher (no storage, no scratch).
            self._touch()
            return _META if args[0].fake_mode.in_kernel_invocation else args[0].fake_device
        if func is _LOCAL_SCALAR:
            return self._scalar(args[0])
        if func is _UNSCALE:
            self._zero_flags.add(storage_key(args[1]))
        out = func(*args, **(kwargs or {}))
        self.ops.count(func, args, kwargs, out, self._label, self.op_key(func) if self.op_key is not None else None)
        category = self.tag
        if category == TRANSIENT and torch.is_grad_enabled():
            category = ACTIVATIONS  # checkpoint recomputation runs with grad enabled inside backward
        for t in tree_leaves(out) if creates_storage(func) else ():
            if isinstance(t, torch.Tensor):
                self._add(t, category)
        scratch = self.kernels.workspace_buffers(func, args, out)
        if scratch:
            self.events.scratch(scratch, self.segment_number)
            self._touch(sum(self.kernels.block_bytes(n) for n in scratch))
        else:
            self._touch()
        return out
