"""One training step per precision mode (dtypes, autocast, the Trainer); optimizers are built in train/optimizers.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

# precision -> (parameter dtype, autocast dtype or None)
_PRECISIONS: dict[str, tuple[torch.dtype, torch.dtype | None]] = {
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
    "fp32": (torch.float32, None),
    "amp_bf16": (torch.float32, torch.bfloat16),
    "amp_fp16": (torch.float32, torch.float16),
}


def param_dtype(precision: str) -> torch.dtype:
    """The dtype parameters (and so gradients and optimizer state) are stored in."""
    return _PRECISIONS[precision][0]


def amp_dtype(precision: str) -> torch.dtype | None:
    """The dtype an amp precision computes in (None for the pure-dtype precisions)."""
    return _PRECISIONS[precision][1]


def autocast(precision: str, device_type: str) -> contextlib.AbstractContextManager[Any]:
    """The precision's autocast region (a no-op for the pure-dtype precisions)."""
    low = amp_dtype(precision)
    return torch.autocast(device_type, dtype=low) if low is not None else contextlib.nullcontext()


@torch.no_grad()
def forward_loss(model: nn.Module, input_ids: torch.Tensor, *, precision: str, rows: int) -> float:
    """The mean loss of ``input_ids`` (also the labels) by forward passes alone, ``rows`` sequences at a time.

    Every sequence predicts the same number of tokens, so the batch's mean loss is the mean of the
    slices' mean losses weighted by their rows.
    """
    total, count = 0.0, input_ids.shape[0]
    for start in range(0, count, rows):
        chunk = input_ids[start : start + rows]
        with autocast(precision, input_ids.device.type):
            loss = model(input_ids=chunk, labels=chunk, use_cache=False).loss
        total += float(loss) * chunk.shape[0]
    return total / count


@dataclass
class Trainer:
    """Runs forward with labels, backward, optimizer step and zero-grad for one precision mode.

    ``forward`` is the module called for the forward pass (the compiled model, when compiled; the
    DDP wrapper); with ``micro_batches`` > 1 the gradients of that many forward/backward passes are
    accumulated before one optimizer step, and ``grad_sync(last)`` wraps each of them (a sharded
    model reduces gradients on the last one only); ``offload`` keeps saved activations in host
    memory; ``use_autocast`` is False where FSDP2's mixed-precision policy casts instead.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    precision: str
    device_type: str
    micro_batches: int = 1
    zero_grad_to_none: bool = True
    forward: Callable[..., Any] | None = None
    offload: Callable[[], contextlib.AbstractContextManager[None]] | None = None
    grad_sync: Callable[[bool], contextlib.AbstractContextManager[Any]] | None = None
    use_autocast: bool = True

    def __post_init__(self) -> None:
        # Only fp16 autocast needs loss scaling; pure fp16 keeps fp16 state, as the precision promises.
        self.scaler = torch.amp.GradScaler(self.device_type) if self.precision == "amp_fp16" else None

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """One optimizer step on ``input_ids`` (also the labels); returns the mean detached loss."""
        forward = self.forward if self.forward is not None else self.model
        offload = self.offload or contextlib.nullcontext
        total = torch.zeros((), device=input_ids.device)
        precision = self.precision if self.use_autocast else "fp32"  # fp32: no autocast region
        in_backward = getattr(self.optimizer, "armed", None) is not None
        for k in range(self.micro_batches):
            if in_backward:  # optimizer_in_backward: apply the gradients in the last micro-batch's backward
                self.optimizer.armed = k == self.micro_batches - 1  # type: ignore[attr-defined]
            sync = self.grad_sync(k == self.micro_batches - 1) if self.grad_sync else contextlib.nullcontext()
            with sync:
                with autocast(precision, self.device_type), offload():
                    loss = forward(input_ids=input_ids, labels=input_ids, use_cache=False).loss
                scaled = loss / self.micro_batches
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            total += loss.detach().float()
            del loss, scaled
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=self.zero_grad_to_none)
        return total / self.micro_batches


def make_batch(*, seed: int, batch_size: int, seq_len: int, vocab_size: int, device: torch.device) -> torch.Tensor:
    """Deterministic random token ids: the same data for every layout of a cell."""
    gen = torch.Generator(device="cpu").manual_seed(seed + 7919 * batch_size + seq_len)
    return torch.randint(0, vocab_size, (batch_size, seq_len), generator=gen).to(device)
