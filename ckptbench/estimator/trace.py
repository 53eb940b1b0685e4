"""Run ckptbench's own training step for a point under fake tensors and return its memory trace (with what a step
on fake tensors needs to behave like the real one, and the fake process group a sharded point's rank is traced on).

The model is the family's transformers causal LM from ``train.model.build_model`` (with
``apply_lora`` for LoRA points), checkpointed by ``train.checkpointing.applied``, switched by
``train.model.attention``, sharded by ``train.parallel.shard``, stepped by ``train.step.Trainer`` with
the optimizer from ``train.optimizers.build_optimizer``: the code a sweep runs (set up as
``Runner._measure`` does), on FakeTensors (no memory, no arithmetic). A new layout, model or
precision needs no code here.

One measured step is traced after the optimizer state exists (a sweep's warm-up creates it; here
one optimizer step on zero gradients does, which leaves the same state). Hooks cut the step into
segments, in execution order (``k`` is the micro-batch)::

    start          the step's loss accumulator
    pre@k          embedding, rotary tables (until decoder layer 0 starts)
    fwd:i@k        decoder layer i forward
    head@k         final norm (until the decoder stack returns and its locals are freed)
    logits@k       lm_head and loss (until the model's forward returns)
    exit@k         frees as the forward's scopes close (autocast's cast weights, logits)
    back@k         backward of loss, lm_head and final norm (until layer L-1's output has its grad)
    bwd:i@k        decoder layer i backward, recomputation included (from L-1 down to 0)
    tail@k         embedding backward (until the next micro-batch or the optimizer starts)
    opt            optimizer step
    zero           zero_grad and the end of the step
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import masking_utils

from ckptbench.config.grid import Point, prepared_key
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.parallel import parse_parallel
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimator import optim_8bit
from ckptbench.estimator.device_model import kernel_model
from ckptbench.estimator.fake_mode import fake_mode
from ckptbench.estimator.segments import SegmentMarks
from ckptbench.estimator.step_trace import (
    GRADS,
    LOGITS_LOSS,
    OPTIMIZER_STATE,
    OTHER,
    PARAMS,
    TRANSIENT,
    StepTrace,
    Vector,
)
from ckptbench.estimator.tracker import StepTracker
from ckptbench.train.checkpointing import applied
from ckptbench.train.losses import loss_head
from ckptbench.train.model import apply_lora, attention, build_model, decoder_layers
from ckptbench.train.offload import HostOffload
from ckptbench.train.optimizers import build_optimizer
from ckptbench.train.parallel import Sharded, device_mesh, shard
from ckptbench.train.step import Trainer, param_dtype
from ckptbench.train.unavailable import TechniqueUnavailable

_CPU = torch.device("cpu")


def _build(cfg: SweepConfig, point: Point, num_layers: int | None, mode: FakeTensorMode) -> Any:
    spec = cfg.model
    if num_layers is not None:
        spec = spec.model_copy(update={"overrides": {**spec.overrides, "num_hidden_layers": num_layers}})
    # (no weights re-initialised: a fake tensor holds no values, and a trace reads none)
    model: Any = build_model(spec, device=_CPU, dtype=param_dtype(point.precision), seed=cfg.seed, reset=False)
    if point.lora != "none":
        with swappable_fake_parameters(mode):
            model = apply_lora(model, rank=int(point.lora[1:]), spec=cfg.lora)
    return model


def _prepare(
    cfg: SweepConfig, point: Point, tracker: StepTracker, num_layers: int | None, mode: FakeTensorMode, mesh: Any,
    *, with_state: bool = True,
) -> tuple[Any, Sharded, list[torch.nn.Parameter], torch.optim.Optimizer]:
    """Build (and shard) the fake model and its optimizer state (as after warm-up; ``with_state=False``: the optimizer
    without its state, which its first step makes) and count them."""
    model = _build(cfg, point, num_layers, mode)
    tracker.adopt(model.parameters(), PARAMS)
    tracker.adopt(model.buffers(), OTHER)
    with tracker:  # as Runner._model does under the CPU tracker: new shards, DDP's buckets (other)
        sharded = shard(model, point.parallel, precision=point.precision, device=_CPU, mesh=mesh)
    tracker.adopt(model.parameters(), PARAMS)  # FSDP2's sharded parameters
    complete_fake_buckets(sharded)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = build_optimizer(point, params, lr=cfg.lr, zero_grad_to_none=cfg.zero_grad_to_none)
    if with_state:
        with tracker:
            for p in params:
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=cfg.zero_grad_to_none)
        _adopt_state(tracker, params, opt)
    return model, sharded, params, opt


def _adopt_state(tracker: StepTracker, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer) -> None:
    """Count the optimizer state and the kept gradients as such (host-resident state not: it is not device memory;
    nor 8-bit AdamW's quantisation maps where no counter sees them: estimator/optim_8bit.py)."""
    state = [t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    for t in optim_8bit.uncounted(state):
        tracker.forget(t)
    tracker.adopt(state, OPTIMIZER_STATE)
    tracker.adopt([p.grad for p in params if p.grad is not None], GRADS)
    for t in tracker.kernels.host_resident(opt):
        tracker.forget(t)


@dataclass
class _Prepared:
    """A fake model and its optimizer state as ``_prepare`` leaves them, with the fake mode they belong to."""

    mode: FakeTensorMode
    model: Any
    sharded: Sharded
    params: list[torch.nn.Parameter]
    opt: torch.optim.Optimizer


Prepared = dict[tuple[Any, ...], _Prepared]  # trace_step's ``reuse``: prepared short models, by what they depend on
_PREPARED_KEPT = 8  # the last few are kept


def _reuse_key(cfg: SweepConfig, point: Point, num_layers: int | None, target: str) -> tuple[Any, ...] | None:
    """What a prepared short model depends on, or None where one is prepared for each trace: the axes config/grid.py
    declares ``prepared`` (sharded points: their process group is the trace's; LoRA: peft swaps fake parameters;
    optimizers in the backward or offloaded: hooks, host copies; activation offloading)."""
    axes = prepared_key(point)
    if num_layers is None or axes is None:
        return None
    return (cfg.model.model_dump_json(), cfg.seed, cfg.lr, cfg.zero_grad_to_none, num_layers, *axes, target)


def _adopt_prepared(tracker: StepTracker, prepared: _Prepared) -> None:
    """Count a prepared model as ``_prepare`` counts the one it makes (its parameters, buffers, optimizer state and
    kept gradients; host-resident state not)."""
    tracker.adopt(prepared.model.parameters(), PARAMS)
    tracker.adopt(prepared.model.buffers(), OTHER)
    _adopt_state(tracker, prepared.params, prepared.opt)


def trace_step(
    cfg: SweepConfig,
    point: Point,
    *,
    target: str,
    plans: Sequence[LayoutPlan] | None = None,
    num_layers: int | None = None,
    micro_batches: int | None = None,
    defer_shared: bool = False,
    rank: int = 0,
    reuse: Prepared | None = None,
) -> StepTrace:
    """Trace one measured step of ``point`` (optionally on a model of ``num_layers`` with ``plans``).

    ``defer_shared`` keeps the tensors all decoder layers receive until layer 0's backward ends
    (see ``StepTracker.share``), as the fast path needs. ``reuse`` keeps the short models this trace prepares for
    the next traces given it (the traces of other batch sizes and sequence lengths): preparing one (building it,
    its optimizer state) is a fifth of a short model's trace, and a traced step leaves the model and its optimizer
    state as it found them (the optimizer steps in place, zero_grad leaves the gradients as after preparing, every
    wrapper is undone), so the traces are those of freshly prepared models.
    """
    if point.offload != "none" and target != "cuda":
        raise ConfigError(f"offload={point.offload}: activation offloading can only be estimated for a CUDA target")
    _check_estimable(point)
    tracker = StepTracker(kernel_model(target), defer_shared=defer_shared)
    key = _reuse_key(cfg, point, num_layers, target) if reuse is not None else None
    prepared = reuse.pop(key, None) if reuse is not None and key is not None else None  # out until traced
    with (
        optim_8bit.traceable(point.optimizer, target=target), fake_process_group(point.parallel, rank=rank) as mesh,
        eager_transformers(), prepared.mode if prepared is not None else fake_mode() as mode,
        contextlib.ExitStack() as stack,
    ):
        tracker.op_key = getattr(mode, "op_key", None)  # (FastKeyFakeTensorMode's; a plain mode keeps no key)
        if prepared is None:
            model, sharded, params, opt = _prepare(cfg, point, tracker, num_layers, mode, mesh)
            prepared = _Prepared(mode, model, sharded, params, opt)
        else:
            _adopt_prepared(tracker, prepared)
            model, sharded, params, opt = prepared.model, prepared.sharded, prepared.params, prepared.opt
        static = tuple(tracker.by_cat)
        if plans is None:
            plans = [parse_layout(point.layout, len(decoder_layers(model)))]
        batch = torch.zeros((point.batch_size, point.seq_len), dtype=torch.long)
        tracker.adopt([batch], OTHER)
        host = EmulatedHostOffload(tracker) if point.offload != "none" else None
        for plan in plans:
            stack.enter_context(applied(model, plan, offload_inputs=host if point.offload == "ckpt_inputs" else None))
        stack.enter_context(attention(model, point.attn_implementation))
        stack.enter_context(loss_head(model, point.loss))
        offload = host.active if host is not None and point.offload == "all" else None
        trainer = Trainer(
            model, opt, point.precision, "cpu", micro_batches=micro_batches or point.micro_batches,
            zero_grad_to_none=cfg.zero_grad_to_none, offload=offload, forward=sharded.forward,
            grad_sync=sharded.grad_sync if sharded.spec.distributed else None, use_autocast=sharded.autocast,
        )
        with SegmentMarks(tracker, model).installed(opt, params), tracker:
            tracker.tag = LOGITS_LOSS
            tracker.mark("start")
            loss = trainer.step(batch)
            tracker.mark("end")
        del loss
    if reuse is not None and key is not None:  # traced without an error: the model is as prepared again
        if len(reuse) >= _PREPARED_KEPT:
            reuse.pop(next(iter(reuse)))
        reuse[key] = prepared
    return _result(tracker, static)


def _result(tracker: StepTracker, static: Vector) -> StepTrace:
    return StepTrace(
        segments=tuple(tracker.segments),
        static=static,
        releases=tuple(tracker.releases),
        crossings=tuple(tracker.crossings.items()),
        input_frees=tuple(sorted(tracker.input_frees.items())),
        events=tuple(tracker.events.events),
        labels=tracker.labels,
        workspaces=frozenset(tracker.events.workspaces),
        release_events=tuple(tracker.release_events),
        roles=tuple(tracker.roles.items()),
        op_costs=tracker.ops.result(),
    )


def creation_order(model: Any) -> tuple[int, ...]:
    """Bytes of every parameter and buffer storage in the order building the model allocates them.

    Modules allocate their tensors as they are constructed, in registration order (named_modules);
    LoRA adapters are added after the base model (train.model.apply_lora); tied weights count once.
    """
    seen: set[int] = set()
    found: list[tuple[bool, int]] = []
    for name, module in model.named_modules():
        tensors = [*module._parameters.values(), *module._buffers.values()]
        for t in tensors:
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in seen:
                seen.add(id(t.untyped_storage()))
                found.append(("lora_" in name, t.untyped_storage().nbytes()))
    return tuple(nbytes for _, nbytes in sorted(found, key=lambda item: item[0]))


def _check_estimable(point: Point) -> None:
    """Techniques whose kernels or host-side state fake tensors cannot stand for: not estimated."""
    if point.loss == "fused_linear":
        raise TechniqueUnavailable("loss fused_linear runs Triton kernels, which are not estimated")
    _check_optimizer_estimable(point)


def _check_optimizer_estimable(point: Point) -> None:
    # Separate from the loss: the whole model's optimizer trace is shared by every loss head.
    if point.optimizer == "adamw_8bit_torchao":
        raise TechniqueUnavailable("torchao's 8-bit AdamW compiles its step, which is not estimated")
    if point.optimizer_offload != "none":
        raise TechniqueUnavailable("torchao's CPU offload optimizer is not estimated")


def trace_optimizer(
    cfg: SweepConfig, point: Point, *, target: str, rank: int = 0) -> StepTrace:
    """Trace the whole model's optimizer step and zero_grad (every gradient present), without forward.

    With the optimizer in backward the step after backward finds no gradient (each was applied and
    freed by its hook during the backward, which ``trace_step`` traces): no gradient is made here.
    First, the optimizer's first step (which creates its state) is traced: segments 'grads_first' and 'opt_first',
    for the allocator replay's first warm-up step (in backward too: its ``step()`` steps every parameter that holds a
    gradient); then, from the state it leaves (as ``_prepare`` leaves a short model's: the same step on zero
    gradients, counted alike), the later step: 'grads', 'opt', 'zero'. (Traced after a later step, with an optimizer
    of its own, the first step made the same requests: the whole model's state was made twice, a third of the trace.)
    """
    _check_optimizer_estimable(point)
    tracker = StepTracker(kernel_model(target))
    with (
        optim_8bit.traceable(point.optimizer, target=target), fake_process_group(point.parallel, rank=rank) as mesh,
        fake_mode() as mode,
    ):
        tracker.op_key = getattr(mode, "op_key", None)
        model, _sharded, params, opt = _prepare(cfg, point, tracker, None, mode, mesh, with_state=False)
        with tracker:  # under ``_prepare``'s tag, so what the step keeps is counted as there
            host = first_optimizer_step(tracker, params, opt)
            opt.zero_grad(set_to_none=cfg.zero_grad_to_none)
        _adopt_state(tracker, params, opt)
        static = tuple(tracker.by_cat)
        later_optimizer_step(tracker, params, opt, in_backward=point.optimizer_in_backward,
                             set_to_none=cfg.zero_grad_to_none)
    return replace(_result(tracker, static), build=creation_order(model), host=host)


def first_optimizer_step(tracker: StepTracker, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer
                         ) -> frozenset[int]:
    """Trace an optimizer's first step, which makes its state (the tracker counting): every gradient made
    ('grads_first'), the step ('opt_first'), until 'after_first'; the event ids of the state it keeps on the host."""
    tracker.mark("grads_first")
    for p in params:
        p.grad = torch.zeros_like(p)
    tracker.mark("opt_first")
    opt.step()
    tracker.mark("after_first")
    return frozenset(_event_id(tracker, t) for t in tracker.kernels.host_resident(opt))


def later_optimizer_step(tracker: StepTracker, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, *,
                         in_backward: bool, set_to_none: bool) -> None:
    """Trace a step of an optimizer whose state exists: every gradient made ('grads'; none for an optimizer in
    backward), the step ('opt'), zero_grad ('zero'), until 'end'."""
    with tracker:
        tracker.tag = GRADS
        tracker.mark("grads")
        for p in params if not in_backward else []:
            p.grad = torch.zeros_like(p)
        tracker.tag = TRANSIENT
        tracker.mark("opt")
        opt.step()
        tracker.mark("zero")
        opt.zero_grad(set_to_none=set_to_none)
        tracker.mark("end")


def _event_id(tracker: StepTracker, t: torch.Tensor) -> int:
    entry = tracker.storages.lookup(t)
    return entry[1][2] if entry is not None else -1


class EmulatedHostOffload(HostOffload):
    """Activation offloading as on a GPU: host copies are not device memory; unpacking copies back."""

    def __init__(self, tracker: StepTracker) -> None:
        super().__init__(pin_memory=False, copy_cpu=True, on_alloc=tracker.forget)

    def unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        return packed[1].clone()  # the host-to-device copy made for the backward that needs it


@contextlib.contextmanager
def eager_transformers() -> Iterator[None]:
    """Let transformers take the path a real step takes.

    transformers treats a FakeTensor like a graph being traced and then builds an explicit
    B x 1 x S x S causal mask that a real step never builds; with this patch it asks its
    data-dependent question (``.all()``), which the tracker answers as a real batch would.
    """
    original = masking_utils.is_tracing
    masking_utils.is_tracing = lambda tensor=None: original(None)
    try:
        yield
    finally:
        masking_utils.is_tracing = original


@contextlib.contextmanager
def swappable_fake_parameters(mode: FakeTensorMode) -> Iterator[None]:
    """Let ``Module.to()`` swap fake parameters (peft moves each new adapter to its layer's dtype).

    ``Module._apply`` swaps FakeTensor parameters with ``torch.utils.swap_tensors``, which refuses
    a tensor that has weak references, and the fake mode's converter memo holds one. The memo
    entries of the two tensors being swapped are dropped first (only real-to-fake conversions,
    which this trace never repeats, use them).
    """
    memo = mode.fake_tensor_converter.meta_converter.tensor_memo
    original = torch.utils.swap_tensors

    def swap(t1: torch.Tensor, t2: torch.Tensor) -> None:
        for key in [k for k, v in memo.items() if v is t1 or v is t2]:
            del memo[key]
        original(t1, t2)

    torch.utils.swap_tensors = swap
    try:
        yield
    finally:
        torch.utils.swap_tensors = original


@contextlib.contextmanager
def fake_process_group(parallel: str, *, rank: int = 0) -> Iterator[Any]:
    """A fake process group of the point's world size for the block, and its device mesh (None for
    'none'). The mesh is made here, before any FakeTensorMode: it reads its own (real) rank table."""
    spec = parse_parallel(parallel)
    if not spec.distributed:
        yield None
        return
    if not 0 <= rank < spec.world_size:
        raise ValueError(f"rank {rank} is not a rank of {parallel}")
    if dist.is_initialized():
        raise RuntimeError("a process group is already initialised in this process; estimate sharded points apart")
    # Importing it registers the 'fake' backend (PyTorch's own tool for tracing sharded steps in one process).
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=spec.world_size)
    try:
        with _no_parameter_check():
            yield device_mesh(parallel, torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def _no_parameter_check() -> Iterator[None]:
    """DDP's constructor checks that every rank has the same parameter shapes by reading the parameters'
    data, which fake tensors do not hold; the ranks of a fake group are one model, so skip the check."""
    import torch.nn.parallel.distributed as ddp

    original = ddp._verify_param_shape_across_processes
    ddp._verify_param_shape_across_processes = lambda *args, **kwargs: None
    try:
        yield
    finally:
        ddp._verify_param_shape_across_processes = original


def complete_fake_buckets(sharded: Sharded) -> None:
    """DDP reads its all-reduce's result from the communication future, which the fake group leaves
    empty: give DDP a hook whose future holds the bucket itself (all-reduce works in place)."""
    if sharded.spec.kind != "ddp":
        return

    def hook(_state: object, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    # DDP checks the annotations as objects; this module's are strings (postponed evaluation).
    hook.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    sharded.forward.register_comm_hook(None, hook)  # type: ignore[operator]
