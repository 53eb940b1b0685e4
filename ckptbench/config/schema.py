"""The whole sweep config: model, run settings and axes, validated and frozen. Never imports torch."""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import attrgetter
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from ckptbench.config.axes import MAX_BATCH, DeviceName, OptimizerName, _Strict
from ckptbench.config.cluster import ClusterSpec
from ckptbench.config.compat import cuda_need, cuda_only_axes, first_refused
from ckptbench.config.grid import AXES, Point, axis_named, expand, search_templates
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.model import (
    MAX_STEP_FLOPS,
    LoraSpec,
    ModelSpec,
    attention_refusal,
    check_lora,
    step_flops_bound,
)
from ckptbench.config.parallel import world_size
from ckptbench.config.sweep_axes import PointSpec, SweepAxes
from ckptbench.errors import LayoutError
from ckptbench.json_object import JsonObject

MAX_SEED = 2**32 - 1
MAX_NAME_CHARS = 100
MAX_GRID_POINTS = 100_000  # days of GPU time even for tiny points; guards against a typo'd grid
MAX_STEPS = 100_000  # warm-up or measured steps per point: beyond this a point never ends


class SweepConfig(_Strict):
    """A whole sweep, as read from YAML and stored resolved in every run."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    model: ModelSpec = Field(default_factory=ModelSpec)
    device: DeviceName = "auto"
    # Emulate a smaller card: cap the CUDA caching allocator (or the CPU tracker) at this many GiB.
    memory_cap_gib: float | None = Field(default=None, gt=0)
    # Warm-up steps are run (the first creates the optimizer state) and excluded from statistics.
    warmup_steps: int = Field(default=2, ge=1, le=MAX_STEPS)
    measured_steps: int = Field(default=5, ge=1, le=MAX_STEPS)
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
    # precision (measure/loss_check.py: fp32 1e-5, bf16 2**-8, fp16 2**-10).
    loss_rtol: float | None = Field(default=None, gt=0)
    # After a point runs out of memory, skip larger batch sizes of the same layout/seq/precision.
    skip_after_oom: bool = True
    # Searches (batch_size: max, layout: fit) keep peak reserved memory within this many GiB;
    # null means whatever runs without running out of memory (the card, or memory_cap_gib).
    budget_gib: float | None = Field(default=None, gt=0)
    # batch_size: max never probes beyond this batch size.
    search_max_batch: int = Field(default=1024, ge=1, le=MAX_BATCH)
    sweep: SweepAxes = Field(default_factory=SweepAxes)
    # Explicit cells, added to the grid or replacing it (points_mode).
    points: list[PointSpec] = Field(default_factory=list)
    points_mode: Literal["add", "replace"] = "add"
    # Where points run: in the sweep's process (executor: none), or as submitit jobs on the GPUs of this
    # node (local) or on Slurm (slurm). Never changes what is measured (docs/cluster.md).
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)

    @field_validator("points", mode="before")
    @classmethod
    def _not_too_many(cls, value: Any) -> Any:
        # Before each entry is validated: a list of ten million points is refused in a blink.
        if isinstance(value, list) and len(value) > MAX_GRID_POINTS:
            raise ValueError(f"{len(value)} explicit points, more than {MAX_GRID_POINTS}; split them into several")
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
        num_layers = int(resolved["num_hidden_layers"])
        _check_grid_size(self)
        _check_layouts(self, num_layers)
        if self.sweep.batch_size == "max" and "fit" in self.sweep.layout:
            raise ValueError("sweep: batch_size: max and layout: fit search different axes; use one at a time")
        if any(p.layout == "fit" for p in self.points) or (
            self.sweep.batch_size == "max" and any(p.batch_size is None for p in self.points)
        ):
            raise ValueError("points: explicit points need a concrete layout and batch size, not a search")
        _check_seq_lens(self, resolved.get("max_position_embeddings"))
        _check_attention(self)
        points = self.points_list()  # expanded once for both checks
        _check_combinations(self, points)
        if self.device == "cpu":
            check_cpu_compatible(self, points)
        _check_work(self, resolved)
        return self

    def axis_values(self) -> dict[str, list[Any]]:
        """Every axis's values; unset optional axes take the config's setting they fall back to; searches
        excluded."""
        values: dict[str, list[Any]] = {}
        for name in AXES:
            axis, listed = axis_named(name), getattr(self.sweep, name)
            if listed is None:
                listed = [attrgetter(str(axis.fallback))(self)]
            values[name] = [] if listed == axis.search else [v for v in listed if v != axis.search]
        return values

    def points_list(self) -> list[Point]:
        """Expand the grid (and explicit points) into points, in execution order."""
        explicit = [spec.model_dump() for spec in self.points]
        replace = self.points_mode == "replace" and bool(self.points)
        return expand(
            self.model.name, self.axis_values(), explicit, replace_grid=replace, architecture=self.model.architecture
        )

    def with_parallel(self, parallel: str) -> SweepConfig:
        """The same sweep with every point spread as ``parallel`` (``estimate --parallel fsdp2:8``)."""
        data = self.model_dump(mode="json")
        data["sweep"]["parallel"] = [parallel]
        for spec in data["points"]:
            spec["parallel"] = None
        return SweepConfig.model_validate(data)

    def search_templates(self) -> list[tuple[str, Point]]:
        """('batch_max' | 'layout_fit', template point) for every searched cell, in execution order."""
        kind = "batch_max" if self.sweep.batch_size == "max" else "layout_fit" if "fit" in self.sweep.layout else None
        if kind is None:
            return []
        return search_templates(self.model.name, self.axis_values(), kind, architecture=self.model.architecture)


def _plan(layout: str, num_layers: int, where: str) -> LayoutPlan:
    try:
        return parse_layout(layout, num_layers)
    except LayoutError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _check_layouts(cfg: SweepConfig, num_layers: int) -> None:
    """Every layout parses for this model, and no two spellings checkpoint the same thing.

    'all', 'range:0-7' and 'first:8' on 8 layers would be three points measuring one plan (under three
    keys that compare and --resume treat as different): refused, naming both. The same spelling again
    is fine in explicit points (other batch sizes), not in sweep.layout (it would be the same points).
    """
    seen: dict[tuple[Any, ...], tuple[str, str]] = {}  # what a plan checkpoints -> (where, spelling)
    named = [(f"sweep.layout.{i}", x) for i, x in enumerate(cfg.sweep.layout) if x != "fit"]
    named += [(f"points.{i}.layout", p.layout) for i, p in enumerate(cfg.points) if p.layout not in (None, "fit")]
    for where, layout in named:
        plan = _plan(layout, num_layers, where)
        what = (plan.layers, plan.granularity if plan.layers else "")
        first = seen.setdefault(what, (where, layout))
        if first[1] != layout or (first[0] != where and where.startswith("sweep.")):
            raise ValueError(
                f"{where}: {layout!r} checkpoints the same as {first[0]} {first[1]!r} ({plan.describe()}); "
                f"list each layout once (use {first[1]!r})"
            )


def _check_grid_size(cfg: SweepConfig) -> None:
    """The grid's cells plus the explicit points stay within MAX_GRID_POINTS."""
    replaced = cfg.points_mode == "replace" and bool(cfg.points)
    grid = 0 if replaced else math.prod(len(v) for v in cfg.sweep.model_dump().values() if isinstance(v, list))
    if grid + len(cfg.points) > MAX_GRID_POINTS:
        parts = f"the grid has {grid} and points adds {len(cfg.points)}" if cfg.points else f"the grid has {grid}"
        raise ValueError(f"sweep: {parts} points, more than {MAX_GRID_POINTS}; split it into several")


def _check_work(cfg: SweepConfig, resolved: JsonObject) -> None:
    """The largest step of the config (the axes' largest values together; a batch_size: max search at
    search_max_batch) stays within int64 FLOPs, which its record stores; LoRA adapters name modules of the
    model and fit its width."""
    values = cfg.axis_values()
    specs = list(cfg.points)

    def largest(axis: str, default: int) -> int:
        found = [*values[axis], *(getattr(p, axis) for p in specs if getattr(p, axis, None) is not None)]
        return max((int(v) for v in found), default=default)

    batch = max(largest("batch_size", 1), cfg.search_max_batch if cfg.sweep.batch_size == "max" else 1)
    seq, micro = largest("seq_len", 1), largest("micro_batches", 1)
    ranks_of = [world_size(v) for v in [*values["parallel"], *(p.parallel for p in specs if p.parallel)]]
    tokens = batch * seq * micro * max(ranks_of, default=1)
    if step_flops_bound(resolved, tokens=tokens, seq_len=seq) > MAX_STEP_FLOPS:
        raise ValueError(
            f"sweep: a step of batch {batch} x seq_len {seq} x micro_batches {micro} on this model is more work "
            "than a record can count (its FLOPs overflow an int64); lower batch_size, seq_len, micro_batches "
            "or the model's sizes"
        )
    loras = sorted({str(v) for v in [*values["lora"], *(p.lora for p in specs if p.lora)] if v != "none"})
    if loras:
        try:
            check_lora(resolved, list(cfg.lora.target_modules), sorted(int(v[1:]) for v in loras))
        except ValueError as exc:
            rank = max(loras, key=lambda v: int(v[1:]))
            where = "" if str(exc).startswith("lora.") else f"{_field_of(cfg, 'lora', rank)}: "
            raise ValueError(f"{where}{exc}") from None


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


def _check_attention(cfg: SweepConfig) -> None:
    """Every attention implementation the sweep names is one the model's family supports (Gemma-2: eager)."""
    family = cfg.model.family
    for impl in [*(cfg.sweep.attn_implementation or []), *(p.attn_implementation for p in cfg.points)]:
        if impl is not None and impl not in family.attention:
            raise ValueError(attention_refusal(family, impl, _field_of(cfg, "attn_implementation", impl)))


def _check_combinations(cfg: SweepConfig, points: Sequence[Point]) -> None:
    """No point combines techniques that config/compat.py refuses at load (sharded points with offloading, compile,
    an offloaded optimizer; DDP with the optimizer in backward): refused naming the field of the rule's first axis."""
    found = first_refused(points, ("load",))
    if found is not None:
        point, rule = found
        field = rule.axes[0]
        raise ValueError(f"{_field_of(cfg, field, getattr(point, field))}: {rule.why(point)}")


def check_cpu_compatible(cfg: SweepConfig, points: Sequence[Point] | None = None) -> None:
    """Raise ValueError for settings a CPU run cannot honour: the values their axes declare CUDA-only.

    A memory cap is allowed on CPU: the live-tensor tracker enforces it (an allocation past the
    cap raises an out-of-memory error, like a smaller card would).
    """
    points = cfg.points_list() if points is None else points
    for axis in cuda_only_axes():
        found = sorted({getattr(p, axis) for p in points if cuda_need(axis, getattr(p, axis)) is not None})
        if found:
            raise ValueError(f"{_field_of(cfg, axis, found[0])}: {cuda_need(axis, found[0])}")
    if cfg.sweep.batch_size == "max" and cfg.memory_cap_gib is None:
        # The search doubles the batch until memory runs out: on a CPU that is the host's (b=128 took 5.4 GB
        # and the machine with it), not a card's; the tracker enforces a cap like a smaller card would.
        raise ValueError(
            "sweep.batch_size: max on a CPU needs memory_cap_gib (the search doubles the batch until memory runs "
            "out, and on a CPU that is the host's memory), e.g. memory_cap_gib: 0.5"
        )


def _field_of(cfg: SweepConfig, axis: str, value: Any) -> str:
    """Where a value of a sweep axis comes from: an explicit point (points.N.<axis>) or sweep.<axis>."""
    for i, spec in enumerate(cfg.points):
        if getattr(spec, axis, None) == value:
            return f"points.{i}.{axis}"
    return f"sweep.{axis}"

