"""Facts about the machine and software a run was measured on (stored in run.json)."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import ckptbench


def git_sha(cwd: Path | None = None) -> str | None:
    """The ckptbench checkout's commit, or None outside a git checkout."""
    here = cwd or Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def placement(device: Any) -> dict[str, Any]:
    """Where a point runs: the host, and on CUDA the GPU's model and its index on the host (the
    physical index: CUDA_VISIBLE_DEVICES, which pins a fanned-out job, is resolved)."""
    where: dict[str, Any] = {"host": socket.gethostname(), "gpu_name": None, "gpu_index": None}
    if device.type == "cuda":
        import torch

        index = device.index if device.index is not None else torch.cuda.current_device()
        visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        physical = visible[index] if index < len(visible) else str(index)
        where["gpu_name"] = torch.cuda.get_device_name(index)
        where["gpu_index"] = int(physical) if physical.isdigit() else None  # a GPU UUID stays unknown
    return where


def collect(device_type: str) -> dict[str, Any]:
    """Versions, host and (on CUDA) GPU name, memory, driver and CUDA version."""
    import torch
    import transformers

    info: dict[str, Any] = {
        "ckptbench_version": ckptbench.__version__,
        "git_sha": git_sha(),
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device_type": device_type,
        "cpu_count": os.cpu_count(),
        "gpu_name": None,
        "gpu_total_memory_bytes": None,
        "cuda_version": torch.version.cuda,
        "driver_version": None,
    }
    if device_type == "cuda" and torch.cuda.is_available():  # a Slurm login node plans GPU jobs without one
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu_name=props.name,
            gpu_total_memory_bytes=int(props.total_memory),
            gpu_capability=f"{props.major}.{props.minor}",
            driver_version=_driver_version(),
        )
    return info
