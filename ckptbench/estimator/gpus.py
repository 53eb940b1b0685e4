"""The device model per GPU: memory the caching allocator may use, the CUDA context, library workspaces. No torch.

The figures of every card are config/cards.py's, each with its source. Only the H200's were measured by
ckptbench (results/h200-gpu-check-2); the others are labelled estimates wherever they are shown. The context
depends on the CUDA version, lazy module loading and the libraries a process loads, so a figure from another
process is an estimate even on the same card; where none was published for a card, its architecture's stands in
(and says so).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptbench.config.cards import CARDS, Card, card_named, card_or_size, suggest

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
CUBLAS_HANDLES = 2  # the main thread (forward, optimizer) and autograd's CUDA device thread (backward)
_BLOCK = 512


def block_bytes(nbytes: int) -> int:
    """What a request of ``nbytes`` holds of the caching allocator as the device model counts it: rounded up to 512
    bytes, and above 10 MiB to its 2 MiB segment unless that adds more than 1 MiB."""
    if nbytes <= 0:
        return 0
    size = -(-nbytes // _BLOCK) * _BLOCK
    if size > 10 * MIB:
        segment = -(-size // (2 * MIB)) * (2 * MIB)
        return segment if segment - size <= MIB else size
    return size


def persistent_workspace_bytes(cublas_workspace: int) -> int:
    """The cuBLAS workspaces a training step holds from its first matmul on: one per handle (CUBLAS_HANDLES)."""
    return CUBLAS_HANDLES * block_bytes(cublas_workspace)


@dataclass(frozen=True)
class GpuModel:
    """One card as the device model sees it: what torch reports as its memory, what a training process uses outside
    the allocator, and the peaks a step time is carried over with (config/cards.py holds the figures)."""

    key: str
    name: str  # torch.cuda.get_device_name
    capability: tuple[int, int]
    total_bytes: int  # torch.cuda.get_device_properties().total_memory ("total capacity" in OOM messages)
    total_source: str
    context_bytes: int  # held by the process outside the caching allocator (CUDA context, library kernels)
    context_source: str
    measured: bool = False  # both figures measured by ckptbench on this card
    # Peak memory bandwidth (bytes/s) and the dense bf16 tensor-core peak (TFLOP/s) from the vendor's datasheet: what
    # carries a step time fitted on one card over to another (analysis/step_time.py).
    memory_bandwidth_bytes_per_s: float | None = None
    bandwidth_source: str = ""
    bf16_peak_tflops: float | None = None
    peak_source: str = ""
    capability_known: bool = True  # False for a card given by its memory size alone (the workspace is assumed)

    def cublas_workspace_bytes(self, config: str | None = None) -> int:
        """One cuBLAS handle's workspace (CUBLAS_WORKSPACE_CONFIG ':SIZE_KIB:COUNT...' when set)."""
        if config:
            pairs = re.findall(r":([0-9]+):([0-9]+)", config)
            if pairs:
                return sum(int(size) * KIB * int(count) for size, count in pairs)
        return HOPPER_CUBLAS_WORKSPACE if self.capability[0] == 9 else DEFAULT_CUBLAS_WORKSPACE

    @property
    def memory_label(self) -> str:
        """How its memory figure was obtained: measured (by ckptbench), given (--gpu SIZE) or estimated."""
        return "measured" if self.measured else "given" if self.total_source.startswith("given") else "estimated"

    @property
    def context_label(self) -> str:
        return "measured" if self.measured else "estimated"

    @property
    def label(self) -> str:
        """How a table names the card and the status of its figures."""
        return self.name if self.measured else f"{self.name} (figures estimated)"


def _context(card: Card) -> tuple[int, str]:
    """The card's context, or, where none was published, an architecture's: the measured card of the same compute
    capability major (the H200 for Hopper), else the median of the published figures of that major, else of all."""
    if card.context_bytes is not None:
        return card.context_bytes, card.context_source
    same = [c for c in CARDS if c.capability[0] == card.capability[0] and c.context_bytes is not None]
    measured = [c for c in same if c.measured]
    if measured:
        ref = measured[0]
        return ref.context_bytes or 0, f"estimate: the {ref.key}'s measured context (same architecture)"
    pool = same or [c for c in CARDS if c.context_bytes is not None]
    figures = sorted(c.context_bytes or 0 for c in pool)
    median = figures[len(figures) // 2]
    keys = ", ".join(c.key for c in pool)
    return median, f"estimate: the median of the published contexts of {keys} (none published for this card)"


def model_of(card: Card) -> GpuModel:
    """The device model of a card of the table."""
    context, context_source = _context(card)
    return GpuModel(
        card.key, card.name, card.capability, card.memory_bytes, card.memory_source, context, context_source,
        measured=card.measured, memory_bandwidth_bytes_per_s=card.bandwidth_bytes_per_s,
        bandwidth_source=card.bandwidth_source, bf16_peak_tflops=card.bf16_tflops,
        peak_source=f"dense bf16 tensor-core peak: {card.flops_source}" if card.bf16_tflops else "",
    )


def sized(total_bytes: int, *, tflops: float | None = None, bandwidth_bytes_per_s: float | None = None) -> GpuModel:
    """A card given by its memory alone ('24GiB'): the allocator's limit is that size; its context is the median of
    the published ones (an estimate), its cuBLAS workspace a non-Hopper card's, and its peaks only where given."""
    figures = sorted(c.context_bytes for c in CARDS if c.context_bytes is not None)
    context = figures[len(figures) // 2]
    text = f"{total_bytes / GIB:.2f}GiB"
    return GpuModel(
        text, f"a {total_bytes / GIB:.2f} GiB card", (8, 0), total_bytes, "given: --gpu", context,
        f"estimate: the median of the {len(figures)} published contexts of the card table", measured=False,
        memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s, bandwidth_source="given: --bandwidth" if
        bandwidth_bytes_per_s else "", bf16_peak_tflops=tflops, peak_source="given: --tflops" if tflops else "",
        capability_known=False,
    )


GPUS: dict[str, GpuModel] = {c.key: model_of(c) for c in CARDS}
DEFAULT_GPU = "h200"


def gpu_model(key: str) -> GpuModel:
    """The model of a card by its key, an alias or torch's name ('a100-80gb', '4090'), or a memory size ('24GiB');
    ConfigError naming the choices otherwise."""
    found = card_or_size(key)
    if isinstance(found, int):
        return sized(found)
    return GPUS[found.key]


def suggest_cards(key: str) -> list[str]:
    """The cards a mistyped key most likely means."""
    return suggest(key)


def gpu_for_name(name: str | None) -> GpuModel | None:
    """The model of a card torch names ``name`` ('NVIDIA H200'), if ckptbench has one."""
    card = card_named(name)
    return GPUS[card.key] if card is not None else None
