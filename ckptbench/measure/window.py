"""One point's measured window with its loss check: the reference loss recomputed first when the point
needs one (once per loss cell, see measure/loss_check.py), then the window (reset, apply the plan and
techniques, warm up, measure), then the comparison."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from ckptbench.config.compat import refusal
from ckptbench.config.grid import Point
from ckptbench.config.layouts import LayoutPlan
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.live_storage import storage_tensors
from ckptbench.measure.loss_check import LossReferences, RecomputedLoss, loss_rtol
from ckptbench.measure.probes import Probe, TrackerProbe, tensor_bytes
from ckptbench.results.record import LossCheck, PointMemory, PointRecord
from ckptbench.train.checkpointing import applied
from ckptbench.train.losses import loss_head
from ckptbench.train.model import attention, reset_weights
from ckptbench.train.offload import HostOffload
from ckptbench.train.optimizers import build_optimizer
from ckptbench.train.parallel import Sharded
from ckptbench.train.step import Trainer, forward_loss, make_batch


def measure_checked(
    model: Any,
    point: Point,
    plan: LayoutPlan,
    base: PointRecord,
    *,
    losses: LossReferences,
    sharded: Sharded | None,
    cfg: SweepConfig,
    probe: Probe,
    device: torch.device,
    init_std: float,
    vocab_size: int,
) -> PointRecord:
    """Measure ``point`` on ``model`` (sharded as ``sharded`` says): ``base`` with what it measured and its
    loss check."""
    recomputed: RecomputedLoss | None = None
    parts: dict[str, float] = {}
    fresh = False
    if losses.needs_recomputed(point):  # before the window: the point's memory is not touched
        # The first step's loss depends only on the cell (initial weights, batch, precision): one
        # recomputation serves every layout of the cell (a 7B forward pass each time otherwise).
        recomputed = losses.recomputed(point)
        if recomputed is None:
            t0 = time.perf_counter()
            distributed = sharded is not None and sharded.spec.distributed
            # A sharded model's first forward creates FSDP2's lasting all-gather buffers (freed and
            # refilled by resizing later): the CPU tracker must see them made, as in any first step.
            # It is not reset: fresh, with the seed's weights (see measure_point).
            with Tracking(probe) if distributed else contextlib.nullcontext():
                recomputed = recompute_first_loss(model, point, reset=not distributed, cfg=cfg, probe=probe,
                                                  device=device, init_std=init_std, vocab_size=vocab_size)
            if sharded is not None:
                sharded.reshard()  # fsdp2:N:noreshard keeps the forward's unsharded weights otherwise
            losses.keep_recomputed(point, recomputed)
            parts["loss_recompute"] = time.perf_counter() - t0
            fresh = True  # it reset the weights, and forward passes without gradients leave them so
    result = measure_point(model, point, plan, base, reset=not fresh, sharded=sharded, cfg=cfg, probe=probe,
                           device=device, init_std=init_std, vocab_size=vocab_size)
    checked: dict[str, LossCheck] = {}
    if result.ok:
        rtol = loss_rtol(point.precision, cfg.loss_rtol)
        steps = result.warmup_losses + result.losses
        checked["loss_check"] = losses.check(point, steps, rtol=rtol, recomputed=recomputed)
    return result.updated(overhead_parts_s={**parts, **result.overhead_parts_s}, **checked)


def measure_point(
    model: Any,
    point: Point,
    plan: LayoutPlan,
    base: PointRecord,
    *,
    cfg: SweepConfig,
    probe: Probe,
    device: torch.device,
    init_std: float,
    vocab_size: int,
    reset: bool = True,
    sharded: Sharded | None = None,
) -> PointRecord:
    """Reset the weights, apply the point's plan and techniques, warm up, measure: ``base`` with what it measured.

    ``reset=False`` when the weights are already the seed's initial ones (recompute_first_loss has just
    reset them and left them untouched): resetting twice costs time and changes nothing. A sharded
    model (``sharded``: DDP or FSDP2, one point per process) is never reset: it was built with the
    seed's weights just before it was sharded, and FSDP2's DTensor parameters would draw other random
    numbers than the unsharded model does.
    """
    why = unsupported(point)
    if why is not None:
        return base.updated(status="skipped", reason=why)
    distributed = sharded is not None and sharded.spec.distributed
    reset = reset and not distributed
    t0 = time.perf_counter()
    if reset:
        reset_weights(model, seed=cfg.seed, std=init_std)
        probe.sync()  # the first warm-up step would wait for it anyway: count it here, where it is spent
    reset_s = time.perf_counter() - t0
    params = [p for p in model.parameters() if p.requires_grad]
    batch = make_batch(
        seed=cfg.seed,
        batch_size=point.batch_size,
        seq_len=point.seq_len,
        vocab_size=vocab_size,
        device=device,
    )
    probe.adopt([batch])
    host = HostOffload(pin_memory=device.type == "cuda") if point.offload != "none" else None
    ckpt_offload = host if point.offload == "ckpt_inputs" else None
    with (
        applied(model, plan, offload_inputs=ckpt_offload),
        attention(model, point.attn_implementation),
        loss_head(model, point.loss) as loss_impl,
        Tracking(probe),
    ):
        optimizer = build_optimizer(point, params, lr=cfg.lr, zero_grad_to_none=cfg.zero_grad_to_none)
        trainer = Trainer(
            model,
            optimizer,
            point.precision,
            device.type,
            micro_batches=point.micro_batches,
            zero_grad_to_none=cfg.zero_grad_to_none,
            forward=torch.compile(model) if point.compile else sharded.forward if sharded else None,
            offload=host.active if host is not None and point.offload == "all" else None,
            grad_sync=sharded.grad_sync if distributed and sharded else None,
            use_autocast=sharded.autocast if sharded else True,
        )
        try:
            result = _window(trainer, batch, base, probe=probe, cfg=cfg)
        finally:
            if hasattr(optimizer, "remove_hooks"):  # optimizer_in_backward: the model outlives the point
                optimizer.remove_hooks()
        memory = _static_memory(model, result.memory, optimizer, in_backward=point.optimizer_in_backward)
        del trainer, optimizer
    extra: dict[str, object] = {}  # the fields only some points have
    if reset:
        extra["overhead_parts_s"] = {"weights_reset": reset_s}
    if host is not None:
        extra["host_offload_peak_bytes"] = host.peak_bytes
    if loss_impl is not None:
        extra["loss_implementation"] = loss_impl
    if point.compile:
        extra["compile_s"] = result.warmup_times_s[0]  # the first warm-up step compiles
        torch._dynamo.reset()
    return result.updated(memory=memory, **extra)


def unsupported(point: Point) -> str | None:
    """Why a combination of techniques cannot be measured (None when it can): config/compat.py's rules enforced at
    load or here (the optimizer's own are enforced when it is built)."""
    return refusal(point, ("load", "measure"))


def recompute_first_loss(
    model: Any,
    point: Point,
    *,
    cfg: SweepConfig,
    probe: Probe,
    device: torch.device,
    init_std: float,
    vocab_size: int,
    reset: bool = True,
) -> RecomputedLoss:
    """The first step's loss without checkpointing, by forward passes alone: the loss check's reference
    when the cell's 'none' layout did not run (or is the point itself).

    The first step's loss depends only on the initial weights (reset exactly as measure_point resets
    them) and the batch (deterministic), so this reference exists even where 'none' cannot train.
    Runs before the point's window and outside the CPU tracker, and the cache is emptied after it,
    so the point's memory is what it would be without it.
    """
    if reset:  # False for a sharded model: fresh, with the seed's weights (see measure_point)
        reset_weights(model, seed=cfg.seed, std=init_std)
    batch = make_batch(seed=cfg.seed, batch_size=point.batch_size, seq_len=point.seq_len, vocab_size=vocab_size,
                       device=device)
    rows = point.batch_size
    with attention(model, point.attn_implementation):
        while True:
            try:
                loss = forward_loss(model, batch, precision=point.precision, rows=rows)
                break
            except torch.OutOfMemoryError:
                # Nothing is kept for backward, so the whole batch needs less than any training step of
                # it; halving is a safety net (fragmentation). One sequence not fitting means the
                # point cannot train either: it is recorded as out of memory.
                if rows == 1:
                    raise
            probe.release()  # outside the except block: the failed pass's tensors are freed by now
            rows = (rows + 1) // 2
    del batch
    probe.release()
    return RecomputedLoss(loss=loss, rows=rows, batch_size=point.batch_size)


def _window(
    trainer: Trainer, batch: torch.Tensor, base: PointRecord, *, probe: Probe, cfg: SweepConfig
) -> PointRecord:
    """Warm-up, then the measured steps with peak statistics reset right before them: ``base`` with them."""
    warm_times, warm_losses = _steps(trainer, batch, cfg.warmup_steps, probe=probe)
    start_alloc = probe.allocated()
    probe.reset_peak()
    before = probe.counters()
    times, losses = _steps(trainer, batch, cfg.measured_steps, probe=probe)
    after = probe.counters()
    context = probe.outside_allocator()
    return base.updated(
        status="ok",
        warmup_times_s=warm_times,
        warmup_losses=warm_losses,
        step_times_s=times,
        losses=losses,
        peak_allocated_bytes=probe.peak_allocated(),
        peak_reserved_bytes=probe.peak_reserved(),
        num_alloc_retries=after["num_alloc_retries"] - before["num_alloc_retries"],
        num_ooms=after["num_ooms"] - before["num_ooms"],
        memory=PointMemory(window_start_allocated_bytes=start_alloc),
        **({"context_bytes": context} if context is not None else {}),
    )


def _steps(trainer: Trainer, batch: torch.Tensor, n: int, *, probe: Probe) -> tuple[list[float], list[float]]:
    """n steps, each timed between two device synchronizations; their times and losses."""
    times: list[float] = []
    losses: list[torch.Tensor] = []
    for _ in range(n):
        probe.sync()  # every clock read is preceded by a device synchronize
        t0 = probe.now()
        losses.append(trainer.step(batch))
        probe.sync()
        times.append(probe.now() - t0)
    return times, [float(x) for x in losses]


class Tracking:
    """Activate the CPU tracker for the block (a no-op on CUDA)."""

    def __init__(self, probe: Probe) -> None:
        self.tracker = probe.tracker if isinstance(probe, TrackerProbe) else None

    def __enter__(self) -> None:
        if self.tracker is not None:
            self.tracker.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self.tracker is not None:
            self.tracker.__exit__(*exc)


def _static_memory(
    model: Any, memory: PointMemory, optimizer: torch.optim.Optimizer, *, in_backward: bool
) -> PointMemory:
    """``memory`` with the parameters, gradients (one per trainable parameter, same dtype) and optimizer state,
    in bytes.

    With the optimizer in backward no gradient outlives its own step: none is static (0 bytes).
    Optimizer state in host memory (torchao's CPU offload keeps it in per-parameter CPU optimizers,
    not in ``state``) is not device memory and is not counted.
    """
    params = list(model.parameters())
    state = getattr(optimizer, "state", {}) if not _offloaded(optimizer) else {}
    tensors = [t for s in state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    # A sharded parameter's gradient is sharded like it: count this rank's part (a DTensor's local shard).
    local = [t for p in params if p.requires_grad for t in storage_tensors(p)]
    grads = 0 if in_backward else sum(t.numel() * t.element_size() for t in local)
    return memory.updated(
        params_bytes=tensor_bytes(params), grads_bytes=grads, optimizer_state_bytes=tensor_bytes(tensors)
    )


def _offloaded(optimizer: Any) -> bool:
    """torchao's CPUOffloadOptimizer: its state lives in host memory."""
    return type(optimizer).__name__ == "CPUOffloadOptimizer"
