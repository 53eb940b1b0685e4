"""bitsandbytes' 8-bit AdamW (``adamw_8bit``) on fake tensors: the one step of it that reads data, replaced for the
trace by a stand-in that allocates what it allocates; a trace that fails inside bitsandbytes becomes a clean skip.

What ``AdamW8bit`` (bitsandbytes 0.50, ``optim/optimizer.py``: ``Optimizer2State``) allocates:

- at construction, two quantisation maps of 256 fp32 values each (``functional.create_dynamic_map``), in host
  memory, built from Python lists (``.tolist()`` of intermediate tensors, then ``torch.tensor``). This is the
  data-dependent step: a fake tensor holds no values to list;
- at a parameter's first step (``init_state``): for a parameter of ``min_8bit_size`` (4096) elements or more, the
  two maps moved to the parameter's device (once per optimizer, at the first such parameter: the moved maps
  replace the host ones), then ``state1`` and ``state2`` (uint8, a byte per element) and ``absmax1`` and
  ``absmax2`` (fp32, one per block of 256 elements); for a smaller parameter, ``state1`` and ``state2`` in fp32;
- at every step, one update op per parameter (``bitsandbytes::optimizer_update_8bit_blockwise``, or ``_32bit``)
  that writes the parameter and the states in place: the CUDA kernel allocates nothing, nor does the fake kernel
  bitsandbytes registers for the op; the CPU kernel's temporaries are made inside the op, where no dispatch mode
  sees them (neither the CPU tracker nor the estimator's).

So the optimizer runs as it is under fake tensors, but for the maps' construction: while ``traceable`` is active,
``create_dynamic_map`` computes the real map with every mode off (constants of a few KiB, on the host, no device
memory) and hands out a fake tensor of its shape and dtype where the real one would be:

- for a CUDA target, on the meta device (host memory, which no counter counts), so that ``init_state``'s move to
  the parameter's device is a copy, counted where the real one is made;
- for a CPU target, as the real function makes it (``torch.tensor``, whose storage first shows up through
  ``aten.lift_fresh``, a view, so no dispatch mode counts it being made); ``.to(cpu)`` keeps it. The CPU tracker
  never counts it, and neither does the estimate: ``uncounted`` names it so that the trace does not count it when
  it counts the optimizer's state. (The state bytes a CPU run records walk the state's tensors and include the
  maps; its peak does not.)
"""

from __future__ import annotations

import contextlib
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ckptbench.train.optimizers import OptimizerUnavailable, import_bitsandbytes
from ckptbench.train.unavailable import TechniqueUnavailable

OPTIMIZER = "adamw_8bit"

# The maps the stand-in handed out, by id (kept while they live): those the trace must not count.
_MADE: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()


@contextlib.contextmanager
def traceable(optimizer: str, *, target: str) -> Iterator[None]:
    """For the block, let bitsandbytes' 8-bit AdamW (``optimizer`` 'adamw_8bit') be built on fake tensors with the
    bytes it allocates on ``target``; an exception raised inside bitsandbytes becomes ``TechniqueUnavailable`` (the
    point is not estimated, with a note). Other optimizers, or no bitsandbytes installed (``make_optimizer`` says
    so when the trace builds the optimizer): the block runs as it is."""
    if optimizer != OPTIMIZER:
        yield
        return
    try:
        bnb = import_bitsandbytes()
    except OptimizerUnavailable:
        yield
        return
    functional = bnb.functional
    real = getattr(functional, "create_dynamic_map", None)
    if real is not None:  # a bitsandbytes without it builds its maps otherwise: the trace tells whether that works
        functional.create_dynamic_map = _stand_in(real, host_only=target == "cuda")
    try:
        yield
    except TechniqueUnavailable:
        raise
    except Exception as exc:
        if not _raised_inside(exc, Path(bnb.__file__).parent):
            raise
        version = getattr(bnb, "__version__", "?")
        detail = str(exc).splitlines()[0] if str(exc) else ""
        what = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        raise TechniqueUnavailable(
            f"bitsandbytes {version}: its 8-bit AdamW could not be traced on fake tensors ({what})"
        ) from exc
    finally:
        if real is not None:
            functional.create_dynamic_map = real


def uncounted(tensors: Iterable[Any]) -> list[torch.Tensor]:
    """The maps among ``tensors`` (an optimizer's state) that ``traceable`` handed out: host memory, or unseen by the
    CPU tracker (the module docstring), so not counted; on a CUDA target the state holds their device copies."""
    return [t for t in tensors if isinstance(t, torch.Tensor) and _MADE.get(id(t)) is t]


def _stand_in(real: Callable[..., torch.Tensor], *, host_only: bool) -> Callable[..., torch.Tensor]:
    """``create_dynamic_map`` for the trace: the real map's shape and dtype, made as the module docstring says."""

    def create_dynamic_map(*args: Any, **kwargs: Any) -> torch.Tensor:
        with _disable_current_modes():  # no fake tensors, no tracker: the real map, on the host
            code = real(*args, **kwargs)
        if host_only:
            made = torch.empty(code.shape, dtype=code.dtype, device="meta")
        else:
            made = torch.tensor(code.tolist(), dtype=code.dtype)
        _MADE[id(made)] = made
        return made

    return create_dynamic_map


def _raised_inside(exc: BaseException, package: Path) -> bool:
    """Whether ``exc`` was raised in, or passed through, a frame of the code under ``package``."""
    tb: types.TracebackType | None = exc.__traceback__
    while tb is not None:
        if Path(tb.tb_frame.f_code.co_filename).is_relative_to(package):
            return True
        tb = tb.tb_next
    return False
