"""What a training step on fake tensors needs to behave like the real one.

Each shim below answers one place where a library treats FakeTensors differently from real
tensors, or where the estimated device differs from the fake one (CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers import masking_utils

from ckptbench.estimator.tracker import StepTracker
from ckptbench.train.offload import HostOffload


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
