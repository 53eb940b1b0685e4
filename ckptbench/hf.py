"""HF Trainer's side of a plan: ``PeakMemoryCallback`` measures the real peak memory of the first training steps and
reports it beside the plan's prediction, so that the user's own run checks it.

    from ckptbench.hf import PeakMemoryCallback
    trainer = Trainer(..., callbacks=[PeakMemoryCallback(plan)])

On a CUDA device the peaks are the caching allocator's (``max_memory_allocated``, ``max_memory_reserved``), reset
before each measured step; on a CPU, ckptbench's live-tensor tracker counts every live tensor's bytes during the
step (parameters, gradients and optimizer state included), as a CPU sweep measures. Importing this module imports
transformers (the callback is a ``transformers.TrainerCallback``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from ckptbench.advise.plan import Plan
from ckptbench.measure.probes import TrackerProbe
from ckptbench.units import fmt_bytes


@dataclass(frozen=True)
class StepPeak:
    """One measured training step's peak memory."""

    step: int  # the Trainer's global step it ended
    allocated_bytes: int
    reserved_bytes: int  # the caching allocator's; on a CPU equal to allocated (no cache)
    device: str  # 'cuda:0', or 'cpu (live-tensor tracker)'


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


class PeakMemoryCallback(TrainerCallback):
    """Measure the peak memory of the first ``steps`` optimizer steps and report it beside ``plan``'s prediction
    (``report``: where the lines go, stderr by default). ``peaks`` holds what was measured."""

    def __init__(self, plan: Plan | None = None, *, steps: int = 3,
                 report: Callable[[str], None] | None = None) -> None:
        if steps < 1:
            raise ValueError("steps: measure at least one step")
        self.plan, self.steps = plan, steps
        self.report = report if report is not None else _stderr
        self.peaks: list[StepPeak] = []
        self._probe: TrackerProbe | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Say so where the Trainer's own setting would undo a partial plan when training starts."""
        turned_on = bool(getattr(args, "activation_checkpointing", None) or getattr(args, "gradient_checkpointing",
                                                                                      None))
        if self.plan is not None and turned_on and 0 < len(self.plan.layers) < self.plan.num_layers:
            self.report(f"ckptbench: TrainingArguments turns checkpointing on for every layer, not the plan's "
                        f"{self.plan.layout}: set gradient_checkpointing (activation_checkpointing) to False")

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if len(self.peaks) >= self.steps:
            return
        model = kwargs.get("model")
        device = _device(model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            return
        probe = TrackerProbe()
        probe.adopt(_state_tensors(model, kwargs.get("optimizer")))
        probe.reset_peak()
        probe.tracker.__enter__()  # left in on_step_end: the whole step (forward, backward, optimizer) is counted
        self._probe = probe

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        device = _device(kwargs.get("model"))
        if self._probe is not None:
            probe, self._probe = self._probe, None
            probe.tracker.__exit__(None, None, None)
            peak = probe.peak_allocated()
            self.peaks.append(StepPeak(state.global_step, peak, peak, "cpu (live-tensor tracker)"))
        elif device.type == "cuda" and len(self.peaks) < self.steps:
            torch.cuda.synchronize(device)
            self.peaks.append(StepPeak(state.global_step, torch.cuda.max_memory_allocated(device),
                                       torch.cuda.max_memory_reserved(device), str(device)))
        else:
            return
        if len(self.peaks) == self.steps:
            self.report(self.summary())

    def summary(self) -> str:
        """The measured peaks beside the plan's prediction, in a few lines."""
        if not self.peaks:
            return "ckptbench: no step measured yet"
        top = max(self.peaks, key=lambda p: p.reserved_bytes)
        lines = [f"ckptbench: measured over {len(self.peaks)} steps on {top.device}: peak allocated "
                 f"{fmt_bytes(top.allocated_bytes)}, peak reserved {fmt_bytes(top.reserved_bytes)} (measured)"]
        p = self.plan
        if p is not None:
            needed = fmt_bytes(p.needed_bytes) if p.needed_bytes is not None else "not predicted"
            lines.append(f"ckptbench: the plan ({p.layout}, batch {p.batch_size}, sequence {p.seq_len}, {p.precision}) "
                         f"needs {needed} on the {p.gpu} ({p.needed_label}: reserved raised to its bound plus the "
                         f"CUDA context), limit {fmt_bytes(p.limit_bytes)}")
        return "\n".join(lines)


def _device(model: Any) -> torch.device:
    first = next(iter(model.parameters()), None) if model is not None else None
    return first.device if first is not None else torch.device("cpu")


def _state_tensors(model: Any, optimizer: Any) -> Iterable[Any]:
    """What lives before a step: parameters, buffers, gradients and the optimizer's state."""
    if model is not None:
        yield from model.parameters()
        yield from model.buffers()
        yield from (p.grad for p in model.parameters() if p.grad is not None)
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps the optimizer
    for per_param in getattr(inner, "state", {}).values():
        yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))
