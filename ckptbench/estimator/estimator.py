"""Predict the memory of every point of a sweep without running it (pure: no printing), and the fields a point's
record keeps of its prediction (``prediction_of``, ``iter_predictions``: a sweep's predictions).

Each point's ``Estimate`` (estimator/record.py) holds the peak allocated bytes and their breakdown by
category (parameters, gradients, optimizer state, activations, ...), the static part, where in the
step the peak falls and, on a CUDA target, the peak reserved memory or the out-of-memory error that
the replayed caching allocator predicts on a card (``Reserved``), judged against a budget.

The peak allocated memory is the live-bytes trace of ckptbench's own training step (same model
builder, checkpoint wrapping, precision handling and optimizer) run on fake tensors
(estimator/trace.py), seen through a kernel model of the target device: ``cuda`` models the
CUDA kernels and caching allocator (what ``torch.cuda.max_memory_allocated`` reports), ``cpu``
what ckptbench's live-tensor tracker measures on CPU (estimator/device_model.py says what differs).
The peak reserved memory replays the step's ordered allocations and frees through the caching
allocator of the card (estimator/gpus.py), as a fresh process runs the point (estimator/replay.py).

``method="fast"`` (default) traces one short model per (precision, seq_len, batch_size) and
re-assembles every layout from per-layer costs (estimator/assembly.py, estimator/event_assembly.py);
``method="full"`` traces the whole model for every point. The peak is that of a sweep's measured
window: the steady-state step (optimizer state present, gradients freed by the previous step), plus
what each measured step keeps alive for the next (the detached loss the runner records).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ckptbench.config.grid import Point, optimizer_step_key, step_key
from ckptbench.config.layouts import parse_layout
from ckptbench.config.load import parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimator.assembly import (
    Peak,
    StepCosts,
    assemble,
    assemble_ops,
    describe_segment,
    layer_classes,
    plans_for,
    short_model_classes,
    trace_ops,
)
from ckptbench.estimator.collector import gc_paused, import_for_tracing, relaxed
from ckptbench.estimator.event_assembly import AssemblyError
from ckptbench.estimator.gpus import (
    DEFAULT_GPU,
    HOPPER_CUBLAS_WORKSPACE,
    GpuModel,
    gpu_for_name,
    gpu_model,
    persistent_workspace_bytes,
)
from ckptbench.estimator.record import CATEGORIES, Estimate, EstimateProgress, Reserved
from ckptbench.estimator.replay import StreamTooShort, fast_steps, full_steps, predict_reserved
from ckptbench.estimator.step_trace import GRADS, OPTIMIZER_STATE, OTHER, PARAMS, StepTrace, add, only
from ckptbench.estimator.trace_cache import TraceCache, TraceFailed, default_cache
from ckptbench.estimator.tracer import Pending, Tracer, TracerGone, first_call, release_unused, serving, where_imported
from ckptbench.estimator.workers import Background, held_while_tracing, map_pieces, share_pieces, worker_count
from ckptbench.results.record import PredictedOom, Prediction
from ckptbench.results.store import Run
from ckptbench.train.flops import CHECKPOINTED_PASS, OpCosts
from ckptbench.train.unavailable import TechniqueUnavailable
from ckptbench.units import GIB

Target = Literal["cpu", "cuda"]
Method = Literal["fast", "full"]

Job = tuple[str, Callable[[], None]]

# What a trace leaves in the Estimator (a worker's trace is sent back as the new entries of these).
_TRACE_STORES = ("_costs", "_optim", "_full", "_traces", "_failed")
_LEARNED = (*_TRACE_STORES, "_estimates")  # what a forked process hands back (``Estimator.learned_since``)


@dataclass(frozen=True)
class Learned:
    """What an Estimator traced and estimated after a moment (in a forked process: ``Estimator.learn`` takes it in
    here): its new traces and estimates, and every shape's layer classes."""

    memos: dict[str, dict[Any, Any]]
    classes: dict[tuple[Any, ...], set[str]]


@dataclass
class Estimator:
    """Runs the traces that points need (each once) and turns them into estimates."""

    cfg: SweepConfig
    target: Target = "cuda"
    method: Method = "fast"
    rank: int = 0  # the rank a sharded point is estimated for (rank 0 holds FSDP2's largest shards)
    gpu: GpuModel | None = None  # the card whose allocator is replayed (CUDA target); None: no replay
    _costs: dict[tuple[Any, ...], StepCosts] = field(default_factory=dict)
    _optim: dict[tuple[Any, ...], StepTrace] = field(default_factory=dict)
    _full: dict[Point, Peak] = field(default_factory=dict)
    _traces: dict[Any, StepTrace] = field(default_factory=dict)  # short (or full) traces, for the replay
    _classes: dict[tuple[Any, ...], set[str]] = field(default_factory=dict)
    _failed: dict[Any, str] = field(default_factory=dict)
    _prepared: dict[Any, Any] = field(default_factory=dict)  # short models prepared once for traces of several shapes
    _estimates: dict[tuple[Point, int | None, bool], Estimate] = field(default_factory=dict)  # each point once
    _peaks: dict[tuple[Point, Any], Peak | None] = field(default_factory=dict)  # each point's bytes, by its trace
    # The byte model's peaks of a short trace's points, before the card's workspaces (any card's), by their layer
    # classes and micro-batches: kept on disk with the traces (``keep_peaks``), one entry a trace.
    _books: dict[tuple[Any, ...], dict[tuple[tuple[str, ...], int], Peak]] = field(default_factory=dict)
    _unwritten: set[tuple[Any, ...]] = field(default_factory=set)  # books with peaks the disk does not have yet
    # traces kept on disk between commands (estimator/trace_cache.py); None: traced in this process only
    cache: TraceCache | None = field(default_factory=default_cache)

    def __post_init__(self) -> None:
        # A model no longer than the shortest short model ([c0, c0, c0]) costs nothing more to trace
        # whole; with two layers both are boundary layers next to each other, which re-assembly from
        # middle-layer costs does not cover (FSDP2 prefetches and reduces across them).
        # Re-assembly assumes identical decoder layers: a model whose layers differ (Gemma-2's alternating
        # sliding-window and full-attention layers, each holding its own mask) is traced whole.
        short = self.cfg.model.num_layers <= len(short_model_classes({"none"}))
        if self.method == "fast" and (short or not self._uniform_layers()):
            self.method = "full"

    def _uniform_layers(self) -> bool:
        """Whether every decoder layer is built alike (train/model.py: transformers' config says), kept in the cache."""
        def uniform() -> bool:  # by the command's tracer where one runs (estimator/tracer.py), else here
            return where_imported(_uniform_layers, self.cfg.model)

        key = ("uniform_layers", self.cfg.model.model_dump_json())
        return uniform() if self.cache is None else self.cache.memo(key, uniform)

    def on_card(self, gpu: GpuModel) -> Estimator:
        """An Estimator of the same config that replays ``gpu``'s allocator, sharing this one's traces (and any trace
        either runs later): a trace does not depend on the card (its cuBLAS workspaces are added to the peak after,
        ``_peak``)."""
        other = Estimator(self.cfg, target=self.target, method=self.method, rank=self.rank, gpu=gpu, cache=self.cache)
        for name in (*_TRACE_STORES, "_classes", "_prepared", "_books", "_unwritten"):
            setattr(other, name, getattr(self, name))
        return other

    def classes(self, point: Point) -> list[str]:
        return layer_classes(parse_layout(point.layout, self.cfg.model.num_layers))

    def _short_key(self, point: Point) -> tuple[Any, ...]:
        """What a short-model trace depends on, ending with the layer classes it must contain."""
        shape = _shape_key(point)
        return (*shape, tuple(short_model_classes(self._classes[shape])))

    def jobs(self, points: Sequence[Point]) -> list[Job]:
        """The traces ``points`` still need, each with a progress label."""
        return [job for group in self._job_groups(points) for job in group]

    def _job_groups(self, points: Sequence[Point]) -> list[list[Job]]:
        """``jobs``, in groups best run one after the other in one process: a shape's short models of every
        precision (they share most of the fake-tensor cache's entries: the second precision of a shape misses the
        cache about half as often as the first, an autocast one a tenth as often); each other trace alone. The first
        trace (a short model's where there is one) comes first, the optimizer's next."""
        return _in_order(self._optimizer_groups(points), self._step_groups(points))

    def _optimizer_groups(self, points: Sequence[Point]) -> list[list[Job]]:
        """The whole model's optimizer traces ``points`` still need, each alone."""
        groups = []
        for key, p in {_optim_key(p): p for p in points}.items():
            if key not in self._optim and key not in self._failed and not self._load("optimizer", key):
                label = f"{key[0]} {p.optimizer}: optimizer step of the whole model"
                groups.append([(label, self._guarded("optimizer", key, self._trace_optim, p))])
        return groups

    def _step_groups(self, points: Sequence[Point]) -> list[list[Job]]:
        """The traces of the step ``points`` still need (short models by shape, or whole models one by one)."""
        if self.method == "full":
            todo = [p for p in dict.fromkeys(points) if p not in self._full and not self._load("whole", p)]
            return [[(_label(p, "whole model"), self._guarded("whole", p, self._trace_full, p))] for p in todo]
        for p in points:
            self._classes.setdefault(_shape_key(p), set()).update(self.classes(p))
        shapes: dict[tuple[Any, ...], list[Job]] = {}
        for key, p in {self._short_key(p): p for p in points}.items():
            if key not in self._costs and key not in self._failed and not self._load("short", key):
                label = _label(p, f"{len(key[-1])}-layer model")
                shapes.setdefault(key[1:], []).append((label, self._guarded("short", key, self._trace_short, p)))
        return list(shapes.values())

    def run_traces(
        self, points: Sequence[Point], *, on_progress: Callable[[EstimateProgress], None] | None = None,
        workers: int | None = None,
    ) -> int:
        """Run the traces ``points`` still need (each once), on ``workers`` forked workers (None: as many as
        there are cores: estimator/workers.py); ``on_progress`` hears of each before it ends. Returns how many ran.

        The first trace runs here: what any first trace pays once (transformers' lazy imports of the model's
        module, fake-tensor caches) is paid here once. With more than one worker, forked processes start beside it
        (``share_pieces``): they take the whole model's optimizer traces first (they share little with a short
        model's), then step traces; this process takes the step traces after its first, then what optimizer traces
        are left. Each process keeps its fake-tensor cache from trace to trace (a shape's second precision misses
        it half as often as the first; a pool forked anew after the first trace started each worker's first
        autocast trace cold): the thread's question's six traces took 0.89 s on two cores that way, 0.82 s this way.
        A step piece is a group of ``_job_groups`` (a shape's precisions, which share most of the cache's entries)
        where there are enough groups to keep every process busy to the end (four per worker), the last groups a
        trace at a time (so that they end within a trace of each other: a group of a grid's four precisions left one
        core idle for half a second at the 704-point grid's end), else one trace; progress is heard of trace by
        trace either way."""
        optimizer, steps = self._optimizer_groups(points), self._step_groups(points)
        if not optimizer and not steps:
            release_unused()  # the command's first traces were on disk: its tracer would only take cores
            return 0
        total = sum(len(group) for group in (*optimizer, *steps))
        ran = self._trace_there(points, on_progress=on_progress, workers=workers,
                                first=EstimateProgress(0, total, (steps or optimizer)[0][0][0]))
        if ran is not None:
            return ran
        if steps:  # the first step trace first (_in_order)
            first, step_groups, opt_groups = steps[0][0], [steps[0][1:], *steps[1:]], optimizer
        else:
            first, step_groups, opt_groups = optimizer[0][0], [], [optimizer[0][1:], *optimizer[1:]]
        step_groups = [group for group in step_groups if group]
        n = worker_count(workers, 1 + sum(len(group) for group in (*step_groups, *opt_groups)))
        opt_pieces = [[job] for group in opt_groups for job in group]
        if n == 1 or len(step_groups) < 4 * n:
            step_pieces = [[job] for group in step_groups for job in group]
        else:  # the last n groups a trace at a time: the processes end together (within a trace, not a group)
            step_pieces = [*step_groups[:-n], *([job] for group in step_groups[-n:] for job in group)]
        queues = (opt_pieces, step_pieces)
        jobs = [first, *(job for pieces in (step_pieces, opt_pieces) for piece in pieces for job in piece)]

        def report(done: int) -> None:  # names the next job in order (the one running, when they run here)
            if on_progress is not None and done < len(jobs):
                on_progress(EstimateProgress(done, len(jobs), jobs[done][0]))

        report(0)

        def run_first() -> None:
            first[1]()
            report(1)

        done = 1
        import_for_tracing()  # before the fork: the forked processes share the import (not one each)
        pieces = share_pieces(lambda q, i: self._run_groups([queues[q][i]]), [len(p) for p in queues],
                              here=(1, 0), there=(0, 1), first=run_first, workers=workers)
        # (closed on the way out: what stops this loop (a stop signal in ``report``'s progress) leaves no process
        # forked behind it until the exception is let go of)
        with relaxed(), contextlib.closing(pieces):  # relaxed: the young collections a trace's fake tensors make
            for (q, i), made in pieces:
                self._take(made)
                for _ in queues[q][i]:  # each trace of the piece: progress does not depend on the grouping
                    done += 1
                    report(done)
        return len(jobs)

    @contextlib.contextmanager
    def traced_beside(
        self, points: Sequence[Point], *, on_progress: Callable[[EstimateProgress], None] | None = None,
        workers: int | None = None,
    ) -> Iterator[Callable[[], None]]:
        """The traces ``points`` still need, run in forked processes (``Background``: one per worker, each a share of
        the groups ``run_traces`` would hand out) while this one goes on (replays, other traces). The block is given
        ``take``: it waits for them and adds them here (a trace that failed there runs here, raising as it would
        have). Where no process can be forked, or one worker is asked for, they run at ``take``; leaving the block
        without taking them stops the processes, and they run again when asked for. Each trace is heard of by
        ``on_progress`` as it is taken. Where this Estimator has prepared no short model yet (nothing traced here),
        ``take`` runs them, as ``run_traces`` does."""
        tracer = serving()
        if tracer is not None:
            with self._traced_by(tracer, points, on_progress=on_progress, workers=workers) as take_there:
                yield take_there
            return
        if not self._prepared:
            # No short model prepared here yet (every earlier trace was on disk): each forked process would import
            # torch and transformers, pay a first trace's one-time costs and prepare its own model; ``run_traces`` at
            # ``take`` pays them once, here, before its workers fork (a question asked again with another precision:
            # 0.2 s), and the processes the caller forks before (its replays') do not carry torch.
            def run_at_take() -> None:
                self.run_traces(points, on_progress=on_progress, workers=workers)  # (again: nothing left to run)

            yield run_at_take
            return
        groups = _in_order(self._optimizer_groups(points), self._step_groups(points))
        jobs = [job for group in groups for job in group]
        if not jobs:
            yield lambda: None
            return
        ways = worker_count(workers, len(groups))  # a process per core (each a share of the groups), at most
        with contextlib.ExitStack() as stack:
            asides = [stack.enter_context(Background(functools.partial(self._run_relaxed, groups[i::ways]),
                                                     workers=workers)) for i in range(ways)]

            def taken() -> None:
                for aside in asides:
                    self._take(aside.result())

            yield _take_once(taken, jobs, on_progress)

    @contextlib.contextmanager
    def _traced_by(
        self, tracer: Tracer, points: Sequence[Point], *, on_progress: Callable[[EstimateProgress], None] | None,
        workers: int | None,
    ) -> Iterator[Callable[[], None]]:
        """``traced_beside``'s traces run by the command's tracer, in a process it forks for them; ``take`` adds them
        here (where the tracer did not answer, it runs them here, as ``run_traces`` does)."""
        jobs = self.jobs(points)
        if not jobs:
            yield lambda: None
            return
        try:
            pending: Pending | None = tracer.submit(_traced_in_tracer, *self._asked(points, workers))
        except TracerGone:
            pending = None

        def taken() -> None:
            try:
                if pending is None:
                    raise TracerGone("not submitted")
                _, learned = pending.result()
                self.learn(learned)
            except TracerGone:
                self.run_traces(points, workers=workers)

        try:
            yield _take_once(taken, jobs, on_progress)
        finally:
            if pending is not None:
                pending.close()

    def _trace_there(self, points: Sequence[Point], *, on_progress: Callable[[EstimateProgress], None] | None,
                     workers: int | None, first: EstimateProgress | None = None) -> int | None:
        """``run_traces`` by the command's tracer (estimator/tracer.py): in the tracer itself the first time (what a
        first trace pays once is paid there, for every later call), then in the process it forks for this process's
        calls (its session); what they made is learnt here. How many traces ran, or None where no tracer took them
        (they run here then). ``first``, the progress the traces start with, is heard of at once (the tracer's own
        report of it comes once it has imported torch: seconds later the first time)."""
        tracer = serving()
        if tracer is None:
            return None
        hear = on_progress
        if on_progress is not None and first is not None:
            on_progress(first)
            hear = lambda report: None if report == first else on_progress(report)  # noqa: E731
        try:
            ran, learned = tracer.call(_traced_in_tracer, *self._asked(points, workers), here=first_call(),
                                       on_progress=hear)
        except TracerGone:
            return None
        self.learn(learned)
        return int(ran)

    def _asked(self, points: Sequence[Point], workers: int | None) -> tuple[Any, ...]:
        """What the tracer needs to run the traces ``points`` need as this Estimator would: its settings, cache and
        every shape's layer classes (which name the short models), the points and the workers."""
        spec = (self.cfg, self.target, self.method, self.rank, self.cache)
        classes = {shape: set(found) for shape, found in self._classes.items()}
        return spec, classes, list(points), workers

    def _run_jobs(self, points: Sequence[Point]) -> None:
        """The traces ``points`` still need, run before the caller goes on: by the command's tracer where one runs,
        else here, one after the other."""
        jobs = self.jobs(points)
        if jobs and self._trace_there(points, on_progress=None, workers=1) is None:
            for _, job in jobs:
                job()

    def _run_relaxed(self, groups: Sequence[Sequence[Job]]) -> dict[str, dict[Any, Any]]:
        """``_run_groups`` under ``relaxed`` collections (as ``run_traces`` runs its traces)."""
        with relaxed():
            return self._run_groups(groups)

    def _run_groups(self, groups: Sequence[Sequence[Job]]) -> dict[str, dict[Any, Any]]:
        """Run the jobs of ``groups`` (in a forked process: a worker, a ``Background``) and return what they traced,
        as the new entries of each trace store."""
        before = self._keys(_TRACE_STORES)
        for group in groups:
            for _, job in group:
                job()
        return self._since(before)

    def _take(self, made: dict[str, dict[Any, Any]]) -> None:
        """What ``_run_groups`` traced elsewhere, added to this Estimator's stores."""
        for name, new in made.items():
            getattr(self, name).update(new)

    def estimate_each(
        self, points: Sequence[Point], *, budget_bytes: int | None = None, budget_is_cap: bool = False,
        workers: int | None = None,
    ) -> list[Estimate]:
        """``estimate`` of every point (their traces must have run), on ``workers`` forked workers (None: as
        many as there are cores), in the points' order. A point estimated before (here, or by an earlier command:
        the disk cache) is not replayed again."""
        made: dict[int, Estimate] = {}
        for j, p in enumerate(points):
            known = self._known(p, budget_bytes, budget_is_cap)
            if known is not None:
                made[j] = known
        todo = [j for j in range(len(points)) if j not in made]
        n = worker_count(workers, len(todo))
        parts = 1 if n == 1 else min(len(todo), 16 * n)  # many small parts per worker: they finish together
        # The points of one trace together (a grid's layouts vary slowest): the short trace's template, prepared for
        # copying into full steps (event_assembly.short_template), is then made once per part, not once per point.
        trace_of: dict[Any, int] = {}
        order = sorted(todo, key=lambda i: trace_of.setdefault(self._trace_key(points[i]), len(trace_of)))
        bounds = [(len(order) * i // parts, len(order) * (i + 1) // parts) for i in range(parts)]

        def run(i: int) -> tuple[list[Estimate], int]:
            """A part's estimates, each kept on disk by the process that made it (in parallel: the 704-point grid's
            entries took 0.13 s written one after the other here), and the bytes written."""
            lo, hi = bounds[i]
            with gc_paused():  # the collections a replay's events make, for nothing (estimator/collector.py)
                found = [self._estimate(points[j], budget_bytes=budget_bytes, budget_is_cap=budget_is_cap)
                         for j in order[lo:hi]]
            if self.cache is None:
                return found, 0
            keys = [self._estimate_key(points[j], budget_bytes, budget_is_cap) for j in order[lo:hi]]
            return found, self.cache.write_many(zip(keys, found, strict=True))

        with relaxed():  # (what sharing the parts makes, here)
            done: dict[int, tuple[list[Estimate], int]] = dict(map_pieces(run, parts, workers=n)) if todo else {}
        new = dict(zip(order, (e for i in range(len(done)) for e in done[i][0]), strict=True))
        for j, e in new.items():
            memo = (points[j], budget_bytes, budget_is_cap)
            made[j] = self._estimates.setdefault(memo, e)  # (a point given twice: its first estimate)
        if self.cache is not None and done:
            self.cache.count(sum(written for _, written in done.values()))
        return [made[j] for j in range(len(points))]

    def _known(self, point: Point, budget_bytes: int | None, budget_is_cap: bool) -> Estimate | None:
        """The point's estimate made before: in this Estimator's memo, else on disk (then kept in the memo)."""
        memo = (point, budget_bytes, budget_is_cap)
        found = self._estimates.get(memo)
        if found is None and self.cache is not None:
            found = self.cache.get(self._estimate_key(point, budget_bytes, budget_is_cap))
            if isinstance(found, Estimate):
                self._estimates[memo] = found
            else:
                found = None
        return found

    def _estimate_key(self, point: Point, budget_bytes: int | None, budget_is_cap: bool) -> tuple[Any, ...]:
        """What a point's estimate depends on: its traces (the short or whole model's and the optimizer's, each by
        its cache key), the steps and the memory cap the replayed process runs with, the card (every figure) and
        its cuBLAS workspace setting, the budget (the code's versions key the cache's folder)."""
        cfg = self.cfg
        return ("estimate", self._cache_key("point", (self._trace_key(point), _optim_key(point), point)), self.method,
                cfg.warmup_steps, cfg.measured_steps, cfg.memory_cap_gib, self.gpu,
                os.environ.get("CUBLAS_WORKSPACE_CONFIG"), budget_bytes, budget_is_cap)

    def _trace_key(self, point: Point) -> Any:
        """The key of the trace ``point`` is estimated from: the point itself (``full``), else its short model's."""
        return point if self.method == "full" else self._short_key(point)

    def _guarded(self, kind: str, key: Any, trace: Callable[[Point], None], point: Point) -> Callable[[], None]:
        def run() -> None:
            try:
                with held_while_tracing():  # a stop signal waits for the trace's end (estimator/workers.py)
                    trace(point)
            except (TechniqueUnavailable, ModuleNotFoundError) as exc:
                self._failed[key] = str(exc).splitlines()[0]
                if isinstance(exc, TechniqueUnavailable):  # a refusal of this code and these libraries: kept too
                    self._keep(kind, key, TraceFailed(self._failed[key]))

        return run

    @property
    def _persistent(self) -> int:
        """The bytes the step's cuBLAS workspaces hold throughout, on the CUDA target: the card's (without a card,
        Hopper's). Held from before the step to its end, they are a constant under every byte vector of it: the
        traces leave them out (one trace serves every card) and ``_peak`` adds them."""
        if self.target != "cuda":
            return 0
        config = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        return persistent_workspace_bytes(self.gpu.cublas_workspace_bytes(config) if self.gpu else
                                          HOPPER_CUBLAS_WORKSPACE)

    def _cache_key(self, kind: str, key: Any) -> tuple[Any, ...]:
        """What a trace depends on beyond its trace key: the config's settings a trace reads (estimator/trace.py),
        the target and the rank (the code's versions key the cache's folder). Not the card: see ``_persistent``."""
        cfg = self.cfg
        return ("trace", kind, key, cfg.model.model_dump_json(), cfg.lora.model_dump_json(), cfg.seed, cfg.lr,
                cfg.zero_grad_to_none, self.target, self.rank)

    def _load(self, kind: str, key: Any) -> bool:
        """Take the trace ``kind`` of ``key`` from the disk cache into this Estimator; whether it was there."""
        found = None if self.cache is None else self.cache.get(self._cache_key(kind, key))
        if found is None:
            return False
        if isinstance(found, TraceFailed):
            self._failed[key] = found.why
        elif kind == "optimizer":
            self._optim[key] = found
        elif kind == "short":
            self._costs[key], self._traces[key] = found
        else:
            self._full[key], self._traces[key] = found
        return True

    def _keep(self, kind: str, key: Any, value: Any) -> None:
        if self.cache is not None:
            self.cache.put(self._cache_key(kind, key), value)

    def _trace_optim(self, point: Point) -> None:
        import_for_tracing()  # torch and transformers: only to trace
        from ckptbench.estimator.trace import trace_optimizer

        key = _optim_key(point)
        self._optim[key] = trace_optimizer(self.cfg, point, target=self.target, rank=self.rank)
        self._keep("optimizer", key, self._optim[key])

    def _trace_short(self, point: Point) -> None:
        import_for_tracing()
        from ckptbench.estimator.trace import trace_step

        key = self._short_key(point)
        classes, micro = key[-1], min(point.micro_batches, 2)
        trace = trace_step(
            self.cfg, point, target=self.target, plans=plans_for(classes), num_layers=len(classes),
            micro_batches=micro, defer_shared=True, rank=self.rank, reuse=self._prepared,
        )
        self._costs[key] = StepCosts.from_trace(trace, classes, micro)
        self._traces[key] = trace
        self._keep("short", key, (self._costs[key], trace))

    def _trace_full(self, point: Point) -> None:
        import_for_tracing()
        from ckptbench.estimator.trace import trace_step

        trace = trace_step(self.cfg, point, target=self.target, rank=self.rank)
        self._full[point] = Peak.of_trace(trace)
        self._traces[point] = trace
        self._keep("whole", point, (self._full[point], trace))

    def ready(self, point: Point) -> bool:
        """Whether every trace ``point`` needs has run (or failed): ``estimate`` can answer now."""
        optim = _optim_key(point)
        trace_key = self._trace_key(point)
        traced = trace_key in (self._full if self.method == "full" else self._costs)
        return (optim in self._optim or optim in self._failed) and (traced or trace_key in self._failed)

    def predict(self, point: Point, *, budget_bytes: int | None = None, budget_is_cap: bool = False) -> Estimate:
        """The estimate of one point, its traces run here first where they have not run: the one memoised "predict
        this point" every caller asks (advise, the answers' predictions, a sweep's searches)."""
        self._run_jobs([point])  # none when its traces ran (jobs also registers a new shape's classes)
        return self.estimate(point, budget_bytes=budget_bytes, budget_is_cap=budget_is_cap)

    def predict_many(self, points: Sequence[Point], *, budget_bytes: int | None = None, budget_is_cap: bool = False,
                     workers: int | None = None) -> None:
        """``predict`` of every point not predicted yet, their traces and then their allocator replays spread over
        ``workers`` forked workers (None: one per core): what a search about to ask for many points asks first, so
        that the replays it needs run side by side. The memo holds them after; the estimates are those ``predict``
        would make one by one."""
        todo = [p for p in dict.fromkeys(points) if (p, budget_bytes, budget_is_cap) not in self._estimates]
        if not todo:
            return
        self.run_traces(todo, workers=workers)
        self.estimate_each(todo, budget_bytes=budget_bytes, budget_is_cap=budget_is_cap, workers=workers)  # memoised

    def estimate(self, point: Point, *, budget_bytes: int | None = None, budget_is_cap: bool = False) -> Estimate:
        """The estimate of one point (its traces must have run: see ``jobs``), made once (asked again: the same; by
        a later command too: kept in the disk cache with the traces)."""
        (found,) = self.estimate_each([point], budget_bytes=budget_bytes, budget_is_cap=budget_is_cap, workers=1)
        return found

    def allocated_peak(self, point: Point) -> int | None:
        """The point's predicted peak allocated bytes alone (no allocator replay: a fraction of ``estimate``'s
        cost), or None when it could not be estimated. Its peak reserved is at least this."""
        peak = self._peak(point)
        return None if peak is None else sum(peak.after_steps(self.cfg.measured_steps))

    def _peak(self, point: Point) -> Peak | None:
        """The point's byte-model peak (workspaces included), assembled once per point and trace: a question judges
        most points by it before replaying some, and the replay's estimate reads it again."""
        memo = (point, self._trace_key(point))
        if memo not in self._peaks:
            self._peaks[memo] = self._assembled_peak(point)
        return self._peaks[memo]

    def _assembled_peak(self, point: Point) -> Peak | None:
        trace_key = self._trace_key(point)
        if self._failed.get(_optim_key(point)) or self._failed.get(trace_key):
            return None
        peak = self._full[point] if self.method == "full" else self._short_peak(point, trace_key)
        if not self._persistent:
            return peak
        return Peak(add(peak.vector, only(OTHER, self._persistent)), peak.label, peak.retained)

    def _short_peak(self, point: Point, trace_key: Any) -> Peak:
        """The byte model's peak of a point from its short trace (no workspaces: any card's), assembled once: by this
        command, else by an earlier one (its trace's book, read from disk once)."""
        key = self._cache_key("peaks", (trace_key, _optim_key(point)))
        book = self._books.get(key)
        if book is None:
            found = None if self.cache is None else self.cache.get(key)
            book = self._books[key] = found if isinstance(found, dict) else {}
        entry = (tuple(self.classes(point)), point.micro_batches)
        peak = book.get(entry)
        if peak is None:
            peak = book[entry] = assemble(self._costs[trace_key], self._optim[_optim_key(point)], self.classes(point),
                                          point.micro_batches)
            self._unwritten.add(key)
        return peak

    def known(self) -> dict[str, set[Any]]:
        """The keys of what this Estimator has traced and estimated (``learned_since`` takes what comes after)."""
        return self._keys(_LEARNED)

    def learned_since(self, known: dict[str, set[Any]]) -> Learned:
        """The traces and estimates made since ``known`` (``known()``'s), and every shape's layer classes."""
        return Learned(self._since(known), {shape: set(classes) for shape, classes in self._classes.items()})

    def _keys(self, names: Sequence[str]) -> dict[str, set[Any]]:
        """The keys each of these stores holds now (``_since`` takes what comes after)."""
        return {name: set(getattr(self, name)) for name in names}

    def _since(self, before: dict[str, set[Any]]) -> dict[str, dict[Any, Any]]:
        """The entries of each store of ``before`` (``_keys``'s) made since."""
        return {name: {k: v for k, v in getattr(self, name).items() if k not in keys} for name, keys in before.items()}

    def learn(self, learned: Learned) -> None:
        """Take in what another Estimator of the same config learned (a forked process's): the traces and estimates
        this one does not have, the layer classes of each shape added to its own."""
        for name, made in learned.memos.items():
            mine = getattr(self, name)
            for key, value in made.items():
                mine.setdefault(key, value)
        for shape, classes in learned.classes.items():
            self._classes.setdefault(shape, set()).update(classes)

    def keep_peaks(self) -> None:
        """Write the books of peaks assembled since they were read (a command calls it when it has answered)."""
        if self.cache is not None and self._unwritten:
            self.cache.put_many((key, self._books[key]) for key in self._unwritten)
        self._unwritten.clear()

    def op_costs(self, point: Point) -> OpCosts | None:
        """Every op of the point's step (class, FLOPs, bytes: estimator/op_costs.py), its recomputation where its
        layout recomputes, its traces run here first where they have not; None when it could not be traced."""
        self._run_jobs([point])
        trace_key = self._trace_key(point)
        if self._failed.get(_optim_key(point)) or self._failed.get(trace_key):
            return None
        classes = self.classes(point)
        if self.method == "full":
            ops = trace_ops(self._traces[trace_key])
        else:
            ops = assemble_ops(self._traces[trace_key], trace_key[-1], self._optim[_optim_key(point)], classes,
                               point.micro_batches)
        whole = any(c not in ("none", "selective") for c in classes)  # checkpointed layers or their parts
        return ops.plus(OpCosts({(CHECKPOINTED_PASS, 0, 0): point.micro_batches})) if whole else ops

    def _estimate(self, point: Point, *, budget_bytes: int | None, budget_is_cap: bool) -> Estimate:
        trace_key = self._trace_key(point)
        peak = self._peak(point)
        if peak is None:
            failure = self._failed.get(_optim_key(point)) or self._failed.get(trace_key)
            note = f"not estimated: {failure}"
            return Estimate(point, self.target, self.method, None, {}, {}, None, budget_bytes, note)
        vector = peak.after_steps(self.cfg.measured_steps)
        notes = ["torch.compile is not modelled: the eager step is estimated"] if point.compile else []
        reserved = self._reserved(point, trace_key, notes)
        return Estimate(
            point=point, target=self.target, method=self.method, peak_bytes=sum(vector),
            breakdown=dict(zip(CATEGORIES, vector, strict=True)), static=self._static(point),
            peak_at=describe_segment(peak.label), budget_bytes=budget_bytes, note="; ".join(notes) or None,
            reserved=reserved, budget_is_cap=budget_is_cap,
        )

    def _reserved(self, point: Point, trace_key: Any, notes: list[str]) -> Reserved | None:
        """The allocator replay of the point on ``self.gpu`` (estimator/replay.py), when there is one."""
        if self.gpu is None or self.target != "cuda":
            return None
        optim = self._optim[_optim_key(point)]
        try:
            if self.method == "full":
                result = predict_reserved(self.cfg, point, full_steps(self._traces[trace_key], optim), optim, self.gpu)
            else:
                trace, classes = self._traces[trace_key], trace_key[-1]
                try:  # many micro-batches: held in part (the replay skips their repeats), else all of them
                    steps = fast_steps(trace, classes, self.classes(point), point.micro_batches, optim, compact=True)
                    result = predict_reserved(self.cfg, point, steps, optim, self.gpu)
                except StreamTooShort:
                    steps = fast_steps(trace, classes, self.classes(point), point.micro_batches, optim)
                    result = predict_reserved(self.cfg, point, steps, optim, self.gpu)
        except AssemblyError as exc:
            notes.append(f"reserved memory not predicted: {exc} (try --full)")
            return None
        ok = result.oom is None
        return Reserved(
            peak_reserved_bytes=result.peak_reserved_bytes if ok else None,
            peak_allocated_bytes=result.peak_allocated_bytes if ok else None,
            num_alloc_retries=result.num_alloc_retries,
            oom=None if ok else {**result.oom.to_json(), "where": describe_segment(result.oom.segment)},  # type: ignore[union-attr]
            gpu=self.gpu.key, context_bytes=self.gpu.context_bytes, gpu_measured=self.gpu.measured,
        )

    def _static(self, point: Point) -> dict[str, int]:
        """Parameters, gradients (all of them, at the end of backward) and optimizer state, in bytes."""
        optim = self._optim[_optim_key(point)]
        grads = optim.static[GRADS] + max(optim.get("grads").delta[GRADS], 0)
        return {
            "params_bytes": optim.static[PARAMS],
            "grads_bytes": grads,
            "optimizer_state_bytes": optim.static[OPTIMIZER_STATE],
        }


def _in_order(optimizer: list[list[Job]], steps: list[list[Job]]) -> list[list[Job]]:
    """Trace groups in the order they run: the first step trace's group first (``run_traces`` runs its first trace
    here), the optimizer traces next, the other step traces after."""
    return [*steps[:1], *optimizer, *steps[1:]]


def _shape_key(point: Point) -> tuple[Any, ...]:
    """Everything but the layout that shapes a step's per-layer costs: the axes config/grid.py declares ``step``,
    precision first."""
    return step_key(point)


def _optim_key(point: Point) -> tuple[Any, ...]:
    """What the whole model's optimizer trace depends on: the axes config/grid.py declares ``optimizer_step`` (a
    precision as the dtype its weights are stored in, unless FSDP2 shards them), precision first."""
    return optimizer_step_key(point)


def _label(point: Point, what: str) -> str:
    return f"{point.precision} b={point.batch_size} s={point.seq_len}: {what}"


def _take_once(take: Callable[[], None], jobs: Sequence[Job], on_progress: Callable[[EstimateProgress], None] | None
               ) -> Callable[[], None]:
    """A ``traced_beside`` block's ``take``: ``take()`` the first time it is called (later calls do nothing), then
    each of ``jobs`` heard of by ``on_progress``."""
    done = False

    def once() -> None:
        nonlocal done
        if done:
            return
        done = True
        take()
        if on_progress is not None:
            for i, (label, _) in enumerate(jobs, start=1):
                on_progress(EstimateProgress(i, len(jobs), label))

    return once


# The tracer's Estimators (estimator/tracer.py), by what their traces depend on: each keeps its traces and its prepared
# short models from call to call (a call forked from the tracer starts from them).
_SERVED: dict[tuple[Any, ...], Estimator] = {}


def _traced_in_tracer(spec: tuple[Any, ...], classes: dict[tuple[Any, ...], set[str]], points: list[Point],
                      workers: int | None, *, progress: Callable[[EstimateProgress], None] | None = None
                      ) -> tuple[int, Learned]:
    """In the tracer: ``run_traces`` of ``points`` by its Estimator of ``spec`` (given the asking Estimator's layer
    classes, so that the short models are the ones it would trace), and what that Estimator learnt by it."""
    cfg, target, method, rank, cache = spec
    key = (cfg.model_dump_json(), target, method, rank, cache)
    est = _SERVED.get(key)
    if est is None:
        est = _SERVED[key] = Estimator(cfg, target=target, method=method, rank=rank, cache=cache)
    est.learn(Learned({}, classes))
    known = est.known()
    ran = est.run_traces(points, on_progress=progress, workers=workers)
    return ran, est.learned_since(known)


def _uniform_layers(model: Any) -> bool:
    """Whether the model's decoder layers are built alike (``Estimator._uniform_layers``): torch and transformers
    imported for it (only when the cache does not know)."""
    import_for_tracing()
    from ckptbench.train.model import uniform_layers

    return uniform_layers(model)


def estimate_points(
    cfg: SweepConfig,
    points: Sequence[Point],
    *,
    target: Target = "cuda",
    method: Method = "fast",
    budget_bytes: int | None = None,
    budget_is_cap: bool = False,
    gpu: GpuModel | str | None = None,
    on_progress: Callable[[EstimateProgress], None] | None = None,
    rank: int = 0,
    workers: int | None = None,
) -> list[Estimate]:
    """Predict the measured-window peak of each point (a sharded point: of ``rank``); ``on_progress``
    hears of every trace.

    On a CUDA target the caching allocator is replayed on ``gpu`` (a card's key or model; default
    the H200, where the predictions were validated) for the peak reserved memory. The traces, then
    the points, are spread over ``workers`` forked workers (None: one per core; 1: none); the
    estimates do not depend on it.
    """
    est = Estimator(cfg, target=target, method=method, rank=rank, gpu=card(gpu) if target == "cuda" else None)
    ran = est.run_traces(points, on_progress=on_progress, workers=workers)
    if on_progress is not None:
        on_progress(EstimateProgress(ran, ran, "done"))
    found = est.estimate_each(points, budget_bytes=budget_bytes, budget_is_cap=budget_is_cap, workers=workers)
    est.keep_peaks()
    return found


def points_op_costs(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda", gpu: GpuModel | str | None = None
) -> dict[str, OpCosts]:
    """The op costs (``Estimator.op_costs``) of ``points``, by key_id (a point that cannot be traced is left out):
    what a modelled step time needs. Traces only (no allocator replay)."""
    est = Estimator(cfg, target=target, gpu=card(gpu) if target == "cuda" else None)
    found: dict[str, OpCosts] = {}
    for point in points:
        try:
            costs = est.op_costs(point)
        except (ConfigError, TechniqueUnavailable):
            costs = None  # offloading on a CPU target, a technique the estimator refuses: not timed per op
        if costs is not None:
            found[point.key_id] = costs
    return found


def run_op_costs(runs: Sequence[Run]) -> dict[str, OpCosts]:
    """The op costs (``Estimator.op_costs``) of every ok point of ``runs``, by key_id, each traced with the config
    of the first run that holds it (for a CUDA run, on its card; a CPU run's, as the CPU runs it): what the
    step-time model is calibrated with. A point that cannot be traced is left out."""
    found: dict[str, OpCosts] = {}
    for run in runs:
        points = [r.point for r in run.points if r.ok and r.point is not None and r.key_id not in found]
        if points:
            gpu = gpu_for_name(run.environment.gpu_name)
            cfg = parse_config(run.config, source=str(run.path))
            own = set(cfg.points_list())  # a record's value edited by hand (a precision no step has): not traced
            found.update(points_op_costs(cfg, [p for p in points if p in own],
                                         target="cuda" if gpu is not None else "cpu", gpu=gpu))
    return found


def card(gpu: GpuModel | str | None) -> GpuModel:
    """A card's model from its key or itself (default: the H200, where the replay was validated)."""
    return gpu if isinstance(gpu, GpuModel) else gpu_model(gpu or DEFAULT_GPU)


def resolve_target(cfg: SweepConfig, target: str | None) -> Target:
    """``--target`` when given ('cuda' or 'cpu'), else the device the config's sweep would run on."""
    if target is None:
        return "cpu" if cfg.device == "cpu" else "cuda"
    if target not in ("cuda", "cpu"):
        raise ConfigError(f"--target: {target!r} is not one of cuda, cpu")
    return target  # type: ignore[return-value]


def estimate_config(
    cfg: SweepConfig,
    *,
    target: str | None = None,
    budget_bytes: int | None = None,
    gpu: GpuModel | str | None = None,
    default_gpu: GpuModel | None = None,
    method: Method = "fast",
    on_progress: Callable[[EstimateProgress], None] | None = None,
    workers: int | None = None,
) -> list[Estimate]:
    """Estimate every point of ``cfg`` (in execution order) against a budget, on ``workers`` processes (None:
    one per core).

    The budget is ``budget_bytes`` (a card's memory), else the card ``gpu`` names (its total memory;
    the config's memory cap, an emulated smaller card, is then dropped), else the config's memory cap
    (which caps the allocator alone: the CUDA context is outside it).
    ``default_gpu`` is the card replayed when ``gpu`` is not given (a run's own; else the H200).
    """
    is_cap = False
    if gpu is not None:  # the card itself is the limit: the config's emulation cap does not apply
        cfg = cfg.model_copy(update={"memory_cap_gib": None})
        budget_bytes = budget_bytes if budget_bytes is not None else card(gpu).total_bytes
    elif budget_bytes is None and cfg.memory_cap_gib is not None:
        budget_bytes, is_cap = int(cfg.memory_cap_gib * GIB), True
    return estimate_points(
        cfg, cfg.points_list(), target=resolve_target(cfg, target), method=method, gpu=gpu or default_gpu,
        budget_bytes=budget_bytes, budget_is_cap=is_cap, on_progress=on_progress, workers=workers,
    )


def predict_records(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda", gpu: GpuModel | str | None = None
) -> dict[str, Prediction]:
    """What a sweep records next to each point's measurement, made before the run (estimates), by key_id."""
    return dict(iter_predictions(cfg, points, target=target, gpu=gpu))


def prediction_of(e: Estimate) -> Prediction:
    """What a point's record keeps of its estimate: peak allocated, peak reserved (or the predicted OOM)."""
    r = e.reserved
    return Prediction(
        predicted_peak_allocated_bytes=e.peak_bytes,
        predicted_peak_reserved_bytes=r.peak_reserved_bytes if r is not None else e.peak_bytes,
        predicted_oom=PredictedOom.model_validate(r.oom) if r is not None and r.oom is not None else None,
    )


def iter_predictions(
    cfg: SweepConfig, points: Sequence[Point], *, target: Target = "cuda", gpu: GpuModel | str | None = None
) -> Iterator[tuple[str, Prediction]]:
    """(key_id, prediction) of each point as soon as its traces have run.

    The traces are those estimate_points runs (every point's layer classes are registered before the
    first trace), in the points' order, so a sweep measuring the points in that order gets the first
    predictions first (sweep/predictions.py makes them in a background process). On CUDA the allocator
    is replayed on ``gpu`` (default: the H200).
    """
    est = Estimator(cfg, target=target, gpu=card(gpu) if target == "cuda" else None)
    pending = list(points)
    for _, job in est.jobs(points):
        job()
        ready = [p for p in pending if est.ready(p)]
        pending = [p for p in pending if p not in ready]
        yield from ((p.key_id, prediction_of(est.estimate(p))) for p in ready)
    yield from ((p.key_id, prediction_of(est.estimate(p))) for p in pending)
