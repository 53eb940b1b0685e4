"""TEST-ONLY fault injection, switched on by environment variables. Never set these in a real run: they
do nothing unless ``CKPTBENCH_ENABLE_TEST_HOOKS=1`` is set too (the tests set it; a normal install never does).

Each variable selects points by their key: ``FIELD=VALUE`` pairs separated by ``;``, all of which
must match the point's key as text (for example ``layout=all`` or ``layout=all;batch_size=2``).

- ``CKPTBENCH_TEST_CRASH``: the point's process kills itself with SIGKILL (a segfault stand-in).
- ``CKPTBENCH_TEST_HANG``: the point sleeps forever (a hung step, for ``--point-timeout``).
- ``CKPTBENCH_TEST_LEAK``: the point leaves a 4 MiB tensor attached to the model (a leak).
- ``CKPTBENCH_TEST_CUDA_ERROR``: the point raises the error a device-side assert produces.
- ``CKPTBENCH_TEST_ERROR``: the point raises an ordinary RuntimeError.
- ``CKPTBENCH_TEST_JOB_CRASH``: a fanned-out point's submitit job kills itself before it starts the
  point (a node failure or an out-of-memory kill of the job stand-in).

The runner calls :func:`fire` once per point, after the model is built and before the steps; a
fanned-out job calls :func:`fire_job` first.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only where a hook needs it: the CLI reads active() before torch is imported
    import torch

    from ckptbench.measure.probes import Probe

LEAK_BYTES = 4 << 20
ENABLE_VAR = "CKPTBENCH_ENABLE_TEST_HOOKS"
HOOKS = ("CRASH", "HANG", "LEAK", "CUDA_ERROR", "ERROR", "JOB_CRASH")


def enabled() -> bool:
    """Whether the test-only switch is on (exactly '1')."""
    return os.environ.get(ENABLE_VAR) == "1"


def _set() -> dict[str, str]:
    return {f"CKPTBENCH_TEST_{n}": v for n in HOOKS if (v := os.environ.get(f"CKPTBENCH_TEST_{n}", ""))}


def active() -> dict[str, str]:
    """The hook variables that will fire (name -> spec); empty unless the test-only switch is on."""
    return _set() if enabled() else {}


def ignored() -> list[str]:
    """Hook variables that are set but do nothing, because the test-only switch is off."""
    return [] if enabled() else sorted(_set())


def matches(spec: str | None, key: Mapping[str, object]) -> bool:
    """Whether a ``FIELD=VALUE;...`` spec selects the point with this key."""
    if not spec:
        return False
    for pair in spec.split(";"):
        field, sep, value = pair.partition("=")
        if not sep or str(key.get(field.strip())) != value.strip():
            return False
    return True


def _selected(name: str, key: Mapping[str, object]) -> bool:
    return enabled() and matches(os.environ.get(f"CKPTBENCH_TEST_{name}"), key)


def fire(key: Mapping[str, object], *, model: Any, probe: Probe, device: torch.device) -> None:
    """Inject the fault the environment asks for into the point with this key (normally nothing)."""
    if _selected("CRASH", key):
        print("ckptbench test hook: killing the point's process (CKPTBENCH_TEST_CRASH)", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    if _selected("HANG", key):
        print("ckptbench test hook: hanging the point (CKPTBENCH_TEST_HANG)", file=sys.stderr)
        sys.stderr.flush()
        while True:
            time.sleep(3600)
    if _selected("LEAK", key):
        import torch  # only here: the CLI reads active() before torch is imported

        leak = torch.zeros(LEAK_BYTES // 4, dtype=torch.float32, device=device)
        probe.adopt([leak])  # the CPU tracker counts only tensors it is told about or sees created
        model._ckptbench_test_leak = leak  # survives the point, like a stray reference would
    if _selected("CUDA_ERROR", key):
        raise RuntimeError("CUDA error: device-side assert triggered (CKPTBENCH_TEST_CUDA_ERROR)")
    if _selected("ERROR", key):
        raise RuntimeError("injected failure (CKPTBENCH_TEST_ERROR)")


def fire_job(key: Mapping[str, object]) -> None:
    """In a fanned-out job: die the way a killed job dies, when the environment asks for it."""
    if _selected("JOB_CRASH", key):
        print("ckptbench test hook: killing the job (CKPTBENCH_TEST_JOB_CRASH)", file=sys.stderr)
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)
