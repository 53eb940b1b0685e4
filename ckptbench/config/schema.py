"""The whole sweep config: model, run settings and axes, validated and frozen. Never imports torch."""

from __future__ import annotations

import difflib
import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ckptbench.config.axes import AttnImpl, DeviceName, OptimizerName, PointSpec, SweepAxes, _Strict
from ckptbench.config.grid import Point, expand, search_templates
from ckptbench.config.layouts import parse_layout
from ckptbench.config.presets import PRESETS, preset_names
from ckptbench.errors import LayoutError

MAX_LAYERS = 4096  # far above any real LLaMA; keeps layout expansion cheap for absurd inputs
MAX_SEED = 2**32 - 1
MAX_NAME_CHARS = 100
MAX_GRID_POINTS = 100_000  # days of GPU time even for tiny points; guards against a typo'd grid


class ModelSpec(_Strict):
    """Which LLaMA to build: a preset plus optional LlamaConfig field overrides."""

    preset: str = "llama-7b"
    # Any LlamaConfig field, for example {num_hidden_layers: 16}; checked against LlamaConfig at build.
    overrides: dict[str, Any] = Field(default_factory=dict)
    # 'sdpa' (PyTorch scaled_dot_product_attention) or 'eager' (materialises the S x S attention matrix).
    attn_implementation: AttnImpl = "sdpa"

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            hint = difflib.get_close_matches(value, preset_names(), n=1)
            extra = f" (did you mean {hint[0]!r}?)" if hint else ""
            raise ValueError(f"unknown preset{extra}; allowed: {', '.join(preset_names())}")
        return value

    def resolved(self) -> dict[str, Any]:
        """The preset's fields with the overrides applied."""
        return {**PRESETS[self.preset], **self.overrides}

    @property
    def num_layers(self) -> int:
        return int(self.resolved()["num_hidden_layers"])

    @property
    def name(self) -> str:
        """The model's name in point keys: the preset, marked when overridden."""
        if not self.overrides:
            return self.preset
        return self.preset + "+" + ",".join(f"{k}={v}" for k, v in sorted(self.overrides.items()))


class LoraSpec(_Strict):
    """LoRA settings shared by every 'r<rank>' point."""

    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    alpha: float = Field(default=16.0, gt=0)


class SweepConfig(_Strict):
    """A whole sweep, as read from YAML and stored resolved in every run."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelSpec = Field(default_factory=ModelSpec)
    device: DeviceName = "auto"
    # Emulate a smaller card: cap the CUDA caching allocator (or the CPU tracker) at this many GiB.
    memory_cap_gib: float | None = Field(default=None, gt=0)
    # Warm-up steps are run (the first creates the optimizer state) and excluded from statistics.
    warmup_steps: int = Field(default=2, ge=1)
    measured_steps: int = Field(default=5, ge=1)
    optimizer: OptimizerName = "adamw_fused"
    # After each step gradients are freed (true, the default) or zeroed in place and kept (false).
    zero_grad_to_none: bool = True
    # Intra-op threads (torch.set_num_threads) while a CPU sweep measures; ignored on CUDA. 1 by default:
    # CPU sweeps run small models whose ops are too short to gain from threads; threads that wait for each
    # other at every op make a step 10-60x slower when another process takes a core (one thread does not);
    # and one thread sums in a fixed order, so losses are identical in every process. Raise it only for a
    # larger model on an otherwise idle machine (run.json records it as environment.torch_num_threads).
    cpu_threads: int = Field(default=1, ge=1, le=1024)
    lr: float = Field(default=1e-5, gt=0)
    # LoRA settings for the sweep's 'r<rank>' points.
    lora: LoraSpec = Field(default_factory=LoraSpec)
    seed: int = 0
    # Dense bf16 peak of the GPU for MFU/HFU; null picks it from the built-in table by GPU name.
    peak_tflops: float | None = Field(default=None, gt=0)
    # Largest allowed relative difference between a point's losses and its reference (the 'none'
    # layout's, or the first step's loss recomputed without checkpointing); null derives it from the
    # precision (bench/loss_check.py: fp32 1e-5, bf16 2**-8, fp16 2**-10).
    loss_rtol: float | None = Field(default=None, gt=0)
    # After a point runs out of memory, skip larger batch sizes of the same layout/seq/precision.
    skip_after_oom: bool = True
    # Searches (batch_size: max, layout: fit) keep peak reserved memory within this many GiB;
    # null means whatever runs without running out of memory (the card, or memory_cap_gib).
    budget_gib: float | None = Field(default=None, gt=0)
    # batch_size: max never probes beyond this batch size.
    search_max_batch: int = Field(default=1024, ge=1)
    sweep: SweepAxes = Field(default_factory=SweepAxes)
    # Explicit cells, added to the grid or replacing it (points_mode).
    points: list[PointSpec] = Field(default_factory=list)
    points_mode: Literal["add", "replace"] = "add"

    @field_validator("memory_cap_gib", "lr", "peak_tflops", "loss_rtol")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, value: int) -> int:
        if not 0 <= value <= MAX_SEED:
            raise ValueError(f"must be an integer from 0 to {MAX_SEED}")
        return value

    @field_validator("name")
    @classmethod
    def _short_name(cls, value: str) -> str:
        if len(value) > MAX_NAME_CHARS:  # it becomes part of a directory name
            raise ValueError(f"must be at most {MAX_NAME_CHARS} characters")
        return value

    @model_validator(mode="after")
    def _check_against_model(self) -> SweepConfig:
        resolved = self.model.resolved()
        num_layers = resolved.get("num_hidden_layers")
        if not isinstance(num_layers, int) or isinstance(num_layers, bool) or not 1 <= num_layers <= MAX_LAYERS:
            raise ValueError(
                "model.overrides.num_hidden_layers: must be an integer from 1 to "
                f"{MAX_LAYERS}, got {_shown(num_layers)}"
            )
        _check_grid_size(self.sweep)
        for i, layout in enumerate(self.sweep.layout):
            if layout != "fit":
                _check_layout(layout, num_layers, f"sweep.layout.{i}")
        if self.sweep.batch_size == "max" and "fit" in self.sweep.layout:
            raise ValueError("sweep: batch_size: max and layout: fit search different axes; use one at a time")
        for i, spec in enumerate(self.points):
            if spec.layout is not None:
                _check_layout(spec.layout, num_layers, f"points.{i}.layout")
        if any(p.layout == "fit" for p in self.points) or (
            self.sweep.batch_size == "max" and any(p.batch_size is None for p in self.points)
        ):
            raise ValueError("points: explicit points need a concrete layout and batch size, not a search")
        _check_seq_lens(self, resolved.get("max_position_embeddings"))
        if self.device == "cpu":
            check_cpu_compatible(self)
        return self

    def axis_values(self) -> dict[str, list[Any]]:
        """Every axis's values; unset optional axes take the single top-level value; searches excluded."""
        axes = self.sweep
        return {
            "precision": list(axes.precision),
            "lora": list(axes.lora),
            "layout": [x for x in axes.layout if x != "fit"],
            "seq_len": list(axes.seq_len),
            "batch_size": [] if axes.batch_size == "max" else list(axes.batch_size),
            "optimizer": list(axes.optimizer or [self.optimizer]),
            "micro_batches": list(axes.micro_batches),
            "offload": list(axes.offload),
            "compile": list(axes.compile),
            "attn_implementation": list(axes.attn_implementation or [self.model.attn_implementation]),
            "loss": list(axes.loss),
            "optimizer_in_backward": list(axes.optimizer_in_backward),
            "optimizer_offload": list(axes.optimizer_offload),
            "allocator": list(axes.allocator),
        }

    def points_list(self) -> list[Point]:
        """Expand the grid (and explicit points) into points, in execution order."""
        explicit = [spec.model_dump() for spec in self.points]
        replace = self.points_mode == "replace" and bool(self.points)
        return expand(self.model.name, self.axis_values(), explicit, replace_grid=replace)

    def search_templates(self) -> list[tuple[str, Point]]:
        """('batch_max' | 'layout_fit', template point) for every searched cell, in execution order."""
        kind = "batch_max" if self.sweep.batch_size == "max" else "layout_fit" if "fit" in self.sweep.layout else None
        return [] if kind is None else search_templates(self.model.name, self.axis_values(), kind)


def _check_layout(layout: str, num_layers: int, where: str) -> None:
    try:
        parse_layout(layout, num_layers)
    except LayoutError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_grid_size(axes: SweepAxes) -> None:
    size = math.prod(len(v) for v in axes.model_dump().values() if isinstance(v, list))
    if size > MAX_GRID_POINTS:
        raise ValueError(f"sweep: the grid has {size} points, more than {MAX_GRID_POINTS}; split it into several")


def _check_seq_lens(cfg: SweepConfig, max_pos: Any) -> None:
    if isinstance(max_pos, bool) or not isinstance(max_pos, int):
        return
    fields = [*(("sweep.seq_len", s) for s in cfg.sweep.seq_len)]
    fields += [(f"points.{i}.seq_len", p.seq_len) for i, p in enumerate(cfg.points) if p.seq_len]
    for where, seq in fields:
        if seq > max_pos:
            raise ValueError(
                f"{where}: {seq} exceeds the model's max_position_embeddings ({max_pos}); "
                "raise it in model.overrides or lower seq_len"
            )


def check_cpu_compatible(cfg: SweepConfig) -> None:
    """Raise ValueError for settings a CPU run cannot honour.

    A memory cap is allowed on CPU: the live-tensor tracker enforces it (an allocation past the
    cap raises an out-of-memory error, like a smaller card would).
    """
    points = cfg.points_list()
    checks = (
        ("precision", lambda v: v in ("fp16", "amp_fp16"), "is not supported on CPU; use bf16, amp_bf16 or fp32"),
        ("offload", lambda v: v != "none", "moves activations to host memory and needs a CUDA device"),
        ("compile", bool, "cannot run under the CPU memory tracker (a TorchDispatchMode); compile needs CUDA"),
        ("loss", lambda v: v == "fused_linear", "runs Triton kernels (Liger, cut-cross-entropy) and needs CUDA"),
        ("optimizer", lambda v: v == "adamw_8bit_torchao", "compiles its step (torchao) and needs CUDA"),
        ("optimizer_offload", lambda v: v != "none", "(torchao's CPUOffloadOptimizer) needs a CUDA device"),
        ("allocator", lambda v: v != "default", "configures the CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF) "
                                                 "and needs a CUDA device"),
    )
    for axis, bad, why in checks:
        found = sorted({getattr(p, axis) for p in points if bad(getattr(p, axis))})
        if found:
            raise ValueError(f"{_field_of(cfg, axis, found[0])}: {found[0]} {why}")


def _field_of(cfg: SweepConfig, axis: str, value: Any) -> str:
    """Where a value of a sweep axis comes from: an explicit point (points.N.<axis>) or sweep.<axis>."""
    for i, spec in enumerate(cfg.points):
        if getattr(spec, axis, None) == value:
            return f"points.{i}.{axis}"
    return f"sweep.{axis}"

def _shown(value: Any, limit: int = 60) -> str:
    """A short one-line repr of a user's value."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
