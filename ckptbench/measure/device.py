"""The device a sweep runs on, the probe that measures it, and which device errors end a sweep."""

from __future__ import annotations

import torch

from ckptbench.config.schema import SweepConfig
from ckptbench.errors import MachineError
from ckptbench.estimator.gpus import GpuModel, gpu_for_name
from ckptbench.measure.probes import CudaProbe, Probe, TrackerProbe

# Errors after which the CUDA context is unusable (every later CUDA call fails): stop the sweep.
_FATAL_MARKERS = (
    "device-side assert",
    "illegal memory access",
    "unspecified launch failure",
    "misaligned address",
    "illegal instruction",
    "uncorrectable ECC",
    "CUDA error",
    "CUBLAS_STATUS_EXECUTION_FAILED",
)


def resolve_device(cfg: SweepConfig) -> torch.device:
    """'auto' picks CUDA when present; asking for CUDA without a GPU is a clear error."""
    if cfg.device == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if cfg.device == "cuda":
        raise MachineError(
            "device: cuda was requested but no CUDA GPU is visible; run `ckptbench estimate` "
            "for a prediction, or use a CPU config such as configs/tiny.yaml"
        )
    return torch.device("cpu")


def make_probe(cfg: SweepConfig, device: torch.device) -> Probe:
    cap = int(cfg.memory_cap_gib * 2**30) if cfg.memory_cap_gib else None
    return CudaProbe(device, cap_bytes=cap) if device.type == "cuda" else TrackerProbe(cap_bytes=cap)


def is_fatal_device_error(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the CUDA context unusable (a device-side assert, an illegal access...)."""
    accelerator_error = getattr(torch, "AcceleratorError", None)
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return True
    text = str(exc)
    return "out of memory" not in text and any(marker in text for marker in _FATAL_MARKERS)


def current_gpu_model(device: torch.device) -> GpuModel:
    """The device model of the GPU this process runs on: the card's own total memory, and the memory the
    process holds outside the caching allocator (measured now, after CUDA started) unless ckptbench has a
    measured figure for this card (the context grows as libraries load their kernels, so a figure taken at
    the start is a lower bound)."""
    props = torch.cuda.get_device_properties(device)
    known = gpu_for_name(props.name)
    if known is not None and known.measured:
        return known
    free, total = torch.cuda.mem_get_info(device)
    outside = max(0, total - free - torch.cuda.memory_reserved(device))
    return GpuModel(
        props.name, props.name, (props.major, props.minor), int(props.total_memory),
        "measured: torch.cuda.get_device_properties", outside,
        "measured: torch.cuda.mem_get_info at the start of the sweep (a lower bound)", measured=True,
    )
