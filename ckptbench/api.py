"""The Python API: what the commands do, as functions returning data (README "Use from Python").

    from ckptbench import compare_runs, estimate, load_config, load_run, recommend, run_sweep

Each function is a thin door to the core (config/, estimator/, sweep/, results/, analysis/): it prints
nothing, and raises a :class:`~ckptbench.errors.CkptbenchError` subclass with a message a user can act
on (``ConfigError`` for bad input, ``ResultsError`` for an unreadable run, ...). The CLI calls the core
itself; nothing inside ckptbench imports this module (an import-linter contract).

``import ckptbench`` stays light (no torch, transformers nor pydantic): the core is imported when a
function is first called, and the types in the signatures come from ``TYPE_CHECKING`` imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ckptbench.json_object import JsonObject

if TYPE_CHECKING:
    from ckptbench.advise.plan import Plan
    from ckptbench.analysis.compare import Comparison
    from ckptbench.analysis.recommend import Recommendation
    from ckptbench.config.cluster import ClusterSpec
    from ckptbench.config.grid import Point
    from ckptbench.config.schema import SweepConfig
    from ckptbench.estimator.gpus import GpuModel
    from ckptbench.estimator.record import Estimate, EstimateProgress
    from ckptbench.measure.progress import Progress
    from ckptbench.results.store import Run
    from ckptbench.sweep.sweep import SweepOutcome


def load_config(
    source: str | Path | Mapping[str, Any] | SweepConfig, *, overrides: Mapping[str, Any] | None = None
) -> SweepConfig:
    """A validated, frozen sweep config from a YAML file, YAML text, a mapping or a config.

    ``source``: a ``Path`` or a ``str`` without a newline is a file (``"configs/tiny.yaml"``); a ``str``
    with a newline is YAML text; a mapping is the parsed YAML; a ``SweepConfig`` is taken as it is.
    ``overrides``: top-level fields that replace the source's (a whole ``sweep`` mapping replaces the
    source's grid); the result is validated again. A problem is a one-line ``ConfigError``.
    """
    from ckptbench.config import load
    from ckptbench.config.schema import SweepConfig

    if isinstance(source, SweepConfig):
        cfg = source
    elif isinstance(source, Mapping):
        cfg = load.parse_config(dict(source))
    elif isinstance(source, str) and "\n" in source:
        cfg = load.loads_config(source)
    else:
        cfg = load.load_config(source)
    if not overrides:
        return cfg
    # The resolved config round-trips through JSON (every run stores it so): dumped, updated, validated again.
    return load.parse_config({**cfg.model_dump(mode="json"), **overrides}, source=f"{cfg.name} with overrides")


@dataclass(frozen=True)
class SweepOptions:
    """How :func:`run_sweep` runs a config's points and where it writes them (``ckptbench sweep``'s options)."""

    out: Path | None = None  # the run directory (--out); default <results_root>/<name>-<timestamp>
    results_root: Path = Path("results")  # where a new run directory is made when ``out`` is not given
    resume: Path | None = None  # finish this interrupted or failed run of the same config (--resume)
    isolate: bool = False  # each point in a fresh process: a crash fails one point (--isolate)
    point_timeout_s: float | None = None  # with ``isolate``: kill a point running longer than this
    predict: bool = True  # record each point's estimated peak next to the measured one (--predict)
    cluster: ClusterSpec | None = None  # fan the points out as submitit jobs; default: the config's ``cluster``
    on_progress: Callable[[Progress], None] | None = None  # hears of every point as it starts and as it ends


def run_sweep(
    config: str | Path | Mapping[str, Any] | SweepConfig, options: SweepOptions | None = None
) -> SweepOutcome:
    """Run every point of ``config`` (anything :func:`load_config` reads): real training steps, measured.

    Writes ``run.json`` and ``points.jsonl`` into the run directory (``outcome.run_dir``) as each point
    ends; ``outcome.records`` are this call's point records, ``outcome.status`` how the run ended and
    ``outcome.failure`` why it failed although every point ran. Ctrl-C raises ``SweepInterrupted``
    (a ``KeyboardInterrupt`` saying where the finished points are; ``resume`` finishes the run).
    """
    from ckptbench.sweep.sweep import run_sweep as sweep

    opts = options or SweepOptions()
    return sweep(
        load_config(config), out=opts.out, results_root=opts.results_root, on_progress=opts.on_progress,
        resume=opts.resume, isolate=opts.isolate, point_timeout_s=opts.point_timeout_s, predict=opts.predict,
        cluster=opts.cluster,
    )


def estimate(
    config: str | Path | Mapping[str, Any] | SweepConfig,
    *,
    points: Sequence[Point] | None = None,
    target: Literal["cuda", "cpu"] | None = None,
    gpu: str | GpuModel | None = None,
    budget_gib: float | None = None,
    full: bool = False,
    on_progress: Callable[[EstimateProgress], None] | None = None,
    workers: int | None = None,
) -> list[Estimate]:
    """Predict, without a GPU, each point's peak allocated (and, on CUDA, reserved) memory (``ckptbench estimate``).

    ``config``: anything :func:`load_config` reads; ``points``: only these of its points
    (``config.points_list()``), else all of them in execution order. ``target``: ``"cuda"`` or ``"cpu"``
    (default: the device the config's sweep would run on). ``gpu``: the card whose allocator is replayed
    (``"h200"`` by default, ``"h100-80gb"``, ``"a100-80gb"``, ...). The budget each estimate is judged
    against is ``budget_gib``; for a whole config without it, the card's memory when ``gpu`` is given,
    else the config's ``memory_cap_gib``. ``full``: trace the whole model for every point (slow). ``workers``:
    the processes the traces and points are spread over (default: one per core; the estimates do not depend on it).
    """
    from ckptbench.estimator.estimator import estimate_config, estimate_points, resolve_target
    from ckptbench.units import parse_size

    cfg = load_config(config)
    budget_bytes = None if budget_gib is None else parse_size(f"{budget_gib}GiB", what="budget_gib")
    method: Literal["fast", "full"] = "full" if full else "fast"
    if points is None:
        return estimate_config(cfg, target=target, budget_bytes=budget_bytes, gpu=gpu, method=method,
                               on_progress=on_progress, workers=workers)
    return estimate_points(cfg, points, target=resolve_target(cfg, target), method=method, budget_bytes=budget_bytes,
                           gpu=gpu, on_progress=on_progress, workers=workers)


def load_run(run: str | Path, *, results_root: Path = Path("results")) -> Run:
    """A run directory (or a run name under ``results_root``): its run.json and the latest record per point.

    A truncated last line of points.jsonl is a warning (``run.warnings``), a run written by another
    schema version a ``ResultsError`` naming the ckptbench version that reads it.
    """
    from ckptbench.results.store import load_run as load

    return load(run, results_root=results_root)


def compare_runs(
    base: str | Path | Run,
    new: str | Path | Run,
    *,
    memory_tolerance_pct: float = 0.1,
    time_noise_pct: float = 2.0,
    fail_memory_pct: float | None = None,
    fail_time_pct: float | None = None,
    fail_oom: bool = False,
    allow_mixed_gpus: bool = False,
    allow_different: bool = False,
    results_root: Path = Path("results"),
) -> Comparison:
    """What changed from the ``base`` run to the ``new`` one (``ckptbench compare``): points matched by key.

    ``base``/``new``: loaded runs, run directories or run names under ``results_root``. A memory change
    up to ``memory_tolerance_pct`` percent is unchanged, a step-time change under ``time_noise_pct``
    percent is noise. The gates (``comparison.gate_failures``, ``gate_errors``) fire when peak allocated
    memory grows by more than ``fail_memory_pct``, step time by more than ``fail_time_pct``, or on a new
    OOM (``fail_oom``, implied by either percentage, as with the command).
    Runs of different models, on different devices or GPU models, or with no point in common raise
    ``NotComparableRuns`` (a gate must not pass on nothing) unless ``allow_different`` (the command's
    ``--allow-different``), which compares them and says so in ``comparison.notes``.
    ``comparison.to_dict()`` is the documented JSON shape.
    """
    from ckptbench.analysis.compare import Gates, Thresholds
    from ckptbench.analysis.compare import compare_runs as compare

    base_run, new_run = (r if not isinstance(r, str | Path) else load_run(r, results_root=results_root)
                         for r in (base, new))
    new_oom = fail_oom or fail_memory_pct is not None or fail_time_pct is not None
    thresholds = Thresholds(memory_rtol=memory_tolerance_pct / 100, time_rtol=time_noise_pct / 100)
    return compare(
        base_run, new_run, thresholds=thresholds,
        gates=Gates(memory_pct=fail_memory_pct, time_pct=fail_time_pct, new_oom=new_oom),
        allow_mixed_gpus=allow_mixed_gpus, allow_different=allow_different,
    )


def recommend(
    run: str | Path | Run,
    *,
    budget_gib: float,
    headroom: str | None = None,
    seq_len: int | None = None,
    results_root: Path = Path("results"),
) -> Recommendation:
    """The fastest measured point whose peak reserved memory fits the budget (``ckptbench recommend``).

    ``run``: a loaded run, a run directory or a run name under ``results_root``. ``headroom``: what is
    kept free under the budget, a share of it (``"5%"``, the default) or a size (``"2GiB"``). ``seq_len``: only points
    of this sequence length. ``rec.best`` is the answer (None when nothing fits), ``rec.why`` says why in
    a sentence, ``rec.pareto`` is the memory/throughput front; ``rec.to_json()`` is the JSON shape.
    """
    from ckptbench.analysis.recommend import recommend as best_fit
    from ckptbench.results.fit import DEFAULT_HEADROOM
    from ckptbench.units import parse_headroom, parse_size

    loaded = run if not isinstance(run, str | Path) else load_run(run, results_root=results_root)
    budget_bytes = parse_size(f"{budget_gib}GiB", what="budget_gib")
    headroom_bytes = parse_headroom(headroom or DEFAULT_HEADROOM, budget_bytes=budget_bytes)
    return best_fit(loaded, budget_bytes=budget_bytes, headroom_bytes=headroom_bytes, seq_len=seq_len)


def plan(
    model: Any,
    *,
    gpu: str = "a100-80gb",
    batch: int = 2,
    seq: int = 2048,
    precision: str = "bf16",
    optimizer: str = "adamw_fused",
    parallel: str = "none",
    headroom: str | None = None,
    budget: str | None = None,
    times_from: Sequence[str] = (),
    attention: str | None = None,
) -> Plan:
    """What to checkpoint for ``model`` on ``gpu`` at this batch and sequence length (``ckptbench advise``'s
    answer, as a typed :class:`~ckptbench.advise.plan.Plan`): the layout and its layers, the micro-batches, the
    predicted memory and step time with their labels, the margin and the sentence that chose it.

    ``model``: a preset name, a config.json or its folder, a Hugging Face id, a transformers ``PretrainedConfig``,
    or a transformers model (its config is read; nothing is run on it). ``gpu``: a card (``ckptbench gpus``) or a
    size ("24GiB"). ``precision``: "bf16" (pure, the default), "amp_bf16" (HF Trainer's bf16=True), ... ``parallel``:
    "ddp:N" or "fsdp2:N" (every figure per rank). ``headroom``: kept free under the budget (default "5%").
    ``attention``: "sdpa" or "eager" (transformers' attn_implementation; default: sdpa where the model's code has it).
    Apply it with :func:`apply`; check it with ``ckptbench.hf.PeakMemoryCallback``.
    """
    import json

    from ckptbench.advise.advice import advise
    from ckptbench.advise.plan import plan_of
    from ckptbench.advise.request import AdviseRequest
    from ckptbench.results.fit import DEFAULT_HEADROOM

    name, fields = _model_source(model)
    request = AdviseRequest(
        model=name, gpu=gpu, batches=(batch,), seqs=(seq,), precision=precision, optimizer=optimizer,
        parallel=parallel, headroom=headroom or DEFAULT_HEADROOM, budget=budget, times_from=tuple(times_from),
        attn=attention,
        model_fields_json=json.dumps(fields, sort_keys=True, default=str) if fields is not None else None,
    )
    return plan_of(advise(request))


def _model_source(model: Any) -> tuple[str, JsonObject | None]:
    """(a name, the config fields) of what ``plan`` was given: a string or path names a model; a transformers
    config or model gives its fields."""
    if isinstance(model, str | Path):
        return str(model), None
    config = getattr(model, "config", model)  # a model (also a peft one: its config is the base model's)
    to_dict = getattr(config, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(f"plan: give a preset, a path, a Hugging Face id, a PretrainedConfig or a model, not "
                        f"{type(model).__name__}")
    fields = dict(to_dict())
    name = str(getattr(config, "name_or_path", "") or fields.get("_name_or_path") or fields.get("model_type"))
    fields["_name_or_path"] = name
    return name, fields


def apply(model: Any, plan_or_layout: Plan | str) -> Any:
    """Apply a plan (or a layout such as "first:24") to a transformers model through its own checkpointing switches
    (activation_checkpointing_enable, then each decoder layer's ``gradient_checkpointing`` flag): exactly the plan's
    layers recompute in the backward. Returns the model. With HF Trainer keep ``gradient_checkpointing`` (or
    ``activation_checkpointing``) False in TrainingArguments: True turns every layer on again when training starts.
    Layouts of parts of layers (``all@mlp``) are not a transformers switch: ValueError (advise prints their code)."""
    from ckptbench.config.layouts import parse_layout
    from ckptbench.train.checkpointing import switch_layers
    from ckptbench.train.model import decoder_layers

    layout = plan_or_layout if isinstance(plan_or_layout, str) else plan_or_layout.layout
    switch_layers(model, parse_layout(layout, len(decoder_layers(model))))
    return model
