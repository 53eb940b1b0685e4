"""Each axis is declared once (config/grid.py: KEY_AXES): Point, the sweep's lists and explicit points follow the
declaration, and the keys derived from it (the traced step, the optimizer's trace, the prepared short model, the built
model) change with exactly the axes declared to shape them, a new axis included."""

from __future__ import annotations

import dataclasses
import typing
from types import GenericAlias
from typing import Any, Literal

import pytest
from pydantic import TypeAdapter

from ckptbench.config import grid
from ckptbench.config.axes import WEIGHT_DTYPE
from ckptbench.config.compat import TORCH_OPTIMIZERS, cuda_need
from ckptbench.config.grid import _ORDER, AXES, AXIS_DEFAULTS, KEY_AXES, Axis, NeedsCuda, Point, as_is, model_setup
from ckptbench.config.sweep_axes import PointSpec, SweepAxes
from ckptbench.estimator.estimator import _optim_key, _shape_key
from ckptbench.estimator.trace import _reuse_key, trace_optimizer, trace_step
from ckptbench.train.optimizers import _TORCH
from ckptbench.train.step import param_dtype
from ckptbench.train.unavailable import TechniqueUnavailable
from tests.conftest import tiny_config

# Every axis at plain training (technique axes), on a small cell.
BASE = Point("fp32", "none", "none", 32, 2, "tiny", "adamw_fused")
# Values of the axes whose values are written in a grammar (no Literal to pick another from): valid, and not BASE's.
EXAMPLES: dict[str, Any] = {
    "model": "other", "architecture": "qwen3", "layout": "all", "lora": "r8", "parallel": "fsdp2:2",
    "allocator": "expandable_segments",
}


def other_value(axis: Axis, point: Point = BASE) -> Any:
    """A valid value of ``axis`` other than the point's: an example, another choice, the other bool, one more."""
    base = getattr(point, axis.name)
    if axis.name in EXAMPLES:
        return EXAMPLES[axis.name]
    if typing.get_origin(axis.values) is Literal:
        return next(v for v in typing.get_args(axis.values) if v != base)
    if axis.kind is bool:
        return not base
    if axis.kind in (int, float):
        return base + 1 if axis.kind is int else base + 0.5
    pytest.fail(f"{axis.name}: add a valid value other than {base!r} to EXAMPLES")


def changed(axis: Axis, base: Point = BASE) -> Point:
    """``base`` with only ``axis`` changed."""
    return dataclasses.replace(base, **{axis.name: other_value(axis, base)})


REUSE_CFG = tiny_config()


def _reuse(point: Point) -> tuple[Any, ...] | None:
    return _reuse_key(REUSE_CFG, point, 3, "cuda")


@pytest.mark.parametrize("axis", KEY_AXES, ids=lambda a: a.name)
def test_a_key_changes_with_exactly_the_axes_declared_to_shape_it(axis: Axis) -> None:
    """Two points that differ only in one axis have different trace keys exactly where the axis is declared to
    shape the traced step (and the same for the optimizer's trace, the prepared short model and the built model):
    an axis left out of a key would share one trace between two of its values, with wrong estimates and no error."""
    other = changed(axis)
    assert (_shape_key(other) != _shape_key(BASE)) == (axis.step is not None)
    assert (_optim_key(other) != _optim_key(BASE)) == (axis.optimizer_step is not None)
    assert (model_setup(other) != model_setup(BASE)) == axis.builds_model
    base_reuse, other_reuse = _reuse(BASE), _reuse(other)
    assert base_reuse is not None
    if axis.prepared == "plain":
        assert other_reuse is None  # prepared afresh for each trace
    else:
        assert other_reuse is not None and (other_reuse != base_reuse) == (axis.prepared == "key")


TRACE_CFG = tiny_config(model={"preset": "tiny", "overrides": {"num_hidden_layers": 2}})


@pytest.mark.parametrize("axis", [a for a in KEY_AXES if a.swept and a.name != "layout"], ids=lambda a: a.name)
def test_the_declaration_says_what_the_traced_step_depends_on(axis: Axis) -> None:
    """The truth the keys stand for: where the traced step (or the optimizer's trace) of two points that differ only in
    one axis differ, the axis is declared to shape it. An axis the trace reads but the declaration leaves out of a key
    fails here. (Declared without shaping it costs only traces. The layout is not in the key: each layer's plan is
    re-assembled from its class.)"""
    base = dataclasses.replace(BASE, model=TRACE_CFG.model.name)
    other = changed(axis, base)
    try:
        step = [trace_step(TRACE_CFG, p, target="cuda") for p in (base, other)]
        optimizer = [trace_optimizer(TRACE_CFG, p, target="cuda") for p in (base, other)]
    except (TechniqueUnavailable, ModuleNotFoundError) as exc:  # not estimated, or its package is not installed
        assert axis.step is not None and axis.optimizer_step is not None, exc  # declared: the trace is kept apart
        pytest.skip(f"{axis.name}={other_value(axis, base)} is not traced here: {exc}")
    assert step[0] == step[1] or axis.step is not None
    assert optimizer[0] == optimizer[1] or axis.optimizer_step is not None
    if axis.name in ("precision", "batch_size", "seq_len", "loss", "optimizer_in_backward", "parallel"):
        assert step[0] != step[1]  # the test sees a difference where there is one


def test_the_declared_transforms_share_a_trace_where_the_step_is_the_same() -> None:
    """The key keeps micro-batches as one or more (a short trace runs two at most); the optimizer's trace keeps a
    precision as the dtype of its weights (fp32 and the amp precisions share one), unless FSDP2 shards them."""
    two, four = (dataclasses.replace(BASE, micro_batches=n) for n in (2, 4))
    assert _shape_key(two) == _shape_key(four) != _shape_key(BASE)
    amp = dataclasses.replace(BASE, precision="amp_bf16")
    assert _optim_key(amp) == _optim_key(BASE) and _shape_key(amp) != _shape_key(BASE)
    assert _optim_key(amp)[0] == "float32 weights"  # the label of the optimizer's trace (estimator/estimator.py)
    fsdp2, fsdp2_amp = (dataclasses.replace(p, parallel="fsdp2:2") for p in (BASE, amp))
    assert _optim_key(fsdp2) != _optim_key(fsdp2_amp)
    assert _shape_key(BASE)[0] == _optim_key(fsdp2)[0] == "fp32"  # precision first: traces are grouped by the rest


# -- a new axis ---------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, order=True)
class _PointWithDropout(Point):
    synthetic_dropout: float = 0.0


DROPOUT = Axis("synthetic_dropout", float, 0.0, values=float, loop=115, step=as_is, prepared="plain",
               builds_model=True, needs_cuda=NeedsCuda(lambda v: v > 0.5, "is a test's and needs CUDA"),
               doc="A test's axis.")


def test_a_new_axis_reaches_every_key_it_is_declared_to_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """An axis added to the declaration alone is in the point's key, the traced step's key, the built model's setup,
    the prepared model's reuse test and the CPU refusals; not in the optimizer's trace, which it is not declared to
    shape."""
    without = (_shape_key(BASE), _optim_key(BASE), model_setup(BASE), _reuse(BASE))
    monkeypatch.setattr(grid, "KEY_AXES", (*KEY_AXES, DROPOUT))
    base = _PointWithDropout(*dataclasses.astuple(BASE))
    other = dataclasses.replace(base, synthetic_dropout=0.1)
    assert list(other.key)[-1] == "synthetic_dropout" and other.key["synthetic_dropout"] == 0.1
    assert len(_shape_key(base)) == len(without[0]) + 1 and _shape_key(other) != _shape_key(base)
    assert (_shape_key(base)[-4], _shape_key(other)[-4]) == (0.0, 0.1)  # in the loop order: before parallel, seq, batch
    assert _optim_key(other) == _optim_key(base) == without[1]
    assert model_setup(other) != model_setup(base) and len(model_setup(base)) == len(without[2]) + 1
    assert _reuse(base) == without[3] and _reuse(other) is None
    assert cuda_need("synthetic_dropout", 0.9) == "0.9 is a test's and needs CUDA"
    assert cuda_need("synthetic_dropout", 0.1) is None


# -- Point, the sweep's lists and explicit points follow the declaration ------------------------------------------


def test_every_axis_is_in_the_point_key() -> None:
    """The key holds every sweep axis, the model and its architecture, and points that differ in any one of them
    differ in key."""
    (base,) = tiny_config().points_list()
    assert set(base.key) == set(SweepAxes.model_fields) | {"model", "architecture"} == {a.name for a in KEY_AXES}
    for axis in KEY_AXES:
        other = changed(axis, base)
        assert other.key == {**base.key, axis.name: other_value(axis, base)}, axis.name
        assert other.key_id != base.key_id, axis.name
    cfg = tiny_config(sweep={"layout": ["none"], "lora": ["none", "r8"], "micro_batches": [1, 4]})
    assert len({p.key_id for p in cfg.points_list()}) == 4


def test_point_follows_the_declaration() -> None:
    """KEY_AXES names every field of Point with its type; a field's default is the axis's plain value (a later cell
    axis's absent one); the key, the plain values and the sweep's axes follow from it in the orders tables and records
    use (an axis added later may come anywhere; the ones there keep their order)."""
    by_name = {a.name: a for a in KEY_AXES}
    point_fields = dataclasses.fields(Point)
    assert [f.name for f in point_fields if f.name not in by_name] == [] and len(point_fields) == len(KEY_AXES)
    for f in point_fields:
        axis = by_name[f.name]
        assert f.type == axis.kind.__name__, f.name
        plain = axis.plain if axis.plain is not None else axis.absent
        if plain is None:
            assert f.default is dataclasses.MISSING, f.name
        elif f.default is not dataclasses.MISSING:  # a technique axis may be positional (optimizer, lora)
            assert f.default == plain, f.name
    key = list(BASE.key)
    assert key == [a.name for a in KEY_AXES]
    assert _in_order(key, ["model", "architecture", "layout", "batch_size", "seq_len", "precision", "optimizer",
                           "micro_batches", "offload", "lora", "compile", "attn_implementation", "loss",
                           "optimizer_in_backward", "optimizer_offload", "parallel", "allocator"])
    assert list(AXIS_DEFAULTS) == [a.name for a in KEY_AXES if a.plain is not None]
    assert BASE.architecture == "llama"  # keys written before the axis existed: LLaMA
    assert AXIS_DEFAULTS["optimizer"] == "adamw_fused" and AXIS_DEFAULTS["lora"] == "none"
    assert tuple(f.name for f in point_fields if by_name[f.name].swept) == AXES
    assert _in_order(list(AXES), ["precision", "lora", "layout", "seq_len", "batch_size", "optimizer", "micro_batches",
                                  "offload", "compile", "attn_implementation", "loss", "optimizer_in_backward",
                                  "optimizer_offload", "parallel", "allocator"])
    assert sorted(_ORDER) == sorted(AXES)  # the execution order nests every swept axis once
    assert len({a.loop for a in KEY_AXES if a.swept}) == len(AXES)
    assert _in_order(list(_ORDER), ["precision", "lora", "allocator", "optimizer", "optimizer_offload",
                                    "optimizer_in_backward", "loss", "micro_batches", "offload", "compile",
                                    "attn_implementation", "parallel", "layout", "seq_len", "batch_size"])


def _in_order(names: list[str], expected: list[str]) -> bool:
    """``expected`` all in ``names``, in that order."""
    return [n for n in names if n in expected] == expected


@pytest.mark.parametrize("axis", [a for a in KEY_AXES if a.swept], ids=lambda a: a.name)
def test_the_sweeps_lists_and_explicit_points_follow_the_declaration(axis: Axis) -> None:
    """SweepAxes lists values of the declared type (a search's value, or none to fall back, where declared), unset:
    the declared default; PointSpec holds one or None; both apply the axis's grammar; every swept axis says what it
    means; the other values the tests use are valid."""
    field = SweepAxes.model_fields[axis.name]
    listed: Any = GenericAlias(list, axis.values)  # list[axis.values]
    if axis.search is not None and not isinstance(axis.search, axis.kind):  # batch 'max' stands for the whole list
        listed = listed | Literal[axis.search]
    if axis.fallback is not None:
        listed = listed | None
    assert field.annotation == listed
    assert SweepAxes().model_dump()[axis.name] == (None if axis.fallback else [axis.sweep_default])
    assert field.description == axis.doc != ""
    assert PointSpec.model_fields[axis.name].annotation == axis.values | None
    value = other_value(axis)
    assert TypeAdapter(axis.values).validate_python(value) == value
    assert axis.check is None or axis.check(value) == value
    assert axis.check is None or PointSpec.model_validate({axis.name: value}).model_dump()[axis.name] == value


def test_the_config_says_where_an_unlisted_axis_comes_from() -> None:
    """An axis the sweep does not list takes the config's setting it falls back to; a search is no point's value."""
    sweep = {"layout": ["none"], "seq_len": [32], "precision": ["fp32"]}
    found = tiny_config(optimizer="sgd", memory_cap_gib=1, sweep={**sweep, "batch_size": "max"}).axis_values()
    assert found["optimizer"] == ["sgd"] and found["attn_implementation"] == ["sdpa"]  # the config's own settings
    assert found["batch_size"] == [] and list(found) == list(AXES)
    fit = tiny_config(memory_cap_gib=1, sweep={**sweep, "layout": ["fit", "all"], "batch_size": [2]}).axis_values()
    assert fit["layout"] == ["all"] and fit["batch_size"] == [2]


def test_the_config_and_the_training_code_agree() -> None:
    """The weights' dtype the optimizer's key folds a precision into is the one train/step.py builds the model in;
    the optimizers config/compat.py lets torchao offload are those train/optimizers.py builds from torch."""
    assert {p: str(param_dtype(p)).removeprefix("torch.") for p in WEIGHT_DTYPE} == WEIGHT_DTYPE
    assert set(WEIGHT_DTYPE) == set(typing.get_args(grid.axis_named("precision").values))
    assert set(TORCH_OPTIMIZERS) == set(_TORCH)
