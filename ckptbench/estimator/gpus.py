"""The device model per GPU: memory the caching allocator may use, the CUDA context, library workspaces. No torch.

Every figure carries its source. Only the H200's were measured by ckptbench (results/h200-gpu-check-2);
the others come from datasheets or from out-of-memory messages users published (PyTorch prints the
card's total capacity, what the process holds in all and what its allocator reserved; the difference
is memory outside the allocator: the CUDA context, kernels loaded by libraries), and are labelled
estimates wherever they are shown. The context depends on the CUDA version, lazy module loading and
the libraries a process loads, so a figure from another process is an estimate even on the same card.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ckptbench.errors import ConfigError
from ckptbench.train.flops import peak_tflops_for

GIB, MIB, KIB = 2**30, 2**20, 2**10
# PyTorch's cuBLAS workspace default (aten/src/ATen/cuda/CublasHandlePool.cpp, parseChosenWorkspaceSize,
# torch 2.11-2.14): ':4096:8' (32 MiB) on Hopper (compute capability 9.x; newer releases also on
# Blackwell 10.x-12.x), else ':4096:2:16:8' (2 x 4 MiB + 8 x 16 KiB); CUBLAS_WORKSPACE_CONFIG overrides it.
HOPPER_CUBLAS_WORKSPACE = 4096 * KIB * 8
DEFAULT_CUBLAS_WORKSPACE = 4096 * KIB * 2 + 16 * KIB * 8
# cuBLASLt workspace per handle (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB, same file). Matmuls with a
# bias (train.model.warm_device_libraries runs one) allocate it; the H200 points of check-2, which warm
# the libraries, peak exactly 1 MiB above the same points of check-1, which did not.
CUBLASLT_WORKSPACE = 1024 * KIB


@dataclass(frozen=True)
class GpuModel:
    """One card: what torch reports as its memory, and what a training process uses outside the allocator."""

    key: str
    name: str  # torch.cuda.get_device_name
    capability: tuple[int, int]
    total_bytes: int  # torch.cuda.get_device_properties().total_memory ("total capacity" in OOM messages)
    total_source: str
    context_bytes: int  # held by the process outside the caching allocator (CUDA context, library kernels)
    context_source: str
    measured: bool = False  # both figures measured by ckptbench on this card
    # Peak memory bandwidth (bytes/s) from the vendor's datasheet: with the dense bf16 peak (train/flops.py
    # PEAK_TFLOPS), what carries a step time fitted on one card over to another (analysis/step_time.py).
    memory_bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str = ""

    @property
    def bf16_peak_tflops(self) -> float | None:
        """The dense bf16 tensor-core peak (TFLOP/s) of the card, from train/flops.py's datasheet table."""
        return peak_tflops_for(self.name)

    @property
    def peak_source(self) -> str:
        """Where the bf16 peak comes from."""
        return f"vendor datasheet, dense bf16 without sparsity: {self.bf16_peak_tflops:g} TFLOP/s (train/flops.py)"

    def cublas_workspace_bytes(self, config: str | None = None) -> int:
        """One cuBLAS handle's workspace (CUBLAS_WORKSPACE_CONFIG ':SIZE_KIB:COUNT...' when set)."""
        if config:
            pairs = re.findall(r":([0-9]+):([0-9]+)", config)
            if pairs:
                return sum(int(size) * KIB * int(count) for size, count in pairs)
        return HOPPER_CUBLAS_WORKSPACE if self.capability[0] == 9 else DEFAULT_CUBLAS_WORKSPACE

    @property
    def label(self) -> str:
        """How a table names the card and the status of its figures."""
        return self.name if self.measured else f"{self.name} (figures estimated)"


def _gib(value: float) -> int:
    return int(value * GIB)


GPUS: dict[str, GpuModel] = {
    g.key: g
    for g in (
        GpuModel(
            "h200", "NVIDIA H200", (9, 0), 150_109_880_320,
            "measured: results/h200-gpu-check-2/check/run.json (gpu_total_memory_bytes)",
            _gib(139.47 - 132.21 - 6.52),
            "measured: the out-of-memory message in results/h200-gpu-check-2/gpu_check.log (139.47 GiB in "
            "use by the process, 132.21 allocated + 6.52 reserved-unallocated by PyTorch), torch 2.11, CUDA 13.0",
            measured=True,
            memory_bandwidth_bytes_per_s=4.8e12,
            bandwidth_source="NVIDIA H200 datasheet (H200 SXM): 4.8 TB/s HBM3e",
        ),
        GpuModel(
            "h100-80gb", "NVIDIA H100 80GB HBM3", (9, 0), _gib(79.11),
            "estimate: 'total capacity of 79.11 GiB' in a published OOM message (vllm-project/vllm#27508)",
            _gib(139.47 - 132.21 - 6.52), "estimate: the H200's measured context (same architecture)",
            memory_bandwidth_bytes_per_s=3.35e12,
            bandwidth_source="NVIDIA H100 datasheet (H100 SXM 80GB): 3.35 TB/s HBM3",
        ),
        GpuModel(
            "a100-80gb", "NVIDIA A100-SXM4-80GB", (8, 0), _gib(79.25),
            "estimate: '79.25 GiB total capacity' in a published OOM message (levihsu/OOTDiffusion#235)",
            _gib(79.27 - 74.53 - 4.23),
            "estimate: a published A800-80GB OOM message (hahnyuan/PB-LLM#3): 79.27 GiB in use, 74.53 + 4.23 "
            "reserved by PyTorch",
            memory_bandwidth_bytes_per_s=2.039e12,
            bandwidth_source="NVIDIA A100 datasheet (A100 80GB SXM): 2,039 GB/s HBM2e",
        ),
        GpuModel(
            "a100-40gb", "NVIDIA A100-SXM4-40GB", (8, 0), _gib(39.50),
            "estimate: 'total capacity of 39.50 GiB' in a published OOM message (TianheWu/CoSeR#10)",
            _gib(14.25 - 12.87 - 912.01 / 1024),
            "estimate: the same message: 14.25 GiB in use, 12.87 GiB + 912.01 MiB reserved by PyTorch",
            memory_bandwidth_bytes_per_s=1.555e12,
            bandwidth_source="NVIDIA A100 datasheet (A100 40GB SXM): 1,555 GB/s HBM2",
        ),
        GpuModel(
            "l40s", "NVIDIA L40S", (8, 9), _gib(44.42),
            "estimate: 'total capacity of 44.42 GiB' in a published OOM message (stepfun-ai/Step-Video-T2V#8)",
            _gib(44.29 - 43.88),
            "estimate: the same message: 44.29 GiB in use, 43.88 GiB reserved by PyTorch",
            memory_bandwidth_bytes_per_s=864e9,
            bandwidth_source="NVIDIA L40S datasheet: 864 GB/s GDDR6",
        ),
    )
}
DEFAULT_GPU = "h200"


def gpu_model(key: str) -> GpuModel:
    """The model of a card by its key ('a100-80gb'); ConfigError naming the known ones."""
    found = GPUS.get(key.lower())
    if found is None:
        hint = suggest_cards(key)
        extra = f" (did you mean {' or '.join(map(repr, hint))}?)" if hint else ""
        raise ConfigError(f"--gpu: unknown card {key!r}{extra}; known: {', '.join(GPUS)}")
    return found


def suggest_cards(key: str) -> list[str]:
    """The cards a mistyped key most likely means: every card the key names short ('h100' -> 'h100-80gb',
    'a100' -> both A100s, 'nvidia h200' -> 'h200'), else the closest spelling."""
    text = key.lower().strip().removeprefix("nvidia").strip(" -_")
    short = [k for k in GPUS if k == text or k.startswith(text + "-") or k.split("-")[0] == text]
    if text and short:
        return short
    return difflib.get_close_matches(text, list(GPUS), n=1)


def gpu_for_name(name: str | None) -> GpuModel | None:
    """The model of a card torch names ``name`` ('NVIDIA H200'), if ckptbench has one."""
    if not name:
        return None
    for gpu in GPUS.values():
        if gpu.name == name:
            return gpu
    return None
