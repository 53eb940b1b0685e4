"""Run ckptbench's own training step for a point under fake tensors and return its memory trace.

The model is transformers' ``LlamaForCausalLM`` from ``train.model.build_model`` (with
``apply_lora`` for LoRA points), checkpointed by ``train.checkpointing.applied``, switched by
``train.model.attention``, stepped by ``train.step.Trainer`` with the optimizer from
``train.optimizers.make_optimizer``: the code a sweep runs (set up as ``Runner._measure`` does), on
FakeTensors (no memory, no arithmetic). A new layout, model or precision needs no code here.

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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimate.device_model import kernel_model
from ckptbench.estimate.fake_patches import EmulatedHostOffload, eager_transformers, swappable_fake_parameters
from ckptbench.estimate.segments import SegmentMarks
from ckptbench.estimate.tracker import (
    GRADS,
    LOGITS_LOSS,
    OPTIMIZER_STATE,
    OTHER,
    PARAMS,
    TRANSIENT,
    Segment,
    StepTracker,
    Vector,
)
from ckptbench.train.checkpointing import applied
from ckptbench.train.losses import loss_head
from ckptbench.train.model import apply_lora, attention, build_model, decoder_layers
from ckptbench.train.optimizers import build_optimizer
from ckptbench.train.step import Trainer, param_dtype
from ckptbench.train.unavailable import TechniqueUnavailable

_CPU = torch.device("cpu")


@dataclass(frozen=True)
class StepTrace:
    """The segments of one traced training step (see the module docstring for their labels)."""

    segments: tuple[Segment, ...]
    static: Vector  # live bytes of the model, its optimizer state (and kept gradients) and workspaces
    releases: tuple[tuple[str, Vector, str], ...] = ()  # deferred frees (StepTracker.share)
    crossings: tuple[tuple[tuple[str, str], Vector], ...] = ()  # StepTracker.crossings
    input_frees: tuple[tuple[int, tuple[str, Vector]], ...] = ()  # StepTracker.input_frees

    def get(self, label: str) -> Segment:
        for seg in self.segments:
            if seg.label == label:
                return seg
        raise KeyError(label)

    @property
    def start(self) -> Vector:
        return self.segments[0].start


def _build(cfg: SweepConfig, point: Point, num_layers: int | None, mode: FakeTensorMode) -> Any:
    spec = cfg.model
    if num_layers is not None:
        spec = spec.model_copy(update={"overrides": {**spec.overrides, "num_hidden_layers": num_layers}})
    model: Any = build_model(spec, device=_CPU, dtype=param_dtype(point.precision), seed=cfg.seed)
    if point.lora != "none":
        with swappable_fake_parameters(mode):
            model = apply_lora(model, rank=int(point.lora[1:]), spec=cfg.lora)
    return model


def _prepare(
    cfg: SweepConfig, point: Point, tracker: StepTracker, num_layers: int | None, mode: FakeTensorMode
) -> tuple[Any, list[torch.nn.Parameter], torch.optim.Optimizer]:
    """Build the fake model and its optimizer state (as after warm-up) and count them."""
    model = _build(cfg, point, num_layers, mode)
    params = [p for p in model.parameters() if p.requires_grad]
    tracker.adopt(model.parameters(), PARAMS)
    tracker.adopt(model.buffers(), OTHER)
    if tracker.kernels.persistent_bytes:
        tracker.reserve(tracker.kernels.persistent_bytes, OTHER)
    opt = build_optimizer(point, params, lr=cfg.lr, zero_grad_to_none=cfg.zero_grad_to_none)
    with tracker:
        for p in params:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=cfg.zero_grad_to_none)
    tracker.adopt([t for s in opt.state.values() for t in s.values() if isinstance(t, torch.Tensor)], OPTIMIZER_STATE)
    tracker.adopt([p.grad for p in params if p.grad is not None], GRADS)
    for t in tracker.kernels.host_resident(opt):
        tracker.forget(t)
    return model, params, opt


def trace_step(
    cfg: SweepConfig,
    point: Point,
    *,
    target: str,
    plans: Sequence[LayoutPlan] | None = None,
    num_layers: int | None = None,
    micro_batches: int | None = None,
    defer_shared: bool = False,
) -> StepTrace:
    """Trace one measured step of ``point`` (optionally on a model of ``num_layers`` with ``plans``).

    ``defer_shared`` keeps the tensors all decoder layers receive until layer 0's backward ends
    (see ``StepTracker.share``), as the fast path needs.
    """
    if point.offload != "none" and target != "cuda":
        raise ConfigError(f"offload={point.offload}: activation offloading can only be estimated for a CUDA target")
    _check_estimable(point)
    tracker = StepTracker(kernel_model(target), defer_shared=defer_shared)
    with eager_transformers(), FakeTensorMode() as mode, contextlib.ExitStack() as stack:
        model, params, opt = _prepare(cfg, point, tracker, num_layers, mode)
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
            zero_grad_to_none=cfg.zero_grad_to_none, offload=offload,
        )
        with SegmentMarks(tracker, model).installed(opt, params), tracker:
            tracker.tag = LOGITS_LOSS
            tracker.mark("start")
            loss = trainer.step(batch)
            tracker.mark("end")
        del loss
    return _result(tracker, static)


def _result(tracker: StepTracker, static: Vector) -> StepTrace:
    return StepTrace(
        segments=tuple(tracker.segments),
        static=static,
        releases=tuple(tracker.releases),
        crossings=tuple(tracker.crossings.items()),
        input_frees=tuple(sorted(tracker.input_frees.items())),
    )


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


def trace_optimizer(cfg: SweepConfig, point: Point, *, target: str) -> StepTrace:
    """Trace the whole model's optimizer step and zero_grad (every gradient present), without forward.

    With the optimizer in backward the step after backward finds no gradient (each was applied and
    freed by its hook during the backward, which ``trace_step`` traces): no gradient is made here.
    """
    _check_optimizer_estimable(point)
    tracker = StepTracker(kernel_model(target))
    with FakeTensorMode() as mode:
        _model, params, opt = _prepare(cfg, point, tracker, None, mode)
        static = tuple(tracker.by_cat)
        with tracker:
            tracker.tag = GRADS
            tracker.mark("grads")
            for p in params if not point.optimizer_in_backward else []:
                p.grad = torch.zeros_like(p)
            tracker.tag = TRANSIENT
            tracker.mark("opt")
            opt.step()
            tracker.mark("zero")
            opt.zero_grad(set_to_none=cfg.zero_grad_to_none)
            tracker.mark("end")
    return _result(tracker, static)
