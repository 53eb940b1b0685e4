"""`ckptbench advise`: the question answered from exact memory predictions and the step-time model.

Every number carries its label: memory is *predicted* (the estimator: exact allocated bytes, the replayed
caching allocator's reserved bytes, the card's context from its device model) or *predicted by arithmetic* where
the estimator cannot trace a setup here; a step time is *fitted* (inside a cell measured on that card), *modelled*
(another cell on a calibrated card: each op's FLOPs and bytes at calibrated rates) or *transferred* (from another
card by datasheet figures, unvalidated); the user's figure is *observed*. Every decision keeps the headroom
(advise/verdict.py).
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Sequence

from ckptbench.advise import answer
from ckptbench.advise.accumulation import accumulation_rows, micro_points, preferred
from ckptbench.advise.memory_parts import observed, parts
from ckptbench.advise.predictor import PRIMED, Predictor, family_rows, fewest, largest_batch, warm_tables
from ckptbench.advise.record import Advice, Option, Table, WayOut
from ckptbench.advise.request import AdviseRequest
from ckptbench.advise.snippets import Setup, snippets
from ckptbench.advise.verdict import Verdict
from ckptbench.advise.ways_out import recommended, ways_out
from ckptbench.analysis.step_time import StepTimeModel, shipped_calibration
from ckptbench.config.grid import Point
from ckptbench.config.layouts import parse_layout
from ckptbench.estimator.estimator import Estimator, Learned, run_op_costs
from ckptbench.estimator.record import Estimate, EstimateProgress
from ckptbench.estimator.trace_cache import default_cache
from ckptbench.estimator.tracer import where_imported
from ckptbench.estimator.workers import Background
from ckptbench.results.store import load_run
from ckptbench.train.switches import transformers_switches


def advise(
    request: AdviseRequest, *, on_progress: Callable[[EstimateProgress], None] | None = None,
    estimator: Estimator | None = None, times: StepTimeModel | None = None,
) -> Advice:
    """Answer ``request``: every family's row at each batch and sequence length, accumulated micro-batches where
    the batch needs checkpointing, the answer sentences, what fills the memory, ways out when nothing fits, the
    code, and how to measure what is not calibrated. ``estimator``: one of the same config whose traces to reuse
    (``Estimator.on_card``); ``times``: a step-time model fitted already."""
    request = request.checked()
    limit = request.limit()
    calibration = None
    if times is None:
        times, calibration = step_times(request)
    cfg = request.config(layouts=PRIMED)
    pred = Predictor(cfg, limit, times, on_progress, estimator)
    pred.prime(cfg.points_list())
    bases = {(p.precision, p.batch_size, p.seq_len): p for p in cfg.points_list() if p.layout == "none"}

    def at(precision: str) -> list[Point]:
        return [bases[(precision, b, s)] for s in request.seqs for b in request.batches]

    def tables(precision: str) -> list[Table]:
        made = at(precision)
        warm_tables(pred, made)
        return [_table(pred, base) for base in made]

    # The accumulation's traces of a batch whose no-checkpointing exceeds the card by its allocated peak alone (known
    # from the traces, before any replay: it cannot fit) run in a forked process (estimator/workers.py) beside the
    # tables' replays, rather than after them. (Which traces run where changes no figure: each is a pure function of
    # the config.)
    over = [b for b in at(request.answered_precision) if b.batch_size > 1 and pred.over_by_allocation(b)]
    early = [dataclasses.replace(m, layout=layout) for b in over for m in micro_points(b) for layout in PRIMED]
    with pred.estimator.traced_beside(early, on_progress=on_progress) as take_early:
        # Every table's replays side by side, the second precision's with the first's (one batch of replays).
        warm_tables(pred, [p for precision in (request.answered_precision, request.also_precision)
                           if precision is not None for p in at(precision)])
        made = tables(request.answered_precision)
        # The largest batch's probes (new batches: traces) run in a forked process meanwhile: they need only the
        # rows made so far, and fill the core the accumulation's and the second precision's replays leave idle.
        with Background(functools.partial(_largest, pred, made, request.seqs)) as largest:
            take_early()
            wanted = [t for t in made if not t.none.fits and t.none.verdict.predicted and t.batch > 1]
            pred.prime([dataclasses.replace(m, layout=layout) for t in wanted for m in micro_points(t.none.point)
                        for layout in PRIMED])
            advice = Advice(request, limit, [_with_accumulation(pred, t) if t in wanted else t for t in made],
                            calibration)
            if request.also_precision is not None:
                advice.also = tables(request.also_precision)
            advice.largest, learned = largest.result()
            pred.estimator.learn(learned)
    advice.answers = answer.answers(advice)
    _why(advice)
    if request.observed is not None and advice.why_option is not None:
        advice.observed = observed(pred, advice.why_option, request)
    stuck = [t for t in advice.tables if t.stuck and t.none.verdict.predicted]
    if stuck:
        advice.ways_out = ways_out(pred, stuck[0], request)
        advice.ways_out_for = stuck[0]
    _code(advice, cfg.model.num_layers)
    if any(o.time is None for t in advice.tables for o in t.rows if o.fits):
        advice.measure = _measure_command(request, cfg.model.num_layers)
    pred.estimator.keep_peaks()
    if on_progress is not None:
        on_progress(EstimateProgress(1, 1, "done"))
    return advice


def _largest(pred: Predictor, made: list[Table], seqs: Sequence[int]) -> tuple[dict[int, tuple[int, Estimate,
                                                                                             Verdict]], Learned]:
    """The largest batch that fits with every layer checkpointed, per sequence length, from the rows of ``made``, and
    what its probes traced and estimated (in a forked process: handed back to this command's Estimator, whose
    traces a caller may reuse; the peaks they assembled are kept on disk from there)."""
    known = pred.estimator.known()
    found = {}
    for s in seqs:
        first = next(t for t in made if t.seq == s)
        largest = largest_batch(pred, first.none.point, [o for t in made if t.seq == s for o in t.options])
        if largest is not None:
            found[s] = largest
    pred.estimator.keep_peaks()
    return found, pred.estimator.learned_since(known)


def step_times(request: AdviseRequest) -> tuple[StepTimeModel | None, str | None]:
    """The step-time model of ``--times-from`` (fitted to the runs' points, the op model calibrated on their traced
    ops), else the calibration ckptbench ships (the committed H200 runs' measured points and ops, package data: no
    run directory is read)."""
    if not request.times_from:
        return shipped_calibration(), None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # notes about the runs' points are not the answer's subject
        runs = [load_run(ref) for ref in request.times_from]
    return StepTimeModel.from_runs(runs, ops=run_op_costs(runs)), None


def _table(pred: Predictor, base: Point) -> Table:
    options = family_rows(pred, base)
    return Table(base.batch_size, base.seq_len, base.precision, options, [], preferred(options), fewest(options))


def _with_accumulation(pred: Predictor, t: Table) -> Table:
    acc = accumulation_rows(pred, t.none.point)
    return dataclasses.replace(t, accumulation=acc, choice=preferred([*t.options, *acc]))


def _why(advice: Advice) -> None:
    """What fills the memory of the first batch's answer (its all-layers row when nothing fits)."""
    first = advice.tables[0]
    option = first.choice or next((o for o in first.options if o.family == "all"), first.none)
    advice.why_option = option
    advice.why = parts(option, context_label="measured" if advice.card.measured else "estimated")


@functools.cache
def _switches() -> tuple[bool, bool]:
    """``transformers_switches``, kept in the trace cache (it depends on the transformers version, which keys it),
    read once per process (every snippet of an answer asks)."""
    cache = default_cache()

    def switches() -> tuple[bool, bool]:  # by the command's tracer where one runs (estimator/tracer.py), else here
        return where_imported(transformers_switches)

    return switches() if cache is None else cache.memo(("transformers_switches",), switches)


def setup_of(point: Point, num_layers: int) -> Setup:
    """The code's view of a point: its layout, micro-batch, accumulation and techniques."""
    switches = _switches()
    return Setup(
        parse_layout(point.layout, num_layers), micro_batch=point.batch_size, accumulation=point.micro_batches,
        precision=point.precision, optimizer=point.optimizer, optimizer_offload=point.optimizer_offload == "cpu",
        lora_rank=int(point.lora[1:]) if point.lora.startswith("r") else None,
        activation_api=switches[0], native_every_n=switches[1],
        parallel=point.parallel,
    )


def _code(advice: Advice, num_layers: int) -> None:
    """The code of the first batch that needs more than plain training: its answer, or, when nothing fits, the
    recommended way out; else plain training at the first batch."""
    for t in advice.tables:
        if t.stuck and t is advice.ways_out_for:
            way: WayOut | None = recommended(advice.ways_out, advice.request)
            if way is not None:
                advice.code = snippets(setup_of(way.point, num_layers))
                advice.code_for = f"the way out: {way.what}, {way.where}"
                return
        choice = t.choice
        if choice is not None and (choice.layout != "none" or choice.accumulation > 1):
            advice.code, advice.code_for = snippets(setup_of(choice.point, num_layers)), _code_for(choice, t)
            return
    first = advice.tables[0]
    choice = first.choice
    if choice is not None:
        advice.code, advice.code_for = snippets(setup_of(choice.point, num_layers)), _code_for(choice, first)


def _code_for(o: Option, t: Table) -> str:
    return f"{answer.setup_words(o)} (batch {t.batch}, sequence {t.seq}, {t.precision})"


def _measure_command(request: AdviseRequest, num_layers: int) -> str:
    """A sweep that would measure the step times the answer lacks (a config written from these flags)."""
    wanted = ["none", "all", "every:2", f"first:{max(num_layers // 2, 1)}", "all@attn+mlp", "all@selective"]
    # The sweep refuses two layouts that checkpoint the same layers (every:2 is all for one layer, first:1 is
    # every:2 for two): each is listed once.
    plans = {(p.layers, p.granularity): layout for layout in reversed(wanted)
             for p in [parse_layout(layout, num_layers)]}
    layouts = [layout for layout in wanted if layout in plans.values()]
    model = (f"{{preset: {request.model}}}" if "preset" in request.model_section
             else "{config: <the model's config.json>}")
    return (f"write a sweep config with model: {model}, device: cuda, optimizer: "
            f"{request.optimizer}, measured_steps: 3 and sweep: {{layout: [{', '.join(layouts)}], batch_size: "
            f"[{', '.join(map(str, request.batches))}], seq_len: [{', '.join(map(str, request.seqs))}], precision: "
            f"[{request.answered_precision}]}}; run ckptbench sweep CONFIG --out results/advise-{request.model}-"
            f"{request.gpu} on the card, then ckptbench advise ... --times-from results/advise-{request.model}-"
            f"{request.gpu}")

