"""Optimizers by name (fused or foreach AdamW, SGD, Adafactor, bitsandbytes' and torchao's 8-bit AdamW),
stepped after backward, during backward (per-parameter hooks), or on the CPU (torchao's offload)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch import nn

from ckptbench.config.compat import cuda_need, refusal
from ckptbench.config.grid import Point
from ckptbench.train.unavailable import TechniqueUnavailable


class OptimizerUnavailable(TechniqueUnavailable):
    """The optimizer's package is not installed: the point is skipped, not failed."""


def make_optimizer(name: str, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """AdamW fused or foreach, SGD with momentum, Adafactor, or an 8-bit AdamW (bitsandbytes, torchao)."""
    if name in _TORCH:
        cls, options = _TORCH[name]
        opt: torch.optim.Optimizer = cls(params, lr=lr, **options)
        return opt
    if name == "adamw_8bit":
        bnb: Any = import_bitsandbytes()
        opt8bit: torch.optim.Optimizer = bnb.optim.AdamW8bit(params, lr=lr)
        return opt8bit
    if name == "adamw_8bit_torchao":
        adamw8bit: Any = _torchao("AdamW8bit")
        opt8: torch.optim.Optimizer = adamw8bit(params, lr=lr)
        return opt8
    raise ValueError(f"unknown optimizer {name!r}")


# name -> (class, options); foreach keeps a temporary copy of the state it updates during the step.
_TORCH: dict[str, tuple[Any, dict[str, Any]]] = {
    "adamw_fused": (torch.optim.AdamW, {"fused": True}),
    "adamw_foreach": (torch.optim.AdamW, {"foreach": True, "fused": False}),
    "sgd": (torch.optim.SGD, {"momentum": 0.9}),
    "adafactor": (torch.optim.Adafactor, {}),
}


def import_bitsandbytes() -> Any:
    """The bitsandbytes package, imported ``bitsandbytes_quietly``; OptimizerUnavailable where it is not installed."""
    try:
        with bitsandbytes_quietly():
            import bitsandbytes
    except ImportError:
        raise OptimizerUnavailable("bitsandbytes is not installed (pip install 'ckptbench[8bit]')") from None
    return bitsandbytes


# What bitsandbytes' CPU backend logs (a warning) when it imports on a CPU with AVX-512 bf16: a 4-bit matmul kernel
# (kernels-community's gemm_4bit_forward) it could not fetch, which ckptbench never runs.
_BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
_BNB_IMPORT_NOISE = "Failed to load CPU gemm_4bit_forward"


@contextlib.contextmanager
def bitsandbytes_quietly() -> Iterator[None]:
    """While bitsandbytes may be imported in the block, drop that one warning of its CPU backend (every other record,
    and every exception, comes through): wrap whatever imports it first (``import bitsandbytes``, or peft's import)."""
    logger = logging.getLogger(_BNB_CPU_LOGGER)

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_BNB_IMPORT_NOISE)

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _torchao(name: str) -> Any:
    """A class of torchao's optimizers (torchao.optim; before 0.11 torchao.prototype.low_bit_optim)."""
    try:
        import torchao.optim as ao
    except ImportError:
        try:
            import torchao.prototype.low_bit_optim as ao
        except ImportError:
            raise OptimizerUnavailable("torchao is not installed (pip install torchao)") from None
    return getattr(ao, name)


def build_optimizer(
    point: Point, params: list[nn.Parameter], *, lr: float, zero_grad_to_none: bool
) -> torch.optim.Optimizer:
    """The point's optimizer: stepped after backward, in backward (optimizer_in_backward), or on the CPU."""
    why = refusal(point, ("optimizer",))  # config/compat.py: the combinations an optimizer refuses
    if why is not None:
        raise TechniqueUnavailable(why)
    if point.optimizer_offload == "cpu":
        return _cpu_offloaded(point, params, lr=lr)
    if point.optimizer_in_backward:
        return OptimizerInBackward(point.optimizer, params, lr=lr, zero_grad_to_none=zero_grad_to_none)
    return make_optimizer(point.optimizer, params, lr=lr)


def _cpu_offloaded(point: Point, params: list[nn.Parameter], *, lr: float) -> torch.optim.Optimizer:
    """torchao's CPUOffloadOptimizer: state and step on the CPU, gradients copied out as they land."""
    if not all(p.is_cuda for p in params):
        raise TechniqueUnavailable(f"optimizer_offload: {cuda_need('optimizer_offload', point.optimizer_offload)}")
    cls, options = _TORCH[point.optimizer]
    offload: Any = _torchao("CPUOffloadOptimizer")
    # Freeing the GPU gradient once it is on the host cannot accumulate micro-batches (torchao says so).
    free_grads = point.micro_batches == 1
    opt: torch.optim.Optimizer = offload(params, cls, offload_gradients=free_grads, lr=lr, **options)
    return opt


class OptimizerInBackward(torch.optim.Optimizer):
    """One optimizer per parameter, stepped by its post-accumulate-grad hook (PyTorch's "optimizer step in
    backward" recipe): each gradient is applied as soon as it is complete, then freed.

    Gradient accumulation: with ``micro_batches`` > 1 the Trainer arms the hooks only for the last
    micro-batch (``armed``), so earlier micro-batches accumulate as usual and the last backward applies
    and frees each summed gradient: the same update as stepping after backward, with the saving limited
    to the last backward. ``step()`` steps parameters that still hold a gradient (the first step of the
    estimator's warm state, an unarmed backward); after a normal armed backward there are none.
    """

    def __init__(self, name: str, params: list[nn.Parameter], *, lr: float, zero_grad_to_none: bool) -> None:
        self.inner = {p: make_optimizer(name, [p], lr=lr) for p in params}
        self.armed = True
        self.zero_grad_to_none = zero_grad_to_none
        # The inner optimizers' own groups: their options (fused, capturable) stay readable.
        super().__init__([g for opt in self.inner.values() for g in opt.param_groups], {})
        self.state = _MergedState(self.inner)  # type: ignore[assignment]
        self._hooks = [p.register_post_accumulate_grad_hook(self._apply) for p in params]

    def _apply(self, param: torch.Tensor) -> None:
        if not self.armed:
            return
        opt = self.inner[param]  # type: ignore[index]
        opt.step()
        opt.zero_grad(set_to_none=self.zero_grad_to_none)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for p, opt in self.inner.items():
            if p.grad is not None:
                opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.inner.values():
            opt.zero_grad(set_to_none=set_to_none)

    def remove_hooks(self) -> None:
        """Detach from the parameters (the model outlives the point)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks.clear()


class _MergedState(Mapping[Any, Any]):
    """The per-parameter optimizers' states read as one optimizer's ``state``."""

    def __init__(self, inner: dict[nn.Parameter, torch.optim.Optimizer]) -> None:
        self.inner = inner

    def __getitem__(self, param: Any) -> Any:
        return self.inner[param].state[param]

    def __iter__(self) -> Iterator[Any]:
        return (p for p, opt in self.inner.items() if p in opt.state)

    def __len__(self) -> int:
        return sum(1 for _ in self)
