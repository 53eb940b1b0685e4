"""How long a sweep config will hold the GPU: an estimate from committed runs, to size the campaign's stages.

Everything is calibrated on measured points of the given runs (a LLaMA-7B bf16 step's time per token,
what recomputing every layer adds, the first step's extra time, what the runner spends per point and
per out-of-memory point) plus a linear memory model (peak reserved = static + batch x (checkpointed
part + unchecked share x per-layer part)) fitted to the same runs, which predicts the points that
will not fit and walks the searches (batch_size: max, layout: fit) through their probes. What no run
measured is a named constant below. The result is an estimate, printed as one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ckptbench.config.grid import AXIS_DEFAULTS, Point, key_without
from ckptbench.config.layouts import parse_layout
from ckptbench.config.presets import PRESETS
from ckptbench.config.schema import SweepConfig
from ckptbench.results.record import PointRecord
from ckptbench.results.store import Run
from ckptbench.search.searches import BatchMaxSearch, LayoutFitSearch, make_searches

GIB = 2**30
# Per `ckptbench sweep` process beyond the runner's own wall time (imports, CUDA start, predictions of a few
# shapes): results/h200-gpu-check-2/gpu_check.log shows 92 s for a 77 s sweep, -1/gpu_check.log 151 s for 131 s.
SWEEP_PROCESS_S = 15.0
# Predicting a new (precision, seq, batch) shape: one short-model trace on the CPU, single-threaded (measured
# here: 16 shapes of LLaMA-7B in 26 s); grid points are predicted up front, search probes as they come.
PREDICT_SHAPE_S = 1.6
COMPILE_S = 90.0  # assumed torch.compile time of a LLaMA-7B step: no committed run has measured it yet
# A sharded point (parallel ddp:N, fsdp2:N) runs in fresh processes, one per rank: Python with torch and
# transformers imported, a CUDA context and NCCL's start, before its own model build and first step.
# Assumed: no committed run has measured a sharded point yet.
POINT_PROCESS_S = 20.0
OFFLOAD_FACTOR = {"all": 5.4, "ckpt_inputs": 1.1}  # step-time factors measured in results/h200-gpu-check-1/axes
OFFLOAD_FIRST_S = 37.0  # the first offloading step pins host memory: 39.6 s vs 2.2 s (the same run)
PRECISION_FACTOR = {"fp32": 4.0}  # no tensor-core bf16 matmuls: assumed, never measured here
CALIBRATION_SEQ, CALIBRATION_LAYERS = 2048, 32  # the calibration runs are LLaMA-7B at seq 2048
MAX_PROBES = 100


@dataclass(frozen=True)
class Calibration:
    """What one point costs, measured on committed runs (LLaMA-7B, bf16)."""

    per_token_s: float  # fitted: step time per token without checkpointing
    recompute_per_token_s: float  # fitted: what checkpointing every layer adds per token
    first_step_s: float  # the sweep's very first warm-up step's extra time (CUDA kernels, cuBLAS start)
    point_s: float  # runner time per point beyond its steps (median: reset, loss check, cleanup)
    oom_s: float  # wall time of a point that runs out of memory
    build_s: float  # building the model (once per precision and LoRA setting)
    static_bytes: float  # fitted: peak reserved at batch 0
    ckpt_per_sample: float  # fitted: bytes per sample with every layer checkpointed
    layers_per_sample: float  # fitted: extra bytes per sample when no layer is checkpointed
    card_bytes: int


def _plain_block(rec: PointRecord) -> bool:
    plain = all(rec.key.get(k, v) == v for k, v in AXIS_DEFAULTS.items())
    return rec.ok and plain and (rec.plan or {}).get("granularity", "block") == "block"


def _share(rec: PointRecord) -> float:
    return (rec.num_checkpointed or 0) / CALIBRATION_LAYERS


def calibrate(runs: Sequence[Run]) -> Calibration:
    """Fit the calibration on the runs' plain LLaMA-7B whole-layer points (seq 2048)."""
    recs = [r for run in runs for r in run.points if r.key.get("model") == "llama-7b"]
    fit = [r for r in recs if _plain_block(r) and r.key.get("seq_len") == CALIBRATION_SEQ]
    tokens = np.array([float(r.tokens_per_step or 0) for r in fit])
    share = np.array([_share(r) for r in fit])
    steps = np.array([r.median_step_time_s or 0.0 for r in fit])
    time_coef = np.linalg.lstsq(np.stack([tokens, tokens * share], 1), steps, rcond=None)[0]
    mem = np.array([float(r.peak_reserved_bytes or 0) for r in fit])
    samples = tokens / CALIBRATION_SEQ
    mem_coef = np.linalg.lstsq(np.stack([np.ones_like(samples), samples, samples * (1 - share)], 1), mem,
                               rcond=None)[0]
    first = recs[0]
    spare = [r.wall_s - sum(r.warmup_times_s) - sum(r.step_times_s) for r in recs[1:] if r.ok and r.wall_s]
    return Calibration(
        per_token_s=float(time_coef[0]), recompute_per_token_s=float(time_coef[1]),
        first_step_s=max(0.0, (first.warmup_times_s or [0.0])[0] - (first.median_step_time_s or 0.0)),
        point_s=float(np.median(spare)) if spare else 0.5,
        oom_s=max((r.wall_s for r in recs if r.status == "oom" and r.wall_s), default=5.0),
        build_s=max((r.model_build_s or 0.0 for r in recs), default=1.0),
        static_bytes=float(mem_coef[0]), ckpt_per_sample=float(mem_coef[1]), layers_per_sample=float(mem_coef[2]),
        card_bytes=int(runs[0].environment.gpu_total_memory_bytes or 80 * GIB),
    )


@dataclass(frozen=True)
class ModelScale:
    """How the config's model and precision compare with the calibration's LLaMA-7B in bf16."""

    time: float  # matmul parameters over 7B's
    static: float  # bytes of parameters, gradients and optimizer state over 7B bf16's
    activation: float  # hidden size x layers over 7B's
    layers: int

    @classmethod
    def of(cls, cfg: SweepConfig, precision: str) -> ModelScale:
        m, ref = cfg.model.resolved(), PRESETS["llama-7b"]

        def params(c: dict[str, object]) -> float:
            h, i, n, v = (float(str(c[k])) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                       "vocab_size"))
            return n * (4 * h * h + 3 * h * i) + 2 * v * h

        wide = 2.0 if precision in ("fp32", "amp_bf16", "amp_fp16") else 1.0  # fp32 parameters and AdamW state
        act = 2.0 if precision == "fp32" else 1.0
        shape = float(m["hidden_size"]) * float(m["num_hidden_layers"])
        return cls(params(m) / params(ref), wide * params(m) / params(ref),
                   act * shape / (float(ref["hidden_size"]) * float(ref["num_hidden_layers"])),
                   int(m["num_hidden_layers"]))


def step_seconds(cal: Calibration, cfg: SweepConfig, p: Point) -> float:
    scale = ModelScale.of(cfg, p.precision)
    share = len(parse_layout(p.layout, scale.layers).layers) / scale.layers
    tokens = p.tokens / p.world_size  # each rank runs its own batch at the same time
    step = tokens * scale.time * (cal.per_token_s + cal.recompute_per_token_s * share)
    return step * OFFLOAD_FACTOR.get(p.offload, 1.0) * PRECISION_FACTOR.get(p.precision, 1.0)


def point_seconds(cal: Calibration, cfg: SweepConfig, p: Point) -> float:
    """A point that runs: its warm-up and measured steps, the runner's share, compile, and a sharded
    point's own processes (their start, the model build and the first step's start-up)."""
    steps = (cfg.warmup_steps + cfg.measured_steps) * step_seconds(cal, cfg, p)
    own = POINT_PROCESS_S + cal.build_s + cal.first_step_s if p.parallel != "none" else 0.0
    return steps + cal.point_s + (COMPILE_S if p.compile else 0.0) + own


def predicted_reserved(cal: Calibration, cfg: SweepConfig, p: Point) -> float:
    """Peak reserved bytes from the linear memory model (an estimate)."""
    scale = ModelScale.of(cfg, p.precision)
    unchecked = 1 - len(parse_layout(p.layout, scale.layers).layers) / scale.layers
    samples = p.batch_size * p.seq_len / CALIBRATION_SEQ  # one micro-batch's activations
    per_sample = cal.ckpt_per_sample + (0.0 if p.offload == "all" else unchecked * cal.layers_per_sample)
    return cal.static_bytes * scale.static + samples * scale.activation * per_sample


@dataclass
class SweepTime:
    """The estimate for one config: points run, out-of-memory points, search probes, seconds."""

    name: str
    runs: int = 0
    ooms: int = 0
    probes: int = 0
    seconds: float = SWEEP_PROCESS_S
    shapes: set[tuple[object, ...]] = field(default_factory=set)  # predicted (each one trace)

    def describe(self) -> str:
        what = f"{self.runs} points run, {self.ooms} out of memory" + (f" ({self.probes} search probes)"
                                                                        if self.probes else "")
        return f"{self.name}: about {self.seconds:.0f} s of GPU time (estimate: {what})"


def estimate_sweep(cal: Calibration, cfg: SweepConfig) -> SweepTime:
    """The GPU time of ``ckptbench sweep cfg`` (an estimate; see the module docstring)."""
    cap = cfg.memory_cap_gib * GIB if cfg.memory_cap_gib else cal.card_bytes
    out = SweepTime(cfg.name, seconds=SWEEP_PROCESS_S + _once(cal, [*cfg.points_list(),
                                                                   *(s.template for s in make_searches(cfg))]))
    failed: set[tuple[object, ...]] = set()
    for p in cfg.points_list():
        group = key_without(p, "batch_size")
        if cfg.skip_after_oom and group in failed:  # the runner records it as skipped, at no cost
            continue
        fits = predicted_reserved(cal, cfg, p) <= cap
        _charge(out, cal, cfg, p, fits=fits)
        if not fits:
            failed.add(group)
    budget = int(cfg.budget_gib * GIB) if cfg.budget_gib else None
    for search in make_searches(cfg):
        _walk(out, cal, cfg, search, cap=cap, budget=budget)
    out.seconds += PREDICT_SHAPE_S * len(out.shapes)
    return out


def _once(cal: Calibration, points: Sequence[Point]) -> float:
    """Per sweep: the first step's start-up, model builds, pinning host memory."""
    builds = len({(p.precision, p.lora) for p in points})
    pinned = OFFLOAD_FIRST_S if any(p.offload != "none" for p in points) else 0.0
    return cal.first_step_s + cal.build_s * builds + pinned


def _charge(out: SweepTime, cal: Calibration, cfg: SweepConfig, p: Point, *, fits: bool) -> None:
    out.shapes.add((p.precision, p.seq_len, p.batch_size, p.micro_batches))
    if fits:
        out.runs, out.seconds = out.runs + 1, out.seconds + point_seconds(cal, cfg, p)
    else:
        out.ooms, out.seconds = out.ooms + 1, out.seconds + cal.oom_s


def _walk(out: SweepTime, cal: Calibration, cfg: SweepConfig, search: BatchMaxSearch | LayoutFitSearch, *,
          cap: float, budget: int | None) -> None:
    """Play the search with the memory model as the oracle, charging every probe."""
    for _ in range(MAX_PROBES):
        p = search.next_point(budget)
        if p is None:
            return
        peak = predicted_reserved(cal, cfg, p)
        _charge(out, cal, cfg, p, fits=peak <= cap)
        out.probes += 1
        ok = peak <= cap
        rec = PointRecord(key=p.key, status="ok" if ok else "oom", peak_reserved_bytes=int(peak) if ok else None,
                          peak_allocated_bytes=int(peak) if ok else None)
        search.observe(p, rec, budget)

