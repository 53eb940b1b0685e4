"""The fake-tensor mode the estimator traces under: PyTorch's ``FakeTensorMode`` with a cheaper dispatch-cache key.

A traced step dispatches about 2,300 aten ops per short model, almost all of them answered from FakeTensorMode's
dispatch cache. Making the cache key was half of a trace's time (issue 24): for every tensor argument the mode builds a
``TensorMetadata`` of 17 fields (three sparsity checks, a suggested memory format, an ``is_contiguous``) and flattens
it through ``dataclasses.fields``. ``FastKeyFakeTensorMode`` builds a key that tells exactly the same calls apart, from
what decides the metadata of the outputs, read straight off the tensor:

- dtype, sizes, strides, device, storage offset and the storage's bytes, ``requires_grad``, the conjugate and
  negative bits, inference: the fields of PyTorch's key;
- not repeated: the memory format and contiguity (functions of the sizes and strides), ``is_quantized`` (of the
  dtype), the sparse fields (only strided tensors take this path).

Anything else (symbolic sizes, a shape environment, a tensor of another mode or with a constant, a non-strided
layout, an argument of a type not listed in ``_PLAIN``) takes PyTorch's own key, which also decides when not to cache.
The keys start with a marker of their own, so they never meet PyTorch's in the class-wide cache.

One op PyTorch never caches is ``aten._unsafe_view`` (its output shares its input's storage, which a cached entry cannot
give it): every linear layer reshapes its output with one, and each took the mode's whole uncached path (constant
propagation, decompositions, device inference) to end in the op's meta kernel. ``FastKeyFakeTensorMode`` runs that
kernel on the input directly, as that path does, and wraps the result on the input's device; a tensor of another mode,
with a constant or symbolic sizes, still takes PyTorch's path. The view ops a step runs (``detach``, ``t``, ``view``,
``slice``, ``transpose`` and a few more: 42% of a short model's dispatches) take the same direct path: a view's
metadata is its meta kernel's, which a cache hit rebuilt in 45 us and a miss (a new batch or sequence length) worked
out in up to 650 us through the op's Python decomposition, against 17 us here. Each is checked when this module is
imported against PyTorch's own path (sizes, strides, offset, dtype, device, ``requires_grad`` and the storage shared
with the input, from a tensor that requires grad and one that does not); one that differs keeps PyTorch's path.

A cache hit that makes a new tensor (not a view, not in place) is wrapped straight from the entry's metadata, without
the checks for symbolic sizes that only a shape environment needs.

Where this PyTorch lacks the private methods overridden here (or their signatures changed), ``fake_mode()`` returns a
plain FakeTensorMode: traces are the same, only slower.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

_MARK = object()  # first element of every key made here
_STRIDED = torch.strided
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default
_ATEN = torch.ops.aten
# The view ops that take the direct path where ``_works`` finds them equal to PyTorch's, each with arguments to check.
_VIEW_CHECKS: dict[Any, tuple[Any, ...]] = {
    _ATEN.detach.default: (),
    _ATEN.t.default: (),  # (on a 2-D tensor: see _direct_views)
    _ATEN.view.default: ([24, 8],),
    _ATEN.slice.Tensor: (1, 0, 3),
    _ATEN.transpose.int: (0, 1),
    _ATEN.unsqueeze.default: (0,),
    _ATEN.as_strided.default: ([2, 3], [1, 2], 1),
    _ATEN.expand.default: ([2, 4, 6, 8],),
    _ATEN.permute.default: ([2, 0, 1],),
    _ATEN.select.int: (1, 2),
    _ATEN.alias.default: (),
    _ATEN.squeeze.dim: (0,),
}
# Arguments that enter the key as (type, value), as in PyTorch's key: 1 and 1.0 hash alike but make other dtypes.
_PLAIN = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


class _Fallback(Exception):
    """An argument this key does not describe: PyTorch's own key decides."""


class FastKeyFakeTensorMode(FakeTensorMode):
    """FakeTensorMode whose dispatch-cache key is made in one pass over the arguments, and whose ``_unsafe_view`` runs
    its meta kernel directly (see the module docstring)."""

    def _cached_dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if (func is _UNSAFE_VIEW or func in DIRECT_VIEWS) and not kwargs and self.shape_env is None:
            source = args[0]
            if (type(source) is FakeTensor and source.fake_mode is self and source.constant is None
                    and not source._has_symbolic_sizes_strides
                    and not any(isinstance(a, torch.Tensor) for a in args[1:])):
                with in_kernel_invocation_manager(self):
                    out = func(source, *args[1:])  # the meta kernel: a tensor on the input's storage
                return FakeTensor(self, out, source.device)
        return super()._cached_dispatch_impl(func, types, args, kwargs)

    def _get_output_tensor_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        # A cache hit that makes a new tensor (no view, no in-place op, no symbols, no conjugate or negative bit): the
        # empty meta tensor of the cached metadata, wrapped as PyTorch's own path wraps it; anything else takes it.
        metadata = entry.metadata
        if (metadata is None or entry.inplace_idx is not None or entry.view_idx is not None
                or self.shape_env is not None
                or metadata.is_conj or metadata.is_neg or metadata.layout is not _STRIDED):
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        with in_kernel_invocation_manager(self):
            empty = torch.empty_strided(metadata.shape, metadata.stride, dtype=metadata.dtype, layout=_STRIDED,
                                        device="meta", requires_grad=metadata.requires_grad)
        return FakeTensor(self, empty, metadata.device)

    def _cache_key(self, state: Any, func: Any, args: Any, kwargs: Any) -> Any:
        if self.shape_env is not None:
            return super()._cache_key(state, func, args, kwargs)
        key: list[object] = [
            _MARK, func, torch.get_default_dtype(), torch._C._get_default_device(), torch.is_inference_mode_enabled(),
            torch.fx.experimental.proxy_tensor.get_proxy_mode() is not None,
        ]
        try:
            self._describe(key, args)
            if kwargs:
                key.append(dict)
                for name, value in kwargs.items():
                    key.append(name)
                    self._describe(key, (value,))
        except _Fallback:
            return super()._cache_key(state, func, args, kwargs)
        return fake_tensor._DispatchCacheKey(tuple(key))

    def _describe(self, key: list[object], args: Any) -> None:
        key.append(len(args))
        for arg in args:
            kind = type(arg)
            if kind is FakeTensor:
                if (arg.fake_mode is not self or arg.constant is not None or arg.layout is not _STRIDED
                        or arg._has_symbolic_sizes_strides):
                    raise _Fallback
                key.append((
                    arg.dtype, arg.shape, arg.stride(), arg.device, arg.storage_offset(),
                    arg.untyped_storage().nbytes(), arg.requires_grad, arg.is_conj(), arg.is_neg(), arg.is_inference(),
                ))
            elif kind is list or kind is tuple:
                key.append(kind)
                self._describe(key, arg)
            elif kind in _PLAIN:
                key.append(kind)
                key.append(arg)
            else:  # other tensors (PyTorch refuses to cache them), symbols, callables, ...
                raise _Fallback


def _overridable() -> bool:
    """Whether this PyTorch's FakeTensorMode has the methods overridden here, with the same parameters, and the key
    class."""
    expected = {
        "_cache_key": ["self", "state", "func", "args", "kwargs"],
        "_cached_dispatch_impl": ["self", "func", "types", "args", "kwargs"],
        "_get_output_tensor_from_cache_entry": ["self", "state", "entry", "key", "func", "args"],
    }
    for name, parameters in expected.items():
        method = getattr(FakeTensorMode, name, None)
        if method is None or list(inspect.signature(method).parameters) != parameters:
            return False
    return hasattr(fake_tensor, "_DispatchCacheKey") and hasattr(torch._C, "_get_default_device")


def _works() -> bool:
    """A few ops under the mode (one twice: a cache hit; a view; ``_unsafe_view``): False where this PyTorch's internals
    differ in a way the signatures do not show, so that traces fall back to the plain mode instead of failing."""
    try:
        with FastKeyFakeTensorMode():
            x = torch.empty(2, 3)
            y = [(x + x).view(6) for _ in range(2)]
            z = _UNSAFE_VIEW(x, [3, 2])
        return (all(t.shape == (6,) and t.dtype == x.dtype for t in y) and z.shape == (3, 2)
                and z.untyped_storage()._cdata == x.untyped_storage()._cdata)
    except Exception:
        return False


def _direct_views() -> frozenset[Any]:
    """The view ops of ``_VIEW_CHECKS`` whose direct path gives what PyTorch's gives here (see the module docstring);
    none where this PyTorch's internals differ in a way the check cannot run."""
    found = set()
    for func, rest in _VIEW_CHECKS.items():
        try:
            same = True
            for grad in (False, True):
                with FakeTensorMode() as reference:
                    x = torch.empty(3, 5) if func is _ATEN.t.default else torch.empty(1 if func is _ATEN.squeeze.dim
                                                                                       else 4, 6, 8)
                    x.requires_grad_(grad)
                    theirs = func(x, *rest)
                    with in_kernel_invocation_manager(reference):
                        meta = func(x, *rest)
                    mine = FakeTensor(reference, meta, x.device)
                same = same and (
                    type(theirs) is FakeTensor and mine.shape == theirs.shape and mine.stride() == theirs.stride()
                    and mine.storage_offset() == theirs.storage_offset() and mine.dtype == theirs.dtype
                    and mine.device == theirs.device and mine.requires_grad == theirs.requires_grad
                    and mine.untyped_storage()._cdata == theirs.untyped_storage()._cdata == x.untyped_storage()._cdata
                )
            if same:
                found.add(func)
        except Exception:
            continue
    return frozenset(found)


DIRECT_VIEWS: frozenset[Any] = frozenset()  # (none while ``_works`` checks the mode itself)
FAST_KEY = _overridable() and _works()
DIRECT_VIEWS = _direct_views() if FAST_KEY else frozenset()


def fake_mode() -> FakeTensorMode:
    """A new fake-tensor mode for one trace: ``FastKeyFakeTensorMode`` where this PyTorch allows it."""
    return FastKeyFakeTensorMode() if FAST_KEY else FakeTensorMode()
