"""Each traced op's cost, per segment of the step: its class, FLOPs and bytes read and written (``OpCounter``).

The ``StepTracker`` (estimator/tracker.py) hands every op it dispatches to an ``OpCounter``, which counts it in
the open segment as one op of (class, FLOPs, bytes) (``train.flops.OpCosts``: plain data, kept on the
``StepTrace``). estimator/assembly.py adds the segments up per layout, so a layer's recomputation is counted
where the layout recomputes it: a checkpointed layer's backward segment holds its forward once more.

- **FLOPs** are torch.utils.flop_counter's registered formulas (``flop_registry``: mm, addmm, bmm, baddbmm, the
  fused attention kernels, forward and backward). The CPU's fused attention (what the fake step runs,
  estimator/device_model.py) is not registered: it is counted by the formula of the CUDA flash kernel it stands
  for, with the same arguments (query, key, value first; the backward's gradient before them). Like PyTorch's, the
  attention formulas count the whole score matrix, also under a causal mask (a kernel that skips masked blocks
  shows it in its calibrated rate). Every other op counts no FLOPs: it is timed by its bytes.
- **Bytes** are what an op reads and writes: every tensor argument and every output (a list of tensors, as the
  optimizer's multi-tensor ops take, counts each), each as the memory its shape spans (a broadcast dimension,
  stride 0, is read once). An in-place op reads and writes its tensor.
- **Classes** (train/flops.py): ``matmul:<dtype>``, ``attention:sdpa:<dtype>`` (a fused kernel),
  ``attention:eager:<dtype>`` (bmm and baddbmm: in the dense families ckptbench builds, only eager attention's score
  and value products), ``memory`` (elementwise, norms, softmax, the loss, the embedding), ``copy`` (casts, copies,
  concatenation), ``optimizer:fused`` (the fused optimizer kernel), ``optimizer:foreach`` (multi-tensor ops over
  whole tensors, wherever they run), ``optimizer:single`` (every other op of the optimizer step: per-tensor loops,
  the step counters),
  ``communication`` (collectives). Views, empty tensors and metadata ops launch no kernel and are not counted. A
  matmul doing less than one FLOP per byte it moves (the rotary embedding's outer product) is a memory op.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from ckptbench.train.flops import (
    COMMUNICATION,
    COPY,
    MEMORY,
    OPTIMIZER_FOREACH,
    OPTIMIZER_FUSED,
    OPTIMIZER_SINGLE,
    OpCosts,
    OpKey,
)

_aten = torch.ops.aten
# The CPU's fused attention, counted by the formula of the CUDA kernel it stands for (same leading arguments).
_TWINS: dict[Any, Any] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _aten._scaled_dot_product_flash_attention_backward,
}
_MATMUL = frozenset({"mm", "addmm", "_scaled_mm", "_int_mm"})
_BATCHED = frozenset({"bmm", "baddbmm"})
_ATTENTION = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
    "_flash_attention_forward", "_flash_attention_backward", "_efficient_attention_forward",
    "_efficient_attention_backward",
})
_COPY = frozenset({"_to_copy", "copy_", "clone", "cat", "slice_backward", "select_backward", "constant_pad_nd",
                   "_copy_from", "_copy_from_and_resize"})
# Ops that launch no kernel: they make a tensor without writing it, or describe one.
_FREE = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_unsafe_view",
                   "lift_fresh", "_local_scalar_dense", "set_", "resize_", "sym_size", "sym_stride", "sym_numel",
                   "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type", "record_stream"})
_COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d", "c10d_functional", "_c10d_functional_autograd"})
_NO_KERNEL_NAMESPACES = frozenset({"prim", "profiler"})
# Segments of the optimizer step (estimator/trace.py): every op there is the optimizer's.
OPTIMIZER_SEGMENTS = frozenset({"opt", "zero", "opt_first", "grads", "grads_first"})

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
           torch.int8: "int8", torch.float8_e4m3fn: "fp8", torch.float8_e5m2: "fp8"}

_NOT_COUNTED = "-"  # an op's kind when it launches no kernel
MIN_INTENSITY = 1.0  # FLOPs per byte below which a matmul is counted as a memory op


def dtype_name(dtype: torch.dtype) -> str:
    """'bf16', 'fp16', 'fp32', ...: how a class names a dtype."""
    return _DTYPES.get(dtype, str(dtype).removeprefix("torch."))


def kind_of(func: Any) -> str:
    """An op's kind, before its dtype and segment: matmul, attention:sdpa, attention:eager, memory, copy,
    optimizer, communication, or '-' (no kernel: a view, an empty tensor, metadata)."""
    if getattr(func, "is_view", False):
        return _NOT_COUNTED
    namespace = getattr(func, "namespace", "aten")
    name = func._overloadpacket.__name__ if hasattr(func, "_overloadpacket") else str(func)
    if namespace in _NO_KERNEL_NAMESPACES or name in _FREE:
        return _NOT_COUNTED
    if namespace in _COLLECTIVE_NAMESPACES:
        return COMMUNICATION
    if name in _MATMUL:
        return "matmul"
    if name in _BATCHED:
        return "attention:eager"
    if name in _ATTENTION:
        return "attention:sdpa"
    if name.startswith(("_fused_adam", "_fused_sgd")):
        return OPTIMIZER_FUSED
    if name.startswith("_foreach_"):
        return OPTIMIZER_FOREACH
    if name in _COPY:
        return COPY
    return MEMORY


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of an op's argument or output: itself, or those of a list, tuple or dict (one level deep, as
    ops take them)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v
            elif isinstance(v, (list, tuple)):
                yield from (x for x in v if isinstance(x, torch.Tensor))
    elif isinstance(value, dict):
        for v in value.values():
            yield from tensors(v)


def spanned_bytes(t: torch.Tensor) -> int:
    """The bytes a tensor's shape spans, a broadcast (stride 0) dimension once."""
    strides = t.stride()
    if 0 not in strides:  # no broadcast dimension: every element (none where a dimension is empty)
        return t.numel() * t.element_size()
    elements = 1
    for size, stride in zip(t.shape, strides, strict=True):
        if size == 0:
            return 0
        if stride:
            elements *= size
    return elements * t.element_size()


def _spanned(values: Any) -> int:
    """``spanned_bytes`` of every tensor ``tensors`` finds in each of ``values`` (an op's arguments), added up: the
    same walk, without a generator per argument (a trace counts thousands of ops)."""
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += spanned_bytes(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    total += spanned_bytes(x)
                elif isinstance(x, (list, tuple)):
                    total += sum(spanned_bytes(y) for y in x if isinstance(y, torch.Tensor))
        elif isinstance(v, dict):
            total += _spanned(v.values())
    return total


def mutated_arguments(func: Any) -> tuple[int, ...]:
    """The positions of the arguments an op writes in place (its schema's annotations: ``add_``'s self, every list
    of ``_foreach_mul_`` or ``_fused_adamw_`` it updates)."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return ()
    return tuple(i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write)


def _compute_dtype(kind: str, args: tuple[Any, ...], out: Any) -> str:
    """The dtype a compute op runs in: its first tensor input's (the query, a matmul's left operand)."""
    first = next((t for a in args for t in tensors(a)), None)
    if first is None:
        first = next(tensors(out), None)
    return dtype_name(first.dtype) if first is not None else "?"


def _shapes_key(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> tuple[Any, ...] | None:
    """What a FLOP formula reads of a call: the op, each tensor's shape (in lists and tuples too) and every other
    argument, the outputs' shapes; None where an argument cannot be a key (then the formula is asked)."""
    def described(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return (torch.Size, value.shape)
        if isinstance(value, (list, tuple)):
            return (type(value), *(described(v) for v in value))
        return value

    key = (func, described(args), described(tuple(sorted((kwargs or {}).items()))), described(out))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _formula(func: Any) -> Callable[..., int] | None:
    packet = getattr(func, "_overloadpacket", None)
    found = flop_registry.get(packet)
    if found is None and packet in _TWINS:
        found = flop_registry.get(_TWINS[packet])
    return found


# Each op's (class, FLOPs, bytes) by its fake-tensor dispatch-cache key and whether it is the optimizer step's
# (``OpCounter.count``'s ``key``): the key tells calls apart by every tensor's dtype, sizes, strides and storage and
# every other argument, and the cache holds an entry for it only where the outputs follow from them, so the cost is the
# same for every call with that key. A decoder layer's ops repeat in every layer: the walk over the arguments and
# outputs, 9% of a short model's trace, is made once per key (kept for the process, as FakeTensorMode's cache is;
# forked workers inherit it): LLaMA-7B's short traces of the 704-point grid, 140-147 -> 134 ms each on a 2-core CPU.
_BY_KEY: dict[tuple[Any, bool], OpKey] = {}
_BY_KEY_MAX = 500_000  # entries kept before the memo starts again (a long-lived process's traces of many shapes)


class OpCounter:
    """Counts each op the tracker sees in the segment open at the time (ops before the first segment, the model's
    preparation, are not the step's)."""

    def __init__(self) -> None:
        self.segments: dict[str, Counter[OpKey]] = {}
        self._kinds: dict[Any, str] = {}
        self._mutated: dict[Any, tuple[int, ...]] = {}
        self._optimizing: dict[str, bool] = {}  # whether a segment is the optimizer step's, by label
        self._flop_memo: dict[tuple[Any, ...], int] = {}  # FLOPs by op and shapes (``_flops``)

    def count(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any,
              label: str | None, key: Any = None) -> None:
        """Count one op in the segment ``label``; ``key``: its fake-tensor dispatch-cache key where the cache holds
        an entry for it (``FastKeyFakeTensorMode.op_key``), which its cost is kept by."""
        if label is None:
            return
        kind = self._kinds.get(func)
        if kind is None:
            kind = self._kinds[func] = kind_of(func)
        if kind == _NOT_COUNTED:
            return
        optimizing = self._optimizing.get(label)
        if optimizing is None:
            optimizing = self._optimizing[label] = label.partition("@")[0] in OPTIMIZER_SEGMENTS
        if key is None:
            cost = self._cost(func, kind, optimizing, args, kwargs, out)
        else:
            found = _BY_KEY.get((key, optimizing))
            if found is None:
                if len(_BY_KEY) >= _BY_KEY_MAX:
                    _BY_KEY.clear()
                found = _BY_KEY[(key, optimizing)] = self._cost(func, kind, optimizing, args, kwargs, out)
            cost = found
        self.segments.setdefault(label, Counter())[cost] += 1

    def _cost(self, func: Any, kind: str, optimizing: bool, args: tuple[Any, ...], kwargs: dict[str, Any] | None,
              out: Any) -> OpKey:
        """One op's (class, FLOPs, bytes moved)."""
        if optimizing and kind not in (COMMUNICATION, OPTIMIZER_FUSED, OPTIMIZER_FOREACH):
            kind = OPTIMIZER_SINGLE  # the optimizer's per-tensor ops (SGD's or Adafactor's loop, a cast)
        elif kind == OPTIMIZER_FOREACH and all(t.numel() <= 1 for a in args for t in tensors(a)):
            kind = OPTIMIZER_SINGLE  # over scalars (the step counters, host tensors on a GPU): not a streaming kernel
        moved = _spanned(args)
        if kwargs:
            moved += _spanned(kwargs.values())
        mutated = self._mutated.get(func)
        if mutated is None:
            mutated = self._mutated[func] = mutated_arguments(func)
        if mutated:  # written in place (what it returns is what it wrote)
            moved += _spanned([args[i] for i in mutated if i < len(args)])
        else:
            moved += _spanned((out,))
        flops = 0
        if kind in ("matmul", "attention:sdpa", "attention:eager"):
            flops = self._flops(func, args, kwargs, out)
            # An outer or matrix-vector product (the rotary angles' fp32 matmul) does fewer FLOPs than it moves
            # bytes: memory-bound on any device, so timed with the memory ops (and not by a dtype's peak).
            kind = f"{kind}:{_compute_dtype(kind, args, out)}" if flops >= moved * MIN_INTENSITY else MEMORY
        return kind, flops, moved

    def _flops(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> int:
        """The op's FLOPs by its registered formula (0 where none is), worked out once per op and shapes: the
        formulas read only shapes (and flags), and each decoder layer repeats its products (PyTorch's wrapper maps
        every argument to its shape first: 3% of a short model's trace, asked every time)."""
        key = _shapes_key(func, args, kwargs, out)
        found = self._flop_memo.get(key) if key is not None else None
        if found is None:
            formula = _formula(func)
            found = int(formula(*args, **(kwargs or {}), out_val=out)) if formula is not None else 0
            if key is not None:
                self._flop_memo[key] = found
        return found

    def result(self) -> tuple[tuple[str, OpCosts], ...]:
        """Each segment's ops, in the order the segments opened (plain data for the trace)."""
        return tuple((label, OpCosts(dict(sorted(c.items())))) for label, c in self.segments.items())
