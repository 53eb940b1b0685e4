"""Predicted peak reserved memory of a point: its traced requests replayed through the caching allocator.

Glue between the traces the estimator already runs (estimator/api.py) and the replay
(estimator/replay.py): the full model's step from the short trace (estimator/event_assembly.py) or
from a full trace, the optimizer's first step (which creates the state) and later ones from the
whole-model optimizer trace, the process around them from the device model (estimator/gpus.py).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ckptbench.config.alloc_conf import AllocatorSettings, axis_to_conf, parse_alloc_conf
from ckptbench.config.grid import Point
from ckptbench.config.schema import SweepConfig
from ckptbench.estimator.allocator import DeviceLimit
from ckptbench.estimator.event_assembly import assemble_step
from ckptbench.estimator.gpus import CUBLASLT_WORKSPACE, GpuModel
from ckptbench.estimator.replay import ProcessModel, ReplayResult, replay_point
from ckptbench.estimator.step_events import StepEvents, segment_events, traced_step
from ckptbench.estimator.trace import StepTrace

TOKEN_BYTES = 8  # the batch: int64 token ids (train.step.make_batch)


def optimizer_steps(optim: StepTrace) -> tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]]:
    """The whole model's first optimizer step (creating the state) and a later one, as (op, id, bytes)."""
    return segment_events(optim, "opt_first", exclude=optim.host), segment_events(optim, "opt")


def fast_steps(
    short: StepTrace, short_classes: Sequence[str], full_classes: Sequence[str], micro_batches: int, optim: StepTrace
) -> tuple[StepEvents, StepEvents]:
    """The first warm-up step and a later step of the full model, from a short model's trace."""
    first_opt, opt = optimizer_steps(optim)
    steady = assemble_step(short, short_classes, full_classes, micro_batches, opt)
    return steady.with_optimizer(first_opt), steady


def full_steps(trace: StepTrace, optim: StepTrace) -> tuple[StepEvents, StepEvents]:
    """The same from a trace of the whole model's step."""
    first_opt, _ = optimizer_steps(optim)
    return traced_step(trace, first_opt), traced_step(trace)


def process_model(cfg: SweepConfig, point: Point, optim: StepTrace, gpu: GpuModel) -> ProcessModel:
    """What the measuring process allocates around the steps on this card."""
    cublas = gpu.cublas_workspace_bytes(os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
    return ProcessModel(
        warmup_steps=cfg.warmup_steps,
        measured_steps=cfg.measured_steps,
        # warm_device_libraries: the main thread's and autograd's thread's cuBLAS handles, one cuBLASLt
        workspaces=(cublas, cublas, CUBLASLT_WORKSPACE),
        build=optim.build,
        batch_bytes=point.batch_size * point.seq_len * TOKEN_BYTES,
    )


def device_limit(cfg: SweepConfig, gpu: GpuModel) -> DeviceLimit:
    """The limits of a point's process: a sweep always sets the memory fraction (measure/probes.py
    CudaProbe: the cap over the card, or 1.0), which also switches garbage collection on."""
    fraction = 1.0 if cfg.memory_cap_gib is None else min(1.0, cfg.memory_cap_gib * 2**30 / gpu.total_bytes)
    return DeviceLimit(gpu.total_bytes, fraction, gpu.context_bytes)


def allocator_settings(point: Point) -> AllocatorSettings:
    """The allocator options of a point (its ``allocator`` axis value)."""
    return parse_alloc_conf(axis_to_conf(getattr(point, "allocator", "default")))


def predict_reserved(
    cfg: SweepConfig, point: Point, steps: tuple[StepEvents, StepEvents], optim: StepTrace, gpu: GpuModel
) -> ReplayResult:
    """Replay the point's process on ``gpu``: peaks of the measured window, or where it runs out."""
    first, steady = steps
    return replay_point(
        first, steady, process_model(cfg, point, optim, gpu), allocator_settings(point), device_limit(cfg, gpu)
    )
