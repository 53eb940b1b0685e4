"""Execute points: build/reuse the model, warm up, measure, handle OOM and leaks, report progress."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptbench.bench import faults
from ckptbench.bench.device import is_fatal_device_error
from ckptbench.bench.environment import available_cpus, host_state, intra_op_threads
from ckptbench.bench.loss_check import LossReferences, loss_rtol
from ckptbench.bench.predictions import Predictions
from ckptbench.bench.probes import Probe
from ckptbench.bench.search import Search
from ckptbench.bench.window import measure_point, recompute_first_loss
from ckptbench.config.grid import Point, key_without
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import RunFailure
from ckptbench.results.record import PointRecord
from ckptbench.train.flops import peak_tflops_for, step_flops
from ckptbench.train.model import apply_lora, build_model, llama_config, model_shape, warm_device_libraries
from ckptbench.train.step import param_dtype
from ckptbench.train.unavailable import TechniqueUnavailable

LEAK_TOLERANCE_BYTES = 1 << 20  # 1 MiB: allocator bookkeeping and tiny caches stay below it

_PROBES_GUESS = 6  # probes a search usually needs; the progress total grows if it needs more


@dataclass
class _Counter:
    total: int
    done: int = 0

    def next(self) -> int:
        self.done += 1
        self.total = max(self.total, self.done)
        return self.done - 1


@dataclass(frozen=True)
class Progress:
    """A progress event: a point started (record is None) or finished."""

    index: int
    total: int
    point: Point
    record: PointRecord | None = None


@dataclass
class _ModelSlot:
    """The one live model; rebuilt only when the precision (parameter dtype) changes."""

    precision: tuple[str, str] | None = None  # (precision, lora)
    model: Any = None
    build_s: float | None = None


@dataclass
class Runner:
    """Runs a list of points on one device, one model at a time, and yields a record per point."""

    cfg: SweepConfig
    device: torch.device
    probe: Probe
    gpu_name: str | None = None
    _slot: _ModelSlot = field(default_factory=_ModelSlot)
    _losses: LossReferences = field(default_factory=LossReferences)
    _oom_at: dict[tuple[Any, ...], int] = field(default_factory=dict)
    _done: dict[str, PointRecord] = field(default_factory=dict)
    _broken: bool = False  # a fatal device error happened: no more CUDA calls
    # Predicted peak bytes by key_id, asked for as each point starts (bench/predictions.py may make
    # them in the background; ``get`` waits for one that is still being made).
    predictions: Predictions = field(default_factory=dict[str, "int | None"])
    # Predicts a search probe just before it runs (probes are not known up front); None: no prediction.
    predict: Callable[[Point], int | None] | None = None
    _probe_predictions: dict[str, int | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.llama = llama_config(self.cfg.model)
        self.shape = model_shape(self.llama)
        self.peak_tflops = self.cfg.peak_tflops or peak_tflops_for(self.gpu_name)
        self.cpus = available_cpus()

    def run(
        self,
        points: list[Point],
        on_record: Callable[[Progress], None],
        searches: Sequence[Search] = (),
    ) -> list[dict[str, Any]]:
        """Measure every point in order, then run the searches; report each start and finish.

        Returns the searches' outcomes. A search probe that equals an already measured point reuses
        that point's record instead of measuring it twice. A failed point is recorded and the sweep
        goes on, except after a fatal device error (the CUDA context is unusable): that point is
        recorded, then RunFailure stops the sweep.
        """
        counter = _Counter(total=len(points) + _PROBES_GUESS * len(searches))
        try:
            with intra_op_threads(self.device.type, self.cfg.cpu_threads):
                for point in points:
                    self._report(point, counter, on_record, search=False)
                budget = int(self.cfg.budget_gib * 2**30) if self.cfg.budget_gib else None
                outcomes = []
                for search in searches:
                    while (probe := search.next_point(budget)) is not None:
                        record = self._done.get(probe.key_id) or self._probe(probe, counter, on_record)
                        search.observe(probe, record, budget)
                    outcomes.append(search.outcome())
                return outcomes
        finally:
            self.close()

    def _report(
        self, point: Point, counter: _Counter, on_record: Callable[[Progress], None], *, search: bool
    ) -> PointRecord:
        i = counter.next()
        on_record(Progress(i, counter.total, point))
        record = self.run_point(point, allow_skip=not search, search=search)
        self._done[point.key_id] = record
        on_record(Progress(i, counter.total, point, record))
        if record.fatal:
            raise RunFailure(
                f"{point.key_id}: {record.reason}; stopped the sweep because the GPU is unusable "
                "after such an error (--isolate runs each point in its own process and goes on)"
            )
        return record

    def _probe(self, probe: Point, counter: _Counter, on_record: Callable[[Progress], None]) -> PointRecord:
        """Measure a search probe, predicted just before it runs."""
        if self.predict is not None and probe.key_id not in self._probe_predictions:
            self._probe_predictions[probe.key_id] = self.predict(probe)
        return self._report(probe, counter, on_record, search=True)

    def _predicted(self, point: Point) -> int | None:
        if point.key_id in self._probe_predictions:
            return self._probe_predictions[point.key_id]
        return self.predictions.get(point.key_id)

    def close(self) -> None:
        """Free the model and return cached device memory."""
        self._slot = _ModelSlot()
        # Collected while the long-lived objects are still frozen (see _model): the model, built after
        # the freeze, and what the points made are freed, the ~370k import-time objects are not scanned
        # (~1 ms instead of ~300 ms, several seconds on a busy machine). Then they are collectable again.
        gc.collect()
        gc.unfreeze()
        if not self._broken:  # after a fatal CUDA error, empty_cache would raise it again
            self.probe.release()

    def remember(self, point: Point, record: PointRecord) -> None:
        """Let a finished point (or one recorded by an earlier, resumed run) inform later points."""
        self._done[point.key_id] = record
        if record.status == "oom":
            where = key_without(point, "batch_size")
            self._oom_at[where] = min(point.batch_size, self._oom_at.get(where, point.batch_size))
        self._losses.remember(point, record)

    def run_point(self, point: Point, *, allow_skip: bool = True, search: bool = False) -> PointRecord:
        """Measure one point (or skip it after a smaller batch ran out of memory): its record."""
        plan = parse_layout(point.layout, self.shape.num_layers)
        base = self._base_record(point, plan)
        if search:
            base["search"] = True
        skip_from = self._oom_at.get(key_without(point, "batch_size"))
        if allow_skip and self.cfg.skip_after_oom and skip_from is not None and point.batch_size > skip_from:
            reason = f"batch {skip_from} already ran out of memory"
            return PointRecord.model_validate({**base, "status": "skipped", "reason": reason})
        started = time.perf_counter()
        fields = self._measure_safely(point, plan, base)
        fields["wall_s"] = time.perf_counter() - started
        fields.update(host_state(fields.get("step_times_s") or [], cpus=self.cpus))
        record = PointRecord.model_validate(fields)
        self.remember(point, record)
        return record

    def _base_record(self, point: Point, plan: LayoutPlan) -> dict[str, Any]:
        model_flops, hw_flops = step_flops(
            self.shape, plan, tokens=point.tokens, seq_len=point.seq_len, frozen_base=point.lora != "none",
            recompute_lm_head=point.loss == "chunked",
        )
        return {
            "key": point.key,
            "status": None,
            "reason": None,
            "plan": {"layers": list(plan.layers), "granularity": plan.granularity, "targets": list(plan.targets)},
            "layers_checkpointed": plan.describe_layers(),
            "num_checkpointed": len(plan.layers),
            "tokens_per_step": point.tokens,
            "model_flops_per_step": model_flops,
            "hardware_flops_per_step": hw_flops,
            "peak_tflops": self.peak_tflops,
            # An estimate (ckptbench estimate), made before the point runs, kept next to the measurement.
            "predicted_peak_allocated_bytes": self._predicted(point),
            "probe": self.probe.kind,
        }

    def _model(self, point: Point) -> Any:
        """The model for a point's precision and LoRA setting, built only when those change."""
        slot = self._slot
        if slot.precision != (point.precision, point.lora):
            if slot.model is not None:
                self.close()  # free the old model before building the next
            # Everything alive now (imported modules, functions, classes: ~370k objects with
            # transformers 5) lives until the sweep ends; frozen, the collection after every point
            # (_cleanup) scans only what the model and the points create: ~1 ms instead of ~290 ms.
            # The model is built after the freeze, so it stays collectable; close() unfreezes.
            gc.freeze()
            slot = self._slot
            t0 = time.perf_counter()
            dtype = param_dtype(point.precision)
            warm_device_libraries(self.device, dtype)
            model: Any = build_model(self.cfg.model, device=self.device, dtype=dtype, seed=self.cfg.seed)
            if point.lora != "none":
                model = apply_lora(model, rank=int(point.lora[1:]), spec=self.cfg.lora)
            self.probe.adopt([*model.parameters(), *model.buffers()])
            self.probe.sync()
            slot.model, slot.precision, slot.build_s = model, (point.precision, point.lora), time.perf_counter() - t0
        return slot.model

    def _measure_safely(self, point: Point, plan: LayoutPlan, base: dict[str, Any]) -> dict[str, Any]:
        record = dict(base)
        failure: tuple[str, str] | None = None
        baseline: int | None = None
        try:
            model = self._model(point)
            record["model_build_s"] = self._slot.build_s
            self._slot.build_s = None
            baseline = self.probe.allocated()
            faults.fire(point.key, model=model, probe=self.probe, device=self.device)
            record.update(self._measure(model, point, plan))
        except torch.OutOfMemoryError as exc:
            failure = ("oom", _first_line(exc))
        except (TechniqueUnavailable, ModuleNotFoundError) as exc:
            failure = ("skipped", _first_line(exc))
        except Exception as exc:  # one point's failure is a result; the sweep goes on where that is safe
            failure = ("error", f"{exc.__class__.__name__}: {_first_line(exc)}")
            self._broken = is_fatal_device_error(exc)
        # Outside the except block: the traceback (and the tensors its frames hold) is gone now.
        if failure is not None:
            record["status"], record["reason"] = failure
        if self._broken:
            record["fatal"] = True
            return record  # no cleanup: any further CUDA call would fail the same way
        t0 = time.perf_counter()
        self._cleanup()
        parts = {**record.get("overhead_parts_s", {}), "cleanup": time.perf_counter() - t0}
        record["overhead_parts_s"] = parts
        record["memory"] = {**record.get("memory", {}), **self._leak_check(baseline)}
        if record["memory"].get("leaked"):
            self.close()  # drops the model: the next point gets a fresh one, not the leak
            record["model_rebuilt"] = True
        return record

    def _cleanup(self) -> None:
        if self._slot.model is not None:
            self._slot.model.zero_grad(set_to_none=True)
        # Needed for correct numbers: tensors held by reference cycles (autograd graphs, an exception's
        # frames) are freed only by a collection, and the leak check and the next point's baseline must
        # not see them. Cheap since _model froze the long-lived objects.
        gc.collect()
        # Needed: a fresh process has no cached segments, and peak *reserved* of the next point would
        # otherwise include what this point left in the allocator's cache (DESIGN.md).
        self.probe.release()

    def _leak_check(self, baseline: int | None) -> dict[str, Any]:
        if baseline is None:
            return {}
        after = self.probe.allocated()
        leak = after - baseline
        return {
            "baseline_allocated_bytes": baseline,
            "after_point_allocated_bytes": after,
            "leaked_bytes": leak,
            "leaked": leak > LEAK_TOLERANCE_BYTES,
        }

    def _measure(self, model: Any, point: Point, plan: LayoutPlan) -> dict[str, Any]:
        recomputed, parts, fresh = None, {}, False
        if self._losses.needs_recomputed(point):  # before the window: the point's memory is not touched
            # The first step's loss depends only on the cell (initial weights, batch, precision): one
            # recomputation serves every layout of the cell (a 7B forward pass each time otherwise).
            recomputed = self._losses.recomputed(point)
            if recomputed is None:
                t0 = time.perf_counter()
                recomputed = recompute_first_loss(
                    model, point, cfg=self.cfg, probe=self.probe, device=self.device,
                    init_std=self.llama.initializer_range, vocab_size=self.llama.vocab_size,
                )
                self._losses.keep_recomputed(point, recomputed)
                parts["loss_recompute"] = time.perf_counter() - t0
                fresh = True  # it reset the weights, and forward passes without gradients leave them so
        result = measure_point(
            model, point, plan, cfg=self.cfg, probe=self.probe, device=self.device,
            init_std=self.llama.initializer_range, vocab_size=self.llama.vocab_size, reset=not fresh,
        )
        result["overhead_parts_s"] = {**parts, **result.get("overhead_parts_s", {})}
        if result["status"] == "ok":
            rtol = loss_rtol(point.precision, self.cfg.loss_rtol)
            losses = result["warmup_losses"] + result["losses"]
            result["loss_check"] = self._losses.check(point, losses, rtol=rtol, recomputed=recomputed)
        return result


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
