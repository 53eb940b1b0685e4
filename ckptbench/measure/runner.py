"""Execute points: build/reuse the model, warm up, measure, handle OOM and leaks, report progress.

A point is measured in this process, or in the place the sweep gives the runner for points that must
run apart (processes/launch.py: a fresh process, one per rank of a sharded point).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from pydantic import ValidationError

from ckptbench.config.grid import Point, key_without
from ckptbench.config.layouts import LayoutPlan, parse_layout
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import CkptbenchError, ConfigError, RunFailure
from ckptbench.json_object import JsonObject
from ckptbench.measure import faults
from ckptbench.measure.device import is_fatal_device_error
from ckptbench.measure.environment import available_cpus, intra_op_threads, placement, with_host_state
from ckptbench.measure.loss_check import LossReferences
from ckptbench.measure.model_slot import ModelSlot
from ckptbench.measure.probes import Probe, leak_check
from ckptbench.measure.progress import PROBES_GUESS, Progress, ProgressCounter
from ckptbench.measure.window import measure_checked
from ckptbench.results.record import PointRecord, Prediction
from ckptbench.train.flops import peak_tflops_for, step_flops
from ckptbench.train.model import hf_config, model_shape
from ckptbench.train.unavailable import TechniqueUnavailable


class Search(Protocol):
    """What the runner drives: propose a point, be told its record, say what was found."""

    @property
    def kind(self) -> str: ...
    def next_point(self, budget_bytes: int | None = None) -> Point | None: ...
    def observe(self, point: Point, record: PointRecord, budget_bytes: int | None) -> bool: ...
    def outcome(self) -> JsonObject: ...
    def fresh(self, point: Point) -> bool: ...  # whether to measure a probe in a new process (on CUDA)


class Predictions(Protocol):
    """What the runner asks as each point starts: the point's prediction, or None."""

    def get(self, key_id: str, /) -> Prediction | None: ...


class Place(Protocol):
    """Where a point runs apart from this process: a fresh process, or one per rank of a sharded point."""

    def measure(self, point: Point, base: PointRecord, *, known: Sequence[PointRecord]) -> PointRecord:
        """The point's record, from ``base`` on (an error record if it failed there); ``known``: the ok and
        out-of-memory records of the points before it (loss references, OOM skips)."""
        ...


@dataclass(frozen=True)
class PointStart:
    """What a point needs before it is measured: its plan, its base record, or why it is skipped.

    The base record holds what is known before the point runs (its plan, FLOPs, prediction, probe, placement)
    and says 'error' until a measurement says otherwise.
    """

    plan: LayoutPlan
    base: PointRecord
    skipped: PointRecord | None = None


@dataclass
class Runner:
    """Runs a list of points on one device, one model at a time, and yields a record per point.

    ``place`` (given by the sweep): where the points that must not run in this process run. None in a
    process started for one point, which measures it itself.
    """

    cfg: SweepConfig
    device: torch.device
    probe: Probe
    gpu_name: str | None = None
    place: Place | None = None
    isolate: bool = False  # every point runs in ``place`` (--isolate): this process never builds a model
    losses: LossReferences = field(default_factory=LossReferences)  # each cell's loss reference, from points run
    done: dict[str, PointRecord] = field(default_factory=dict)  # the record of every finished point, by key_id
    history: list[PointRecord] = field(default_factory=list)  # ok/oom records, for points run elsewhere
    _slot: ModelSlot = field(default_factory=ModelSlot)
    _oom_at: dict[tuple[Any, ...], int] = field(default_factory=dict)
    _broken: bool = False  # a fatal device error happened: no more CUDA calls
    _points_run: int = 0  # points measured in this process so far
    # Estimates made before each point runs, by key_id: what its record keeps (predicted peak allocated,
    # reserved, the predicted OOM); asked for as each point starts (sweep/predictions.py may make them in the
    # background; ``get`` waits for one that is still being made).
    predictions: Predictions = field(default_factory=dict[str, "Prediction | None"])
    # Predicts a search probe just before it runs (probes are not known up front); None: no prediction.
    predict: Callable[[Point], Prediction | None] | None = None
    _probe_predictions: dict[str, Prediction | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:  # checks the values of model.overrides before anything runs
            self.hf_config = hf_config(self.cfg.model)
            self.shape = model_shape(self.hf_config)
        except CkptbenchError:
            raise
        except Exception as exc:  # LlamaConfig's own checks of model.overrides (types, head counts...)
            text = " ".join(str(exc).split()) or exc.__class__.__name__
            raise ConfigError(f"model.overrides: transformers' LlamaConfig rejects them: {text[:200]}") from None
        self.placement = placement(self.device)
        self.peak_tflops = self.cfg.peak_tflops or peak_tflops_for(self.gpu_name)
        self.cpus = available_cpus()

    @property
    def budget_bytes(self) -> int | None:
        """The searches' memory budget (the config's ``budget_gib``), or None."""
        return int(self.cfg.budget_gib * 2**30) if self.cfg.budget_gib else None

    def run(
        self,
        points: list[Point],
        on_record: Callable[[Progress], None],
        searches: Sequence[Search] = (),
    ) -> list[JsonObject]:
        """Measure every point in order, then run the searches; report each start and finish.

        Returns the searches' outcomes. A search probe that equals an already measured point reuses
        that point's record instead of measuring it twice. A failed point is recorded and the sweep
        goes on, except after a fatal device error (the CUDA context is unusable): that point is
        recorded, then RunFailure stops the sweep.
        """
        counter = ProgressCounter(total=len(points) + PROBES_GUESS * len(searches))
        try:
            with intra_op_threads(self.device.type, self.cfg.cpu_threads):
                for point in points:
                    self._report(point, counter, on_record, search=False)
                budget = self.budget_bytes
                outcomes = []
                for search in searches:
                    while (probe := search.next_point(budget)) is not None:
                        record = self.done.get(probe.key_id) or self._probe(
                            probe, counter, on_record, fresh=search.fresh(probe)
                        )
                        search.observe(probe, record, budget)
                    outcomes.append(search.outcome())
                return outcomes
        finally:
            self.close()

    def _report(
        self, point: Point, counter: ProgressCounter, on_record: Callable[[Progress], None], *, search: bool,
        fresh: bool = False,
    ) -> PointRecord:
        i = counter.next()
        on_record(Progress(i, counter.total, point))
        record = self.run_point(point, allow_skip=not search, search=search, fresh=fresh)
        self.done[point.key_id] = record
        on_record(Progress(i, counter.total, point, record))
        if record.fatal:
            raise RunFailure(
                f"{point.key_id}: {record.reason}; stopped the sweep because the GPU is unusable "
                "after such an error (--isolate runs each point in its own process and goes on)"
            )
        return record

    def _probe(
        self, probe: Point, counter: ProgressCounter, on_record: Callable[[Progress], None], *, fresh: bool = False
    ) -> PointRecord:
        """Measure a search probe, predicted just before it runs (in a fresh process at a search's boundary)."""
        self.predict_probe(probe)
        return self._report(probe, counter, on_record, search=True, fresh=fresh)

    def predict_probe(self, probe: Point) -> None:
        """Predict a search probe as it is about to run (probes are not known up front)."""
        if self.predict is not None and probe.key_id not in self._probe_predictions:
            self._probe_predictions[probe.key_id] = self.predict(probe)

    def _predicted(self, point: Point) -> Prediction | None:
        if point.key_id in self._probe_predictions:
            return self._probe_predictions[point.key_id]
        return self.predictions.get(point.key_id)

    def close(self) -> None:
        """Free the model and return cached device memory."""
        self._slot = ModelSlot()
        # Collected while the long-lived objects are still frozen (see _model): the model, built after
        # the freeze, and what the points made are freed, the ~370k import-time objects are not scanned
        # (~1 ms instead of ~300 ms, several seconds on a busy machine). Then they are collectable again.
        gc.collect()
        gc.unfreeze()
        if not self._broken:  # after a fatal CUDA error, empty_cache would raise it again
            self.probe.release()

    def remember(self, point: Point, record: PointRecord) -> None:
        """Let a finished point (or one recorded by an earlier, resumed run) inform later points."""
        self.done[point.key_id] = record
        if record.status == "oom":
            where = key_without(point, "batch_size")
            self._oom_at[where] = min(point.batch_size, self._oom_at.get(where, point.batch_size))
        self.losses.remember(point, record)
        if record.status in ("ok", "oom"):
            self.history.append(record)  # sent to child processes: loss references and OOM skips

    def run_point(
        self, point: Point, *, allow_skip: bool = True, search: bool = False, fresh: bool = False
    ) -> PointRecord:
        """Measure one point (or skip it after a smaller batch ran out of memory): its record.

        ``fresh`` (a search's boundary) and a point with its own allocator settings run in a new process.
        """
        start = self.start_point(point, allow_skip=allow_skip, search=search)
        if start.skipped is not None:
            return start.skipped
        started = time.perf_counter()
        if self.place is not None and self._runs_apart(point, fresh=fresh):
            record = self._measure_apart(self.place, point, start.base)
        else:
            record = self._measure_here(point, start.plan, start.base)
        record = record.updated(wall_s=time.perf_counter() - started)
        if not record.isolated:  # measured here; processes/launch.py judged the host of one measured apart
            record = with_host_state(record, cpus=self.cpus)
        return self.finish_point(point, record)

    def _runs_apart(self, point: Point, *, fresh: bool) -> bool:
        """Whether a point runs in the place apart: every point of an isolated sweep, a sharded point (one
        process per rank), and on CUDA a search's boundary (what a new training run sees) and a point with its
        own allocator settings (the allocator reads them once, when CUDA starts)."""
        own_settings = point.allocator != "default" and point.parallel == "none"
        return self.isolate or point.parallel != "none" or (self.device.type == "cuda" and (fresh or own_settings))

    def _measure_apart(self, place: Place, point: Point, base: PointRecord) -> PointRecord:
        """Measure a point in ``place``; a sharded point that needs more GPUs than are visible is skipped.

        This process's model is freed first so that the point's processes have the card; this process's CUDA
        context stays, so without a memory cap they have that much less (about 0.7 GiB on an H200).
        """
        if point.parallel != "none" and self.device.type == "cuda":
            visible = torch.cuda.device_count()
            if point.world_size > visible:
                reason = f"{point.parallel} needs {point.world_size} GPUs; {visible} visible here"
                return base.updated(status="skipped", reason=reason)
        if not self.isolate:  # an isolated sweep's process holds no model and no cache
            self.close()
        return place.measure(point, base, known=self.history)

    def start_point(self, point: Point, *, allow_skip: bool = True, search: bool = False) -> PointStart:
        """A point's plan and base record, or its skipped record when a smaller batch ran out of memory."""
        plan = parse_layout(point.layout, self.shape.num_layers)
        base = self._base_record(point, plan, search=search)
        skip_from = self._oom_at.get(key_without(point, "batch_size"))
        if allow_skip and self.cfg.skip_after_oom and skip_from is not None and point.batch_size > skip_from:
            reason = f"batch {skip_from} already ran out of memory"
            return PointStart(plan, base, base.updated(status="skipped", reason=reason))
        return PointStart(plan, base)

    def _base_record(self, point: Point, plan: LayoutPlan, *, search: bool) -> PointRecord:
        """What every record of ``point`` starts from: its plan, FLOPs, prediction, probe and placement."""
        model_flops, hw_flops = step_flops(
            self.shape, plan, tokens=point.tokens, seq_len=point.seq_len, frozen_base=point.lora != "none",
            recompute_lm_head=point.loss == "chunked",
        )
        # Estimates (ckptbench estimate), made before the point runs, kept next to the measurement.
        prediction = self._predicted(point)
        base = PointRecord(
            key=point.key,
            status="error",  # until the measurement says otherwise
            reason=None,
            plan={"layers": list(plan.layers), "granularity": plan.granularity, "targets": list(plan.targets)},
            layers_checkpointed=plan.describe_layers(),
            num_checkpointed=len(plan.layers),
            tokens_per_step=point.tokens,
            model_flops_per_step=model_flops,
            hardware_flops_per_step=hw_flops,
            # Of all the point's GPUs: FLOPs and tokens per step count every rank.
            peak_tflops=self.peak_tflops * point.world_size if self.peak_tflops else None,
            probe=self.probe.kind,
            process="in-process",
            points_before=self._points_run,
            allocator_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            host=self.placement.host,
            gpu_name=self.placement.gpu_name,
            gpu_index=self.placement.gpu_index,
            **(prediction.given() if prediction is not None else {}),
        )
        return base.updated(search=True) if search else base  # only a search's probe says so

    def finish_point(self, point: Point, record: PointRecord) -> PointRecord:
        """A measured point's record, remembered for the points after it."""
        self.remember(point, record)
        return record

    def _model(self, point: Point) -> Any:
        """The model for a point's precision, LoRA and parallel setting, built only when those change."""
        if not self._slot.holds(point):
            if self._slot.model is not None:
                self.close()  # free the old model before building the next
            # Everything alive now (imported modules, functions, classes: ~370k objects with
            # transformers 5) lives until the sweep ends; frozen, the collection after every point
            # (_cleanup) scans only what the model and the points create: ~1 ms instead of ~290 ms.
            # The model is built after the freeze, so it stays collectable; close() unfreezes.
            gc.freeze()
            self._slot.build(point, cfg=self.cfg, device=self.device, probe=self.probe)
        return self._slot.model

    def _measure_here(self, point: Point, plan: LayoutPlan, base: PointRecord) -> PointRecord:
        """Measure a point in this process; a failure (out of memory, an error) is a record, not a crash."""
        record = base
        failure: tuple[str, str] | None = None
        baseline: int | None = None
        try:
            model = self._model(point)
            record = record.updated(model_build_s=self._slot.take_build_s())
            self.probe.release()  # as in a fresh process: only the model's (and libraries') segments stay
            self._points_run += 1
            baseline = self.probe.allocated()
            faults.fire(point.key, model=model, probe=self.probe, device=self.device)
            record = self._measure(model, point, plan, record)
        except ValidationError:  # a record this ckptbench cannot write is its bug, not the point's failure
            raise
        except torch.OutOfMemoryError as exc:
            failure = ("oom", _first_line(exc))
        except (TechniqueUnavailable, ModuleNotFoundError) as exc:
            failure = ("skipped", _first_line(exc))
        except Exception as exc:  # one point's failure is a result; the sweep goes on where that is safe
            failure = ("error", f"{exc.__class__.__name__}: {_first_line(exc)}")
            self._broken = is_fatal_device_error(exc)
        # Outside the except block: the traceback (and the tensors its frames hold) is gone now.
        if failure is not None:
            record = record.updated(status=failure[0], reason=failure[1])
        if self._broken:
            return record.updated(fatal=True)  # no cleanup: any further CUDA call would fail the same way
        t0 = time.perf_counter()
        self._cleanup()
        parts = {**record.overhead_parts_s, "cleanup": time.perf_counter() - t0}
        memory = leak_check(self.probe, baseline, record.memory)
        if memory.leaked:
            self.close()  # drops the model: the next point gets a fresh one, not the leak
            return record.updated(overhead_parts_s=parts, memory=memory, model_rebuilt=True)
        return record.updated(overhead_parts_s=parts, memory=memory)

    def _cleanup(self) -> None:
        if self._slot.model is not None:
            self._slot.model.zero_grad(set_to_none=True)
        # Needed for correct numbers: tensors held by reference cycles (autograd graphs, an exception's
        # frames) are freed only by a collection, and the leak check and the next point's baseline must
        # not see them. Cheap since _model froze the long-lived objects.
        gc.collect()
        # Needed: a fresh process has no cached segments, and peak *reserved* of the next point would
        # otherwise include what this point left in the allocator's cache (a point's memory is what a fresh
        # training process would see).
        self.probe.release()

    def _measure(self, model: Any, point: Point, plan: LayoutPlan, base: PointRecord) -> PointRecord:
        return measure_checked(
            model, point, plan, base, losses=self.losses, sharded=self._slot.sharded, cfg=self.cfg, probe=self.probe,
            device=self.device, init_std=self.hf_config.initializer_range, vocab_size=self.hf_config.vocab_size,
        )

def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__
