"""Optimizers by name: fused or foreach AdamW, SGD with momentum, Adafactor, bitsandbytes' 8-bit AdamW."""

from __future__ import annotations

import torch
from torch import nn


class OptimizerUnavailable(RuntimeError):
    """The optimizer's package is not installed: the point is skipped, not failed."""


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """AdamW fused or foreach, SGD with momentum, Adafactor, or bitsandbytes' 8-bit AdamW."""
    if name == "adamw_fused":
        return torch.optim.AdamW(params, lr=lr, fused=True)
    if name == "adamw_foreach":
        # foreach keeps a temporary copy of the state it updates during the step: the peak shows it.
        return torch.optim.AdamW(params, lr=lr, foreach=True, fused=False)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name == "adamw_8bit":
        try:
            import bitsandbytes as bnb
        except ImportError:
            raise OptimizerUnavailable("bitsandbytes is not installed (pip install bitsandbytes)") from None
        return bnb.optim.AdamW8bit(params, lr=lr)
    raise ValueError(f"unknown optimizer {name!r}")
