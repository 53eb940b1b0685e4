"""YAML -> validated, frozen sweep config -> grid of points. Never imports torch."""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ckptbench.errors import ConfigError, LayoutError
from ckptbench.layouts import parse_layout
from ckptbench.presets import PRESETS, preset_names

Precision = Literal["bf16", "fp16", "fp32", "amp_bf16", "amp_fp16"]
OptimizerName = Literal["adamw_fused", "adamw_foreach", "sgd"]
DeviceName = Literal["auto", "cuda", "cpu"]
AttnImpl = Literal["sdpa", "eager"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


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


class SweepAxes(_Strict):
    """The grid: its cells are the cartesian product of these lists."""

    layout: list[str] = Field(default_factory=lambda: ["none"], min_length=1)
    batch_size: list[int] = Field(default_factory=lambda: [1], min_length=1)
    seq_len: list[int] = Field(default_factory=lambda: [512], min_length=1)
    precision: list[Precision] = Field(default_factory=lambda: ["bf16"], min_length=1)

    @field_validator("batch_size", "seq_len")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        for v in values:
            if v < 1:
                raise ValueError(f"must be positive integers, got {v}")
        return values


class PointSpec(_Strict):
    """One explicit cell; unset fields take the first value of the matching sweep axis."""

    layout: str | None = None
    batch_size: int | None = Field(default=None, ge=1)
    seq_len: int | None = Field(default=None, ge=1)
    precision: Precision | None = None


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
    lr: float = Field(default=1e-5, gt=0)
    seed: int = 0
    # Dense bf16 peak of the GPU for MFU/HFU; null picks it from the built-in table by GPU name.
    peak_tflops: float | None = Field(default=None, gt=0)
    # Largest allowed relative difference between a layout's losses and the 'none' layout's.
    loss_rtol: float = Field(default=1e-2, gt=0)
    # After a point runs out of memory, skip larger batch sizes of the same layout/seq/precision.
    skip_after_oom: bool = True
    sweep: SweepAxes = Field(default_factory=SweepAxes)
    # Explicit cells, added to the grid or replacing it (points_mode).
    points: list[PointSpec] = Field(default_factory=list)
    points_mode: Literal["add", "replace"] = "add"

    @model_validator(mode="after")
    def _check_against_model(self) -> SweepConfig:
        resolved = self.model.resolved()
        num_layers = resolved.get("num_hidden_layers")
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"model.overrides.num_hidden_layers must be a positive integer, got {num_layers!r}")
        for i, layout in enumerate(self.sweep.layout):
            _check_layout(layout, num_layers, f"sweep.layout.{i}")
        for i, spec in enumerate(self.points):
            if spec.layout is not None:
                _check_layout(spec.layout, num_layers, f"points.{i}.layout")
        max_pos = resolved.get("max_position_embeddings")
        seqs = [*self.sweep.seq_len, *(p.seq_len for p in self.points if p.seq_len)]
        if isinstance(max_pos, int) and any(s > max_pos for s in seqs):
            raise ValueError(
                f"seq_len {max(seqs)} exceeds the model's max_position_embeddings ({max_pos}); "
                "raise it in model.overrides or lower seq_len"
            )
        if self.device == "cpu":
            check_cpu_compatible(self)
        return self

    def points_list(self) -> list[Point]:
        """Expand the grid (and explicit points) into points, in execution order."""
        return expand(self)


def _check_layout(layout: str, num_layers: int, where: str) -> None:
    try:
        parse_layout(layout, num_layers)
    except LayoutError as exc:
        raise ValueError(f"{where}: {exc}") from None


def check_cpu_compatible(cfg: SweepConfig) -> None:
    """Raise ValueError for settings a CPU run cannot honour."""
    precisions = {*cfg.sweep.precision, *(p.precision for p in cfg.points if p.precision)}
    fp16 = sorted(p for p in precisions if p in ("fp16", "amp_fp16"))
    if fp16:
        raise ValueError(f"sweep.precision: {fp16[0]} is not supported on CPU; use bf16, amp_bf16 or fp32")


@dataclass(frozen=True, order=True)
class Point:
    """One cell of the grid. ``key`` identifies it across runs."""

    precision: str
    layout: str
    seq_len: int
    batch_size: int
    model: str
    optimizer: str

    @property
    def key(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "layout": self.layout,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "precision": self.precision,
            "optimizer": self.optimizer,
        }

    @property
    def key_id(self) -> str:
        """A stable string form of the key, for matching and display."""
        return key_id(self.key)

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


def key_id(key: dict[str, Any]) -> str:
    """Stable text of a key dict: 'batch_size=2|layout=all|...' (sorted by field)."""
    return "|".join(f"{k}={key[k]}" for k in sorted(key))


def expand(cfg: SweepConfig) -> list[Point]:
    """Grid (unless replaced) plus explicit points, de-duplicated, ordered for model reuse.

    Precision is the outer loop (the model is rebuilt only when it changes) and batch size
    the inner one, ascending, so a layout that runs out of memory can skip larger batches.
    """
    axes = cfg.sweep
    cells: set[tuple[str, str, int, int]] = set()
    if cfg.points_mode == "add" or not cfg.points:
        cells.update(itertools.product(axes.precision, axes.layout, axes.seq_len, axes.batch_size))
    for spec in cfg.points:
        cells.add(
            (
                spec.precision or axes.precision[0],
                spec.layout or axes.layout[0],
                spec.seq_len or axes.seq_len[0],
                spec.batch_size or axes.batch_size[0],
            )
        )
    order_p = {p: i for i, p in enumerate(axes.precision)}
    # 'none' runs first in each cell: its losses are the reference the other layouts must match.
    order_l = {layout: i for i, layout in enumerate(axes.layout)}
    order_l["none"] = -1

    def sort_key(c: tuple[str, str, int, int]) -> tuple[int, int, str, int, int]:
        return (order_p.get(c[0], len(order_p)), order_l.get(c[1], len(order_l)), c[1], c[2], c[3])

    return [
        Point(precision=p, layout=lay, seq_len=s, batch_size=b, model=cfg.model.name, optimizer=cfg.optimizer)
        for p, lay, s, b in sorted(cells, key=sort_key)
    ]


def _format_loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(x) for x in loc) or "(top level)"


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """Valid field names of the model that owns ``loc`` (for 'did you mean')."""
    model: Any = SweepConfig
    for part in loc[:-1]:
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return []
        model = field.annotation
    return list(getattr(model, "model_fields", {}))


def _error_line(source: str, err: dict[str, Any]) -> str:
    loc = tuple(err.get("loc", ()))
    where = _format_loc(loc)
    if err.get("type") == "extra_forbidden":
        hint = difflib.get_close_matches(str(loc[-1]), _fields_at(loc), n=1) if loc else []
        extra = f"; did you mean {hint[0]!r}?" if hint else ""
        return f"{source}: unknown field {where!r}{extra}"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    given = err.get("input")
    shown = "" if isinstance(given, dict | list) or err.get("type") == "missing" else f" (got {given!r})"
    return f"{source}: {where}: {msg}{shown}"


def parse_config(data: Any, *, source: str = "config") -> SweepConfig:
    """Validate already-parsed YAML data; raise ConfigError with one line naming the field."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping of fields, got {type(data).__name__}")
    try:
        return SweepConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_error_line(source, exc.errors()[0])) from None


def load_config(path: str | Path) -> SweepConfig:
    """Read and validate a YAML config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such config file") from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read config file ({exc.__class__.__name__}: {exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{p}: invalid YAML{where}: {problem}") from None
    return parse_config(data, source=str(p))
