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

A cache miss (a trace of a new batch or sequence length misses for about a hundred ops) took PyTorch's uncached path:
some twenty checks (subclasses, constants, lifts, decompositions, prims, registered fake kernels, PyTorch's own
implementations, fallbacks) before, for most ops, running the op's meta kernel and wrapping its outputs, 0.3 ms an op.
Which way that path goes depends on the op alone where every tensor argument is a plain fake tensor of the mode; so
the first miss of an op takes it and notes whether it ended in the meta kernel (the one place that wraps a kernel's
outputs for the op it was asked: ``wrap_meta_outputs_with_default_device_logic``), and the later misses of such an op
run the kernel and that wrapping directly (6% of a short model's trace; a kernel that raises NotImplementedError
leaves the call to PyTorch's path, which then falls back to the op's real kernel).

PyTorch wraps a dispatch mode's ``__torch_dispatch__`` in ``torch._disable_dynamo`` (so that ``torch.compile`` never
traces a mode's Python): four switches of the frame-evaluation hook a call, around each of a trace's dispatches,
which never compiles. This mode takes FakeTensorMode's method without that wrapper (``unguarded``) and declines it for
itself (``_should_skip_dynamo``, the switch PyTorch's ``TorchDispatchMode`` documents), as the tracker does: 3-6% of
a short model's trace.

The tensors those paths make (a cache hit's output, a direct view's) are made by ``new_fake``: what
``FakeTensor.__new__`` does for a meta tensor on a device already normalised (the subclass over the meta tensor with the
device's dispatch keys, the mutable-data-pointer guard, and its attributes, the memos' empty), without its argument
checks, device normalisation and memo descriptors: 1.3 us a tensor against 7.5 us, about 8% of a short model's trace.
It is checked when this module is imported against ``FakeTensor(...)`` (the same attributes, type, dispatch keys,
``requires_grad`` and guard); where it differs, and for a device of the accelerator this process has (whose fake tensors
PyTorch's constructor also initialises the device for), ``FakeTensor(...)`` makes them.

Where this PyTorch lacks the private methods overridden here (or their signatures changed), ``fake_mode()`` returns a
plain FakeTensorMode: traces are the same, only slower.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch._subclasses import fake_tensor
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, in_kernel_invocation_manager

_MARK = object()  # first element of every key made here
_STRIDED = torch.strided
_UNSAFE_VIEW = torch.ops.aten._unsafe_view.default
_ATEN = torch.ops.aten
# The view ops that take the direct path where ``_direct_views`` finds them equal to PyTorch's, each with arguments to
# check them with.
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
_MAKE_SUBCLASS = torch.Tensor._make_subclass
_DISABLE_TORCH_DISPATCH = torch._C._DisableTorchDispatch
_BYPASS_ENTRY = getattr(fake_tensor, "_DispatchCacheBypassEntry", None)  # the cache's entry for an op it does not cache


# The ops PyTorch's uncached path answers with their meta kernel, and those it answers otherwise (a decomposition, its
# own implementation, a fallback), learnt in this process (FastKeyFakeTensorMode._learnt; forked workers inherit them).
META_BRANCH: set[Any] = set()
_OTHER_BRANCH: set[Any] = set()


def _guard_code() -> Any:
    """The code of the wrapper ``torch._disable_dynamo`` puts around a function (one nested function: every wrapper
    it makes runs the same code), or None where this torch has no such function."""
    disable = getattr(torch, "_disable_dynamo", None)
    return None if disable is None else getattr(disable(lambda: None), "__code__", None)


_GUARD = _guard_code()


def unguarded(fn: Any) -> Any:
    """``fn`` without ``torch._disable_dynamo``'s wrapper, where it is one (its ``__wrapped__``); else ``fn``."""
    inner = getattr(fn, "__wrapped__", None)
    return inner if _GUARD is not None and getattr(fn, "__code__", None) is _GUARD and inner is not None else fn


def _plain_leaves(mode: Any, args: Any, kwargs: Any) -> list[Any] | None:
    """The arguments of a call, a list or tuple of them flattened, where every tensor among them is a plain fake tensor
    of ``mode`` (strided, no constant, no symbolic sizes) and there is one at least; else None."""
    leaves: list[Any] = []
    tensors = 0
    for value in (*args, *kwargs.values()):
        for leaf in (value if type(value) in (list, tuple) else (value,)):
            if isinstance(leaf, torch.Tensor):
                if (type(leaf) is not FakeTensor or leaf.fake_mode is not mode or leaf.constant is not None
                        or leaf.layout is not _STRIDED or leaf._has_symbolic_sizes_strides):
                    return None
                tensors += 1
            elif type(leaf) in (list, tuple) or isinstance(leaf, torch.SymInt):
                return None
            leaves.append(leaf)
    return leaves if tensors else None


class _Fallback(Exception):
    """An argument this key does not describe: PyTorch's own key decides."""


class FastKeyFakeTensorMode(FakeTensorMode):
    """FakeTensorMode whose dispatch-cache key is made in one pass over the arguments, and whose ``_unsafe_view`` runs
    its meta kernel directly (see the module docstring)."""

    __torch_dispatch__ = unguarded(vars(FakeTensorMode).get("__torch_dispatch__", FakeTensorMode.__torch_dispatch__))

    _ckptbench_depth = 0  # how deep dispatch is nested: 1 for an op the mode above (the tracker) asked for
    _ckptbench_key: Any = None  # the key of that op, once made

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # a trace never compiles (TorchDispatchMode.__init_subclass__ would wrap the method above again)

    def dispatch(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        depth = self._ckptbench_depth
        if not depth:
            self._ckptbench_key = None
        self._ckptbench_depth = depth + 1
        try:
            return super().dispatch(func, types, args, kwargs)
        finally:
            self._ckptbench_depth = depth

    def op_key(self, func: Any) -> Any:
        """The dispatch-cache key of ``func``, the op this mode last answered for the mode above it (not one of the
        ops it ran to answer it), where the cache holds an entry for it: the op's outputs are then a function of the
        key (a view answered directly, an op the cache bypasses, another op's key: None). Taken once. What the
        tracker's op costs are kept by (estimator/op_costs.py)."""
        key, self._ckptbench_key = self._ckptbench_key, None
        if key is None or _BYPASS_ENTRY is None or key.key[1] is not func:
            return None
        entry = FakeTensorMode.cache.get(key)
        return key if entry is not None and not isinstance(entry, _BYPASS_ENTRY) else None

    def _cached_dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        if (func is _UNSAFE_VIEW or func in DIRECT_VIEWS) and not kwargs and self.shape_env is None:
            source = args[0]
            if (type(source) is FakeTensor and source.fake_mode is self and source.constant is None
                    and not source._has_symbolic_sizes_strides
                    and not any(isinstance(a, torch.Tensor) for a in args[1:])):
                with in_kernel_invocation_manager(self):
                    out = func(source, *args[1:])  # the meta kernel: a tensor on the input's storage
                return new_fake(self, out, source.device)
        return super()._cached_dispatch_impl(func, types, args, kwargs)

    def _dispatch_impl(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        # What the cache does not answer: an op PyTorch's path answers with its meta kernel (learnt from its first
        # call, ``_learnt``), on fake tensors of this mode alone, runs that kernel here and wraps its outputs as that
        # path does, without the checks that lead there; anything else takes PyTorch's path.
        if func not in _OTHER_BRANCH and self.shape_env is None and not getattr(self, "propagate_real_tensors", True):
            flat = _plain_leaves(self, args, kwargs)
            if flat is not None:
                if func in META_BRANCH:
                    try:
                        with in_kernel_invocation_manager(self):
                            r = func(*args, **kwargs)
                    except NotImplementedError:  # PyTorch's path then runs the op's real kernel: its own
                        return super()._dispatch_impl(func, types, args, kwargs)
                    return self.wrap_meta_outputs_with_default_device_logic(r, func, flat, kwargs.get("device"))
                return self._learnt(func, types, args, kwargs)
        return super()._dispatch_impl(func, types, args, kwargs)

    def _learnt(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        """PyTorch's path for ``func``, noting whether it answered with the op's meta kernel (it wrapped the kernel's
        outputs for this very op: ``wrap_meta_outputs_with_default_device_logic`` is called there alone). Which way
        it goes depends on the op alone where every tensor argument is a plain fake tensor of this mode (no constant,
        no symbol, no other mode's or real tensor: ``_plain_leaves``)."""
        learning = self.__dict__.setdefault("_ckptbench_learning", [])
        learning.append(func)
        try:
            return super()._dispatch_impl(func, types, args, kwargs)
        finally:
            learning.pop()
            if func not in META_BRANCH:
                _OTHER_BRANCH.add(func)

    def wrap_meta_outputs_with_default_device_logic(self, r: Any, func: Any, flat_args: Any, device: Any) -> Any:
        learning = self.__dict__.get("_ckptbench_learning")
        if learning and learning[-1] is func:
            META_BRANCH.add(func)
        return super().wrap_meta_outputs_with_default_device_logic(r, func, flat_args, device)

    def _get_output_tensor_from_cache_entry(self, state: Any, entry: Any, key: Any, func: Any, args: Any) -> Any:
        # A cache hit that makes a new tensor (no view, no in-place op, no symbols, no conjugate or negative bit): the
        # empty meta tensor of the cached metadata, wrapped as PyTorch's own path wraps it; anything else takes it.
        metadata = entry.metadata
        if (metadata is None or entry.inplace_idx is not None or entry.view_idx is not None
                or self.shape_env is not None
                or metadata.is_conj or metadata.is_neg or metadata.layout is not _STRIDED):
            return super()._get_output_tensor_from_cache_entry(state, entry, key, func, args)
        with _DISABLE_TORCH_DISPATCH():  # a meta factory: no mode sees it (the meta key is the device's own)
            empty = torch.empty_strided(metadata.shape, metadata.stride, dtype=metadata.dtype, layout=_STRIDED,
                                        device="meta", requires_grad=metadata.requires_grad)
        return new_fake(self, empty, metadata.device)

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
        made = fake_tensor._DispatchCacheKey(tuple(key))
        if self._ckptbench_depth == 1:
            self._ckptbench_key = made
        return made

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


def _fake_attributes() -> dict[str, Any] | None:
    """The attributes ``FakeTensor.__new__`` gives a plain fake tensor (no constant, no real tensor, the memos empty),
    each None, as this PyTorch names them; None where they cannot be read."""
    try:
        with FakeTensorMode() as mode:
            made = FakeTensor(mode, torch.empty(1, device="meta"), torch.device("cpu"))
        return dict.fromkeys(vars(made))
    except Exception:
        return None


_ATTRIBUTES = _fake_attributes()
def _accelerator_type() -> str | None:
    """This process's accelerator's device type (None: none)."""
    found = torch.accelerator.current_accelerator(True) if hasattr(torch, "accelerator") else None
    return None if found is None else found.type


_ACCELERATOR = _accelerator_type()  # (the import's check below needs it: asked here once)


def _plain_new(mode: FakeTensorMode, elem: torch.Tensor, device: torch.device) -> FakeTensor:
    """What ``FakeTensor(mode, elem, device)`` makes, for a meta ``elem`` and a normalised ``device`` that is not
    the accelerator's (see the module docstring)."""
    assert _ATTRIBUTES is not None
    made = _MAKE_SUBCLASS(FakeTensor, elem, elem.requires_grad, dispatch_device=True, device_for_backend_keys=device)
    if mode._allow_unsafe_data_ptr_access:
        torch._C._set_warn_deprecated_on_mutable_data_ptr(made)
    else:
        torch._C._set_throw_on_mutable_data_ptr(made)
    attributes = made.__dict__
    attributes.update(_ATTRIBUTES)
    attributes["_fake_device"] = device
    attributes["fake_mode"] = mode
    return made


def new_fake(mode: FakeTensorMode, elem: torch.Tensor, device: torch.device) -> FakeTensor:
    """``FakeTensor(mode, elem, device)``: by ``_plain_new`` where it was found the same here (``FAST_NEW``), the
    device is normalised already (an index where its type takes one) and not this process's accelerator, and
    PyTorch's debug traces are off; else by PyTorch's constructor."""
    if (FAST_NEW and (device.index is not None or device.type == "cpu") and not fake_tensor.FakeTensorConfig.debug
            and device.type != _ACCELERATOR):
        return _plain_new(mode, elem, device)
    return FakeTensor(mode, elem, device)


def _same_tensor(mine: Any, theirs: Any) -> bool:
    """Whether two fake tensors are alike as ``new_fake`` must make them: type, attributes, dispatch keys,
    ``requires_grad``, metadata, and the mutable-data-pointer guard (asking for the data pointer raises for both, or
    for neither: PyTorch warns once a process in the second case, which is not shown here)."""

    def raises(t: Any) -> bool:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                t.data_ptr()
            except RuntimeError:
                return True
        return False

    return (type(mine) is type(theirs) and vars(mine) == vars(theirs)
            and torch._C._dispatch_keys(mine) == torch._C._dispatch_keys(theirs)
            and mine.requires_grad == theirs.requires_grad and mine.shape == theirs.shape
            and mine.stride() == theirs.stride() and mine.dtype == theirs.dtype and raises(mine) == raises(theirs))


def _plain_new_works() -> bool:
    """``_plain_new`` against ``FakeTensor(...)`` for a CPU and a CUDA fake device, with and without grad, with the
    data-pointer guard that raises and the one that warns (False where this PyTorch's constructor does something
    else, or the check cannot run)."""
    if _ATTRIBUTES is None:
        return False
    try:
        for unsafe in (False, True):
            mode = FakeTensorMode()
            mode._allow_unsafe_data_ptr_access = unsafe
            for device in (torch.device("cpu"), torch.device("cuda", 0)):
                if device.type == _ACCELERATOR:
                    continue
                for grad in (False, True):  # each its own meta tensor: the guard is set on the storage
                    mine = _plain_new(mode, torch.empty(2, 3, device="meta", requires_grad=grad), device)
                    theirs = FakeTensor(mode, torch.empty(2, 3, device="meta", requires_grad=grad), device)
                    if not _same_tensor(mine, theirs):
                        return False
        return True
    except Exception:
        return False


FAST_NEW = _plain_new_works()


def _overridable() -> bool:
    """Whether this PyTorch's FakeTensorMode has the methods overridden here, with the same parameters, and the key
    class."""
    expected = {
        "_cache_key": ["self", "state", "func", "args", "kwargs"],
        "_cached_dispatch_impl": ["self", "func", "types", "args", "kwargs"],
        "_get_output_tensor_from_cache_entry": ["self", "state", "entry", "key", "func", "args"],
        "_dispatch_impl": ["self", "func", "types", "args", "kwargs"],
        "wrap_meta_outputs_with_default_device_logic": ["self", "r", "func", "flat_args", "device"],
        "dispatch": ["self", "func", "types", "args", "kwargs"],
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
