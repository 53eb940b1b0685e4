"""The estimator's fake-tensor mode (estimator/fake_mode.py): its dispatch-cache key tells calls apart exactly as
PyTorch's own key does and falls back to it for what it does not describe, its uncached `_unsafe_view` and its direct
view ops give what PyTorch's path gives, and a step traces identically."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, _CacheKeyState

from ckptbench.estimator import fake_mode as fm
from ckptbench.estimator import op_costs
from ckptbench.estimator import trace as trace_module
from ckptbench.estimator.events import ALLOC
from ckptbench.estimator.trace import trace_step
from tests.conftest import tiny_config

pytestmark = pytest.mark.skipif(not fm.FAST_KEY, reason="this PyTorch's FakeTensorMode has no overridable cache key")

aten = torch.ops.aten


def _calls(mode: FakeTensorMode) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    """Calls whose tensors differ from the first in one field of PyTorch's TensorMetadata each (and some alike)."""
    with mode:
        base = torch.empty(4, 6)
        grad = torch.empty(4, 6, requires_grad=True)
        wide = torch.empty(4, 8)[:, :6]  # same sizes, other strides, a larger storage
        offset = torch.empty(5, 6)[1:]  # same sizes and strides, storage offset 6
        bigger = torch.empty(5, 6)[:4]  # same sizes, strides and offset: a larger storage
        half = torch.empty(4, 6, dtype=torch.bfloat16)
        transposed = torch.empty(6, 4).t()
        channels = torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last)
        plain4d = torch.empty(2, 3, 4, 5)
        complex_ = torch.empty(4, 6, dtype=torch.complex64)
        conj = complex_.conj()
        neg = torch._neg_view(complex_)
        also_base = torch.empty(4, 6)  # another tensor with the same metadata as ``base``
    with torch.inference_mode(), mode:
        inference = torch.empty(4, 6)
    other = FakeTensorMode()
    with other:
        foreign = torch.empty(4, 6)  # another mode's tensor: PyTorch refuses to cache it
    tensors = [base, grad, wide, offset, bigger, half, transposed, also_base, inference, foreign]
    calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []
    for t in tensors:
        calls.append((aten.add.Tensor, (t, t), {}))
        calls.append((aten.mul.Scalar, (t, 2), {}))
        calls.append((aten.mul.Scalar, (t, 2.0), {}))  # 2 and 2.0 hash alike
        calls.append((aten.sum.dim_IntList, (t, [1], True), {}))
        calls.append((aten.sum.dim_IntList, (t, [1], False), {}))
        calls.append((aten.sum.dim_IntList, (t, [0], False), {"dtype": torch.float64}))
        calls.append((aten.sum.dim_IntList, (t, (0,), False), {"dtype": torch.float64}))  # a tuple, not a list
    for t in (channels, plain4d):
        calls.append((aten.relu.default, (t,), {}))
    for t in (complex_, conj, neg):
        calls.append((aten.add.Tensor, (t, t), {}))
    calls.append((aten.add.Tensor, (base, grad), {"alpha": 2}))
    calls.append((aten.add.Tensor, (base, grad), {"alpha": 2.0}))
    calls.append((aten.empty.memory_format, ([4, 6],), {"dtype": torch.float32, "device": torch.device("cpu")}))
    calls.append((aten.empty.memory_format, ([4, 6],), {"dtype": torch.bfloat16, "device": torch.device("cpu")}))
    calls.append((aten.empty.memory_format, ([4, 6],), {"dtype": torch.float32, "device": torch.device("meta")}))
    return calls


def _key(mode: FakeTensorMode, make: Any, call: tuple[Any, tuple[Any, ...], dict[str, Any]]) -> Any:
    func, args, kwargs = call
    try:
        return make(mode, _CacheKeyState(None), func, args, kwargs)
    except Exception as exc:  # PyTorch's _BypassDispatchCache: this call is not cached
        return ("not cached", type(exc).__name__, id(call))


def test_the_fast_key_tells_calls_apart_exactly_as_pytorchs_key_does() -> None:
    mode = fm.FastKeyFakeTensorMode()
    calls = _calls(mode)
    fast = [_key(mode, fm.FastKeyFakeTensorMode._cache_key, c) for c in calls]
    slow = [_key(mode, FakeTensorMode._cache_key, c) for c in calls]
    assert sum(k[0] is fm._MARK for k in (f.key for f in fast if not isinstance(f, tuple))) >= len(calls) - 10
    for i, j in itertools.combinations(range(len(calls)), 2):
        assert (fast[i] == fast[j]) == (slow[i] == slow[j]), (calls[i][0], i, j)
    # the calls do differ: far more distinct keys than alike ones
    assert len({f for f in fast if not isinstance(f, tuple)}) > len(calls) * 3 // 4


def test_what_the_fast_key_does_not_describe_takes_pytorchs_key() -> None:
    mode = fm.FastKeyFakeTensorMode()
    with mode:
        t = torch.empty(4, 6)
    other = FakeTensorMode()
    with other:
        foreign = torch.empty(4, 6)
    generator = torch.Generator()
    fast = fm.FastKeyFakeTensorMode._cache_key
    # an argument type not listed: PyTorch's key (it has no marker)
    made = fast(mode, _CacheKeyState(None), aten.normal_.default, (t, 0.0, 1.0), {"generator": generator})
    assert made.key[0] is not fm._MARK
    # another mode's tensor: PyTorch's key refuses to cache, as it would without this mode
    with pytest.raises(Exception, match="not our fake"):
        fast(mode, _CacheKeyState(None), aten.add.Tensor, (t, foreign), {})


def _unsafe_views(mode: FakeTensorMode) -> list[Any]:
    with mode:
        base = torch.empty(2, 3, 8)
        sliced = torch.empty(3, 3, 8, dtype=torch.bfloat16)[1:]  # a storage offset
        flat = torch.empty(6, 5)
    return [(base, [6, 8]), (sliced, [6, -1]), (flat, [2, 3, 5]), (base.view(6, 8), [48])]


def test_unsafe_view_is_pytorchs_own_result_without_its_uncached_path() -> None:
    """The output of ``_unsafe_view``: a fake tensor of the mode, on its input's storage, with the sizes, strides,
    offset, dtype and device PyTorch's own path gives."""
    results = []
    for mode in (fm.FastKeyFakeTensorMode(), FakeTensorMode()):
        made = []
        for source, size in _unsafe_views(mode):
            with mode:
                out = torch.ops.aten._unsafe_view.default(source, size)
            assert type(out) is FakeTensor and out.fake_mode is mode
            assert out.untyped_storage()._cdata == source.untyped_storage()._cdata  # no new storage: no allocation
            made.append((out.shape, out.stride(), out.storage_offset(), out.dtype, out.device, out.requires_grad,
                         out._base is None))
        results.append(made)
    assert results[0] == results[1]


def _view_calls(mode: FakeTensorMode) -> list[tuple[Any, tuple[Any, ...]]]:
    """Every view op of the direct path on inputs that differ (contiguous, with an offset, bf16, requiring grad,
    transposed)."""
    with mode:
        plain = torch.empty(4, 6, 8)
        offset = torch.empty(5, 6, 8, dtype=torch.bfloat16)[1:]
        grad = torch.empty(4, 6, 8, requires_grad=True)
        matrix = torch.empty(6, 5)
        ones = torch.empty(1, 6, 8)
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    for t in (plain, offset, grad):
        calls += [(aten.detach.default, (t,)), (aten.view.default, (t, [24, 8])), (aten.slice.Tensor, (t, 1, 1, 5)),
                  (aten.transpose.int, (t, 0, 2)), (aten.unsqueeze.default, (t, 1)),
                  (aten.permute.default, (t, [2, 0, 1])), (aten.as_strided.default, (t, [2, 3], [8, 1], 4)),
                  (aten.select.int, (t, 1, 3)),
                  (aten.alias.default, (t,)), (aten.t.default, (matrix,)), (aten.expand.default, (ones, [4, 6, 8])),
                  (aten.squeeze.dim, (ones, 0))]
    return calls


def test_view_ops_take_the_direct_path_and_give_pytorchs_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each view op of the direct path (estimator/fake_mode.py ``DIRECT_VIEWS``, every one of them on this PyTorch):
    a fake tensor of the mode on its input's storage, with the sizes, strides, offset, dtype, device and
    requires_grad PyTorch's own path gives, made without PyTorch's dispatch (its cache and its uncached path)."""
    assert frozenset(fm._VIEW_CHECKS) == fm.DIRECT_VIEWS
    results = []
    for mode in (fm.FastKeyFakeTensorMode(), FakeTensorMode()):
        calls = _view_calls(mode)
        dispatched: list[Any] = []
        original = FakeTensorMode._cached_dispatch_impl

        def noted(self: Any, func: Any, *rest: Any, seen: list[Any] = dispatched, impl: Any = original) -> Any:
            seen.append(func)
            return impl(self, func, *rest)

        monkeypatch.setattr(FakeTensorMode, "_cached_dispatch_impl", noted)
        made = []
        for func, args in calls:
            with mode:
                out = func(*args)
            assert type(out) is FakeTensor and out.fake_mode is mode
            made.append((str(func), out.shape, out.stride(), out.storage_offset(), out.dtype, out.device,
                         out.requires_grad, out.untyped_storage()._cdata == args[0].untyped_storage()._cdata))
        monkeypatch.undo()
        assert not dispatched if type(mode) is fm.FastKeyFakeTensorMode else len(dispatched) >= len(calls)
        results.append(made)
    assert results[0] == results[1] and all(same for *_, same in results[0])


def test_a_view_op_whose_check_fails_keeps_pytorchs_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check at import decides op by op: one that fails there (here, arguments its kernel refuses) is left to
    PyTorch's path, the others keep the direct one."""
    monkeypatch.setattr(fm, "_VIEW_CHECKS", {**fm._VIEW_CHECKS, aten.view.default: ([7, 7],)})
    found = fm._direct_views()
    assert aten.view.default not in found and aten.detach.default in found


def _misses(mode: FakeTensorMode, n: int) -> list[Any]:
    """Calls the cache has not seen (sizes of their own, ``n`` apart): what a trace of a new batch size makes."""
    with mode:
        a, b = torch.empty(4, n), torch.empty(n, 3, dtype=torch.bfloat16)
        c = torch.empty(2, n, 5, requires_grad=True)
    return [(aten.mm.default, (a.to(torch.bfloat16), b), {}), (aten.add.Tensor, (a, a), {"alpha": 2}),
            (aten.mul.Tensor, (c, c), {}), (aten.sum.dim_IntList, (c, [1], True), {}),
            (aten.cat.default, ([a, a], 1), {}), (aten.where.self, (a > 0, a, a), {}),
            (aten._to_copy.default, (a,), {"dtype": torch.float64})]


def test_an_op_pytorch_answers_with_its_meta_kernel_runs_it_directly_once_learnt(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Cache misses (estimator/fake_mode.py ``_dispatch_impl``): an op whose first miss PyTorch's path answered with its
    meta kernel (mm, add, mul, sum, cat, where) runs that kernel directly afterwards, the outputs those PyTorch's path
    gives; one it answers otherwise (_to_copy: a decomposition) keeps PyTorch's path; and a meta kernel that raises
    NotImplementedError leaves the call to PyTorch's path (which falls back to the op's real kernel)."""
    fast = fm.FastKeyFakeTensorMode()
    for call in _misses(fast, 5):  # the first misses: learnt
        with fast:
            call[0](*call[1], **call[2])
    assert {aten.mm.default, aten.add.Tensor, aten.mul.Tensor, aten.sum.dim_IntList} <= fm.META_BRANCH
    assert aten._to_copy.default not in fm.META_BRANCH
    taken: list[Any] = []
    original = FakeTensorMode._dispatch_impl

    def noted(self: Any, func: Any, *rest: Any) -> Any:
        taken.append(func)
        return original(self, func, *rest)

    results, paths = [], []
    for mode, n in ((fast, 7), (FakeTensorMode(), 7)):
        calls = _misses(mode, n)
        monkeypatch.setattr(FakeTensorMode, "_dispatch_impl", noted)
        made = []
        for func, args, kwargs in calls:
            with mode:
                out = func(*args, **kwargs)
            made.append((out.shape, out.stride(), out.dtype, out.device, out.requires_grad, type(out) is FakeTensor))
        monkeypatch.undo()
        results.append(made)
        paths.append(set(taken))
        taken.clear()
    assert results[0] == results[1]
    assert aten.mm.default not in paths[0] and aten._to_copy.default in paths[0] and aten.mm.default in paths[1]

    refused: list[Any] = []
    real_manager = fm.in_kernel_invocation_manager

    def refusing_once(mode: Any) -> Any:  # the direct path's kernel raises NotImplementedError, once
        if not refused:
            refused.append(mode)
            raise NotImplementedError
        return real_manager(mode)

    with fast:
        a, w = torch.empty(9, 4), torch.empty(4, 2)
    monkeypatch.setattr(fm, "in_kernel_invocation_manager", refusing_once)
    with fast:
        assert aten.mm.default(a, w).shape == (9, 2)  # a miss: the direct path refused, PyTorch's answers
    assert refused


def test_a_cache_hit_makes_the_tensor_pytorchs_own_path_makes() -> None:
    """New tensors made from a cache entry (the second call of each op hits the cache): the sizes, strides, dtype,
    device and requires_grad PyTorch's path gives, each with a storage of its own; views and in-place ops too."""
    results = []
    for mode in (fm.FastKeyFakeTensorMode(), FakeTensorMode()):
        made = []
        with mode:
            a = torch.empty(4, 6)
            b = torch.empty(6, 3, dtype=torch.bfloat16)
            for _ in range(2):
                outs = [a + a, a.t().contiguous(), a.to(torch.bfloat16) @ b, a.sum(1, keepdim=True), a[1:].view(18),
                        torch.empty_strided((3, 4), (1, 3)), a.mul_(2), torch.empty(2, 3, requires_grad=True) * 2]
                made.append([(o.shape, o.stride(), o.storage_offset(), o.dtype, o.device, o.requires_grad,
                              o.untyped_storage()._cdata == a.untyped_storage()._cdata) for o in outs])
        assert made[0] == made[1]
        results.append(made[1])
    assert results[0] == results[1]


def _bursts_sorted(events: Any) -> list[Any]:
    """Events with each run of frees in one order: frees with no allocation between them come in an order that varies
    from run to run (Python's garbage), and leave the same allocator state in any order."""
    out: list[Any] = []
    burst: list[Any] = []
    for event in events:
        if event[0] == ALLOC:
            out += sorted(burst)
            burst = []
            out.append(event)
        else:
            burst.append(event)
    return out + sorted(burst)


@pytest.mark.parametrize("precision", ["bf16", "amp_bf16"])
def test_a_step_traces_identically_under_pytorchs_own_mode(precision: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tiny_config(sweep={"layout": ["every:2"], "batch_size": [2], "seq_len": [32], "precision": [precision]})
    point = cfg.points_list()[0]
    op_costs._BY_KEY.clear()
    fast = trace_step(cfg, point, target="cuda")
    assert op_costs._BY_KEY  # the ops' costs were kept by their keys (and read back: a layer's ops repeat)
    again = trace_step(cfg, point, target="cuda")  # every op's cost from the memo
    monkeypatch.setattr(trace_module, "fake_mode", FakeTensorMode)  # no key: every op's cost worked out
    slow = trace_step(cfg, point, target="cuda")
    assert fast.events and _bursts_sorted(fast.events) == _bursts_sorted(slow.events)
    assert fast.segments == slow.segments and fast.static == slow.static
    assert fast.op_costs == again.op_costs == slow.op_costs and fast.op_costs


def test_the_op_key_is_the_cached_op_asked_for_never_a_view_or_an_op_run_to_answer_it() -> None:
    mode = fm.FastKeyFakeTensorMode()
    with mode:
        x = torch.empty(4, 6)
        assert mode.op_key(aten.empty.memory_format) is not None  # empty's own (taken: nothing is left for the next)
        x + x
        key = mode.op_key(aten.add.Tensor)
        assert key is not None and FakeTensorMode.cache.get(key) is not None
        assert mode.op_key(aten.add.Tensor) is None  # taken once
        x.view(24)  # a view answered directly: no key, and not the add's again
        assert mode.op_key(aten.view.default) is None
        x + x  # a cache hit: the same key
        assert mode.op_key(aten.add.Tensor) == key
        x + x
        assert mode.op_key(aten.mul.Tensor) is None  # asked for another op: not its key
        torch.nn.functional.silu(x)  # an op of its own, whatever it runs to answer it
        silu = mode.op_key(aten.silu.default)
        assert silu is not None and silu != key


def test_an_older_pytorch_without_the_key_gets_the_plain_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fm, "FAST_KEY", False)
    assert type(fm.fake_mode()) is FakeTensorMode
    monkeypatch.setattr(fm, "FAST_KEY", True)
    assert type(fm.fake_mode()) is fm.FastKeyFakeTensorMode


def test_a_pytorch_whose_internals_differ_gets_the_plain_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The signatures can match while the internals differ: the probe of a few ops decides, and a failing one keeps
    the traces on PyTorch's own mode instead of failing them."""
    assert fm._works()

    def broken(self: Any, *args: Any) -> Any:
        raise AttributeError("a field this PyTorch does not have")

    monkeypatch.setattr(fm.FastKeyFakeTensorMode, "_describe", broken)
    assert not fm._works()


def test_the_trace_s_dispatch_modes_run_without_dynamo_s_guard() -> None:
    """PyTorch wraps a dispatch mode's ``__torch_dispatch__`` in ``torch._disable_dynamo``: four frame-hook switches
    around every dispatch of a trace, which never compiles. The tracker and the fake mode decline it; ``unguarded``
    takes off that wrapper and no other (FakeTensorMode's call counter stays)."""
    from torch.utils._stats import count

    from ckptbench.estimator.tracker import StepTracker

    if fm._GUARD is None:
        pytest.skip("this torch wraps no dispatch mode")
    assert StepTracker.__torch_dispatch__.__code__ is not fm._GUARD
    assert fm.FastKeyFakeTensorMode.__torch_dispatch__.__code__ is not fm._GUARD
    assert FakeTensorMode.__dict__["__torch_dispatch__"].__code__ is fm._GUARD  # what PyTorch does to a mode

    def plain() -> int:
        return 1

    counted = count(plain)
    assert fm.unguarded(torch._disable_dynamo(plain)) is plain
    assert fm.unguarded(torch._disable_dynamo(counted)) is counted and fm.unguarded(counted) is counted


@pytest.mark.parametrize("unsafe", [False, True])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_new_fake_makes_what_pytorchs_constructor_makes(device: str, grad: bool, unsafe: bool) -> None:
    """``new_fake`` (a cache hit's and a direct view's tensors) against ``FakeTensor(...)``: the same type, attributes
    (the memos empty), dispatch keys (the fake device's), ``requires_grad``, metadata and data-pointer guard; and it
    takes its own path here (a CPU build of PyTorch: no accelerator), not PyTorch's constructor."""
    assert fm.FAST_NEW
    mode = FakeTensorMode()
    mode._allow_unsafe_data_ptr_access = unsafe
    where = torch.device(device)
    mine = fm.new_fake(mode, torch.empty(4, 6, device="meta", dtype=torch.bfloat16, requires_grad=grad), where)
    theirs = FakeTensor(mode, torch.empty(4, 6, device="meta", dtype=torch.bfloat16, requires_grad=grad), where)
    assert fm._same_tensor(mine, theirs)
    assert vars(mine) == vars(theirs) and mine.device == where and mine.fake_mode is mode
    with mode, torch.no_grad():  # an op on it runs under the mode (no graph: a CUDA leaf needs a CUDA build)
        out = mine * 2
    assert type(out) is FakeTensor and out.device == where and out.dtype == torch.bfloat16


def test_a_device_to_normalise_or_the_accelerator_takes_pytorchs_constructor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA device without an index (PyTorch's constructor gives it one) and a device of this process's accelerator
    (PyTorch's constructor readies the device) are left to ``FakeTensor(...)``."""
    made: list[Any] = []

    def counted(*args: Any) -> Any:
        made.append(args)
        return FakeTensor(*args)

    monkeypatch.setattr(fm, "_plain_new", counted)
    mode = FakeTensorMode()
    unindexed = fm.new_fake(mode, torch.empty(2, device="meta"), torch.device("cuda"))
    assert unindexed.device == torch.device("cuda", 0) and not made
    fm.new_fake(mode, torch.empty(2, device="meta"), torch.device("cuda", 0))
    assert len(made) == 1
    monkeypatch.setattr(fm, "_ACCELERATOR", "cuda")
    fm.new_fake(mode, torch.empty(2, device="meta"), torch.device("cuda", 0))
    assert len(made) == 1


def test_a_constructor_that_differs_keeps_pytorchs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The import-time check finds a ``_plain_new`` that would differ from this PyTorch's constructor: an attribute
    it does not set, no data-pointer guard, or the meta device's dispatch keys rather than the fake device's."""
    assert fm._plain_new_works()
    monkeypatch.setattr(fm, "_ATTRIBUTES", {k: v for k, v in (fm._ATTRIBUTES or {}).items() if k != "_item_memo"})
    assert not fm._plain_new_works()
    monkeypatch.undo()

    def made(mode: Any, elem: torch.Tensor, device: torch.device, *, guard: bool, keys: bool) -> Any:
        t = (torch.Tensor._make_subclass(FakeTensor, elem, elem.requires_grad, dispatch_device=True,
                                         device_for_backend_keys=device) if keys
             else torch.Tensor._make_subclass(FakeTensor, elem, elem.requires_grad))
        if guard and not mode._allow_unsafe_data_ptr_access:
            torch._C._set_throw_on_mutable_data_ptr(t)
        vars(t).update(fm._ATTRIBUTES or {}, _fake_device=device, fake_mode=mode)
        return t

    monkeypatch.setattr(fm, "_plain_new", lambda *a: made(*a, guard=True, keys=True))
    assert fm._plain_new_works()  # the same steps: the check passes
    monkeypatch.setattr(fm, "_plain_new", lambda *a: made(*a, guard=False, keys=True))
    assert not fm._plain_new_works()
    monkeypatch.setattr(fm, "_plain_new", lambda *a: made(*a, guard=True, keys=False))
    assert not fm._plain_new_works()
