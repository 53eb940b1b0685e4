"""The axes of a point, each declared once with what ckptbench derives from it (``KEY_AXES``); the point they make;
the grid expanded into points. Pure data.

From the declaration come: ``Point.key`` and the defaults old keys take, the loop order (``_ORDER``), the sweep's
lists and explicit points (config/sweep_axes.py), ``SweepConfig.axis_values`` and the CPU refusals
(config/schema.py), and the keys of what a point's setup shapes: the traced step and the optimizer's trace
(estimator/estimator.py), the prepared short model (estimator/trace.py) and the built model (measure/model_slot.py).
``Point``, ``SweepAxes`` and ``PointSpec`` spell their fields out for mypy; tests/test_axis_keys.py holds them to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, TypeAlias

from ckptbench.config.axes import (
    WEIGHT_DTYPE,
    AttnImpl,
    BatchSize,
    LossName,
    MicroBatches,
    Offload,
    OptimizerName,
    OptimizerOffload,
    Precision,
    SeqLen,
    allocator_value,
    layout_value,
    lora_value,
    parallel_value,
)
from ckptbench.config.parallel import parse_parallel, world_size
from ckptbench.json_object import JsonObject

# How a key keeps an axis's value: a function of the value (and, where another axis decides, the point).
KeyPart = Callable[[Any, "Point"], Any]


def as_is(value: Any, point: Point) -> Any:
    """The value itself."""
    return value


def _one_or_more(micro_batches: Any, point: Point) -> Any:
    # A short trace runs at most two micro-batches: the second stands for every later one (estimator/estimator.py).
    return min(micro_batches, 2)


def _weights_unless_fsdp2(precision: Any, point: Point) -> Any:
    # Unsharded (or DDP), a precision reaches the optimizer step only through the dtype its weights are stored in:
    # fp32 and the amp precisions (fp32 weights) share one trace. FSDP2's mixed-precision policy depends on the
    # precision itself.
    if parse_parallel(point.parallel).kind == "fsdp2":
        return precision
    return f"{WEIGHT_DTYPE[precision]} weights"


@dataclass(frozen=True)
class NeedsCuda:
    """The values of an axis only a CUDA device runs: ``applies`` says which; ``why`` follows the value in the
    refusal ('sweep.offload: all moves activations to host memory and needs a CUDA device')."""

    applies: Callable[[Any], bool]
    why: str


@dataclass(frozen=True)
class Axis:
    """One axis of a point, declared once.

    ``plain``: a technique axis's value that means plain training (None: an axis of the cell itself: model, layout,
    shape, precision). ``absent``: what a key written before the axis existed means, for a cell axis added later (a
    technique axis's is its plain value). ``loop`` None: not swept (the model's axes, one per config).
    """

    name: str
    kind: type  # the type of its values in a point and in a recorded key
    plain: Any = None
    absent: Any = None
    values: Any = None  # the type one value of a config is validated as (a Literal, a bounded int)
    check: Callable[[Any], Any] | None = None  # a grammar: the value as a point holds it, or a ValueError
    doc: str = ""  # what its sweep list means, for a config's reader
    default: Any = None  # what a sweep listing no values takes (a technique axis: ``plain``)
    fallback: str | None = None  # a sweep listing none takes the config's setting at this path instead
    search: Any = None  # a value that asks for a search instead of naming points ('fit', 'max')
    first: Any = None  # the value that runs before the others of its loop (the loss references)
    loop: int | None = None  # where it nests in the execution order: lower is outer
    step: KeyPart | None = None  # shapes the traced step (the short-model trace key), kept as this says
    optimizer_step: KeyPart | None = None  # shapes the whole model's optimizer trace
    # The fake short model the estimator prepares once for traces of several shapes: 'key': it depends on the
    # value; 'plain': one is prepared for every trace unless the value is plain (hooks, host copies, process groups).
    prepared: Literal["key", "plain"] | None = None
    builds_model: bool = False  # the runner's model is built for it (rebuilt when it changes)
    needs_cuda: NeedsCuda | None = None  # the CPU refusals

    @property
    def swept(self) -> bool:
        return self.loop is not None

    @property
    def sweep_default(self) -> Any:
        return self.plain if self.default is None else self.default


# Every axis of a point, once, in the order of ``Point.key``; ``Point``'s fields are these (tests/test_axis_keys.py
# holds them to it), in the order a positional ``Point(...)`` takes them. The loops (``loop``): precision and LoRA
# outermost (the model is rebuilt only when they change; the allocator's settings need a process of their own),
# batch innermost; sharded points (each in its own processes) after the single-device points of the same setup.
KEY_AXES: tuple[Axis, ...] = (
    Axis("model", str),
    # The model's transformers model_type ('llama', 'qwen3', ...): compare never matches points of two
    # architectures. Runs written before it existed built LLaMA only.
    Axis("architecture", str, absent="llama"),
    Axis("layout", str, values=str, check=layout_value, default="none", search="fit", first="none", loop=130,
         doc="Layout strings (see `ckptbench layouts`); 'fit' searches the fewest layers that fit the budget."),
    Axis("batch_size", int, values=BatchSize, default=1, search="max", loop=150, step=as_is,
         doc="Batch sizes, or 'max': per layout, the largest batch that fits (doubling, then bisection)."),
    Axis("seq_len", int, values=SeqLen, default=512, loop=140, step=as_is, doc="Sequence lengths."),
    Axis("precision", str, values=Precision, default="bf16", loop=10, step=as_is,
         optimizer_step=_weights_unless_fsdp2, prepared="key", builds_model=True,
         needs_cuda=NeedsCuda(lambda v: v in ("fp16", "amp_fp16"),
                              "is not supported on CPU; use bf16, amp_bf16 or fp32"),
         doc="Training precisions: bf16, fp16, fp32 weights, or fp32 weights with amp_bf16 / amp_fp16 autocast."),
    Axis("optimizer", str, "adamw_fused", values=OptimizerName, fallback="optimizer", loop=40, step=as_is,
         optimizer_step=as_is, prepared="key",
         needs_cuda=NeedsCuda(lambda v: v == "adamw_8bit_torchao", "compiles its step (torchao) and needs CUDA"),
         doc="Optimizers; unset: the config's top-level optimizer."),
    Axis("micro_batches", int, 1, values=MicroBatches, loop=80, step=_one_or_more,
         doc="Gradient accumulation: micro-batches of batch_size per optimizer step."),
    Axis("offload", str, "none", values=Offload, loop=90, step=as_is, prepared="plain",
         needs_cuda=NeedsCuda(lambda v: v != "none", "moves activations to host memory and needs a CUDA device"),
         doc="Activation offloading: 'none', 'all' (every saved tensor) or 'ckpt_inputs' (checkpointed inputs)."),
    Axis("lora", str, "none", values=str, check=lora_value, loop=20, step=as_is, optimizer_step=as_is,
         prepared="plain", builds_model=True,
         doc="'none' (full fine-tuning) or 'r<rank>' (LoRA through peft on lora.target_modules)."),
    Axis("compile", bool, False, values=bool, loop=100,
         needs_cuda=NeedsCuda(bool, "cannot run under the CPU memory tracker (a TorchDispatchMode); "
                                    "compile needs CUDA"),
         doc="torch.compile the model; compile time is recorded apart and never counted in step time."),
    Axis("attn_implementation", str, "sdpa", values=AttnImpl, fallback="model.attn_implementation", loop=110,
         step=as_is, doc="Attention implementations; unset: the model's attn_implementation."),
    Axis("loss", str, "default", values=LossName, loop=70, step=as_is,
         needs_cuda=NeedsCuda(lambda v: v == "fused_linear",
                              "runs Triton kernels (Liger, cut-cross-entropy) and needs CUDA"),
         doc="The loss head: 'default', 'chunked' (fp32 logits per chunk of tokens) or 'fused_linear' (CUDA)."),
    Axis("optimizer_in_backward", bool, False, values=bool, loop=60, step=as_is, optimizer_step=as_is,
         prepared="plain",
         doc="Per-parameter optimizer steps from post-accumulate-grad hooks: each gradient is applied and freed during "
             "the backward pass (with micro_batches > 1: during the last micro-batch's backward)."),
    Axis("optimizer_offload", str, "none", values=OptimizerOffload, loop=50, step=as_is, optimizer_step=as_is,
         prepared="plain",
         needs_cuda=NeedsCuda(lambda v: v != "none", "(torchao's CPUOffloadOptimizer) needs a CUDA device"),
         doc="Optimizer state in host memory, stepped by the CPU: 'none' or 'cpu' (torchao's CPUOffloadOptimizer)."),
    Axis("parallel", str, "none", values=str, check=parallel_value, first="none", loop=120, step=as_is,
         optimizer_step=as_is, prepared="plain", builds_model=True,
         doc="'none', 'ddp:N', 'fsdp2:N' or 'fsdp2:N:noreshard' (config/parallel.py); batch_size is per rank."),
    Axis("allocator", str, "default", values=str, check=allocator_value, loop=30,
         needs_cuda=NeedsCuda(lambda v: v != "default", "configures the CUDA caching allocator "
                                                        "(PYTORCH_CUDA_ALLOC_CONF) and needs a CUDA device"),
         doc="The CUDA caching allocator's options (PYTORCH_CUDA_ALLOC_CONF, set in the point's own process before "
             "CUDA starts): 'default', 'expandable_segments', 'max_split_size_mb:N', "
             "'garbage_collection_threshold:X' (several joined by commas). CUDA only."),
)
PointKey: TypeAlias = JsonObject
"""A point's key (``Point.key``): each axis's name and its value, the JSON object points.jsonl stores and runs are
matched on. A key read back may come from another version of ckptbench (``filled_key`` gives it the axes it lacks),
so its fields are not fixed: a JSON object, named for what it identifies."""

# Values of the technique axes that mean "plain training"; tables name only the axes that differ.
AXIS_DEFAULTS: PointKey = {a.name: a.plain for a in KEY_AXES if a.plain is not None}
# What a recorded key that lacks an axis means: the technique axes' plain values, the later cell axes' ``absent``.
KEY_FILLS: PointKey = {
    a.name: a.absent if a.absent is not None else a.plain for a in KEY_AXES if (a.absent, a.plain) != (None, None)
}


def axis_named(name: str) -> Axis:
    """The declaration of the axis ``name``."""
    return next(a for a in KEY_AXES if a.name == name)


def filled_key(key: Mapping[str, Any]) -> PointKey:
    """A recorded key naming every axis: an axis added after it was written takes its ``KEY_FILLS`` value (plain
    training; a cell axis its ``absent`` value), so older keys match newer ones."""
    return {**{k: v for k, v in KEY_FILLS.items() if k not in key}, **key}


def setup_label(key: Mapping[str, Any]) -> str:
    """The technique axes of a key that differ from plain training: 'optimizer=sgd offload=all'."""
    return " ".join(f"{k}={key[k]}" for k in AXIS_DEFAULTS if k in key and key[k] != AXIS_DEFAULTS[k])


@dataclass(frozen=True, order=True)
class Point:
    """One cell of the grid. ``key`` identifies it across runs."""

    precision: str
    lora: str
    layout: str
    seq_len: int
    batch_size: int
    model: str
    optimizer: str
    micro_batches: int = 1
    offload: str = "none"
    compile: bool = False
    attn_implementation: str = "sdpa"
    loss: str = "default"
    optimizer_in_backward: bool = False
    optimizer_offload: str = "none"
    parallel: str = "none"
    allocator: str = "default"
    architecture: str = "llama"

    @property
    def key(self) -> PointKey:
        return {a.name: getattr(self, a.name) for a in KEY_AXES}

    @property
    def key_id(self) -> str:
        """A stable string form of the key, for matching and display."""
        return key_id(self.key)

    @classmethod
    def from_key(cls, key: Mapping[str, Any]) -> Point:
        """The point a recorded key names (the inverse of ``key``)."""
        return cls(**dict(key))

    @property
    def world_size(self) -> int:
        """Ranks (devices) the point runs on: 1 unless the parallel axis spreads it."""
        return world_size(self.parallel)

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step over all ranks (every micro-batch counts; batch_size is per rank)."""
        return self.batch_size * self.seq_len * self.micro_batches * self.world_size


def point_of(key: Mapping[str, Any]) -> Point | None:
    """The point a recorded key names, or None when it is not a point of this version: a field missing
    or extra (a key edited by hand, or written by a newer ckptbench with another axis), or a wrong type."""
    kinds = {a.name: a.kind for a in KEY_AXES}
    if set(key) != set(kinds) or any(type(key[name]) is not kind for name, kind in kinds.items()):
        return None
    return Point(**dict(key))


def key_id(key: Mapping[str, Any]) -> str:
    """Stable text of a key dict: 'batch_size=2|layout=all|...' (sorted by field)."""
    return "|".join(f"{k}={key[k]}" for k in sorted(key))


def key_without(point: Point, field_name: str) -> tuple[Any, ...]:
    """A point's key without one field: it groups the points that differ only in that field
    (batch size: skips after an OOM; layout: the layouts whose losses must match)."""
    return tuple(sorted((k, v) for k, v in point.key.items() if k != field_name))


# The execution order, outer to inner (each swept axis's ``loop``).
_ORDER = tuple(a.name for a in sorted((a for a in KEY_AXES if a.swept), key=lambda a: a.loop or 0))
# The axes a config's sweep lists values for (every axis but the model's), in ``Point``'s field order.
AXES = tuple(f.name for f in fields(Point) if f.name in _ORDER)


def _in_loop_order(axes: Sequence[Axis]) -> list[Axis]:
    return sorted((a for a in axes if a.swept), key=lambda a: a.loop or 0)


@dataclass(frozen=True)
class _LoopAxes:
    """The swept axes of a declaration in the loop order, and those each key below reads, worked out once per
    declaration (the estimator asks for a point's keys tens of thousands of times a question)."""

    declared: tuple[Axis, ...]
    ordered: tuple[Axis, ...]
    step: tuple[tuple[str, Callable[[Any, Any], Any]], ...]
    optimizer_step: tuple[tuple[str, Callable[[Any, Any], Any]], ...]
    plain_prepared: tuple[tuple[str, Any], ...]
    key_prepared: tuple[str, ...]

    @classmethod
    def of(cls, declared: tuple[Axis, ...]) -> _LoopAxes:
        ordered = tuple(_in_loop_order(declared))
        return cls(
            declared, ordered,
            step=tuple((a.name, a.step) for a in ordered if a.step is not None),
            optimizer_step=tuple((a.name, a.optimizer_step) for a in ordered if a.optimizer_step is not None),
            plain_prepared=tuple((a.name, a.plain) for a in ordered if a.prepared == "plain"),
            key_prepared=tuple(a.name for a in ordered if a.prepared == "key"),
        )


_loop_axes: list[_LoopAxes] = []


def _loop() -> _LoopAxes:
    """``_LoopAxes`` of ``KEY_AXES`` as it is now (made again where it was replaced: a test's new axis)."""
    if not _loop_axes or _loop_axes[0].declared is not KEY_AXES:
        _loop_axes[:] = [_LoopAxes.of(KEY_AXES)]
    return _loop_axes[0]


def step_key(point: Point) -> tuple[Any, ...]:
    """What a traced step depends on besides its layout: every axis declared ``step``, in the loop order (precision
    first), each as its declaration keeps it."""
    return tuple(step(getattr(point, name), point) for name, step in _loop().step)


def optimizer_step_key(point: Point) -> tuple[Any, ...]:
    """What the whole model's optimizer trace depends on: every axis declared ``optimizer_step``, in the loop order
    (precision first), each as its declaration keeps it."""
    return tuple(keep(getattr(point, name), point) for name, keep in _loop().optimizer_step)


def prepared_key(point: Point) -> tuple[Any, ...] | None:
    """The values a prepared short model depends on (the axes declared ``prepared='key'``, in the loop order), or None
    where one is prepared for each trace (an axis declared ``prepared='plain'`` is not at its plain value)."""
    axes = _loop()
    if any(getattr(point, name) != plain for name, plain in axes.plain_prepared):
        return None
    return tuple(getattr(point, name) for name in axes.key_prepared)


def model_setup(point: Point) -> tuple[Any, ...]:
    """What the runner's built model depends on (the axes declared ``builds_model``, in the loop order): a point of
    another setup needs another model."""
    return tuple(getattr(point, a.name) for a in _loop().ordered if a.builds_model)


def search_templates(
    model: str, values: Mapping[str, Sequence[Any]], kind: str, *, architecture: str = "llama"
) -> list[tuple[str, Point]]:
    """(kind, template point) for every searched cell; the searched axis holds a placeholder
    (batch 1 for 'batch_max', layout 'none' for 'layout_fit')."""
    values = dict(values)
    if kind == "batch_max":
        values["batch_size"] = [1]
    else:
        values["layout"] = ["none"]
    cells = itertools.product(*(values[a] for a in AXES))
    return [(kind, Point(model=model, architecture=architecture, **dict(zip(AXES, c, strict=True)))) for c in cells]


def expand(
    model: str,
    values: Mapping[str, Sequence[Any]],
    explicit: Sequence[Mapping[str, Any]] = (),
    *,
    replace_grid: bool = False,
    architecture: str = "llama",
) -> list[Point]:
    """Grid (unless replaced) plus explicit points, de-duplicated, ordered for model reuse.

    An explicit point's unset (None) fields take the first value of their axis. Precision and LoRA
    are the outer loops (the model is rebuilt only when they change), 'none' runs first among
    layouts (its losses are the reference), and batch size is the innermost loop, ascending, so a
    layout that runs out of memory can skip larger batches.
    """
    cells: set[tuple[Any, ...]] = set()
    if not replace_grid:
        cells.update(itertools.product(*(values[a] for a in AXES)))
    for given in explicit:
        cells.add(tuple(given[a] if given.get(a) is not None else values[a][0] for a in AXES))
    rank = {a: {v: i for i, v in enumerate(values[a])} for a in AXES}
    for axis in KEY_AXES:  # 'none' layouts, unsharded points first: they are the loss references of the others
        if axis.first is not None and axis.name in rank:
            rank[axis.name][axis.first] = -1

    def sort_key(cell: tuple[Any, ...]) -> tuple[Any, ...]:
        by_axis = dict(zip(AXES, cell, strict=True))
        return tuple((rank[a].get(by_axis[a], len(rank[a])), str(by_axis[a])) for a in _ORDER)

    return [Point(model=model, architecture=architecture, **dict(zip(AXES, c, strict=True)))
            for c in sorted(cells, key=sort_key)]
