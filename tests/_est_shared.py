"""Estimates shared across the tests of one pytest process: each distinct estimate is computed once.

Many tests run a command (estimate, report, answers, advise) on the same committed runs or configs; each
run re-traced and re-replayed the same LLaMA-7B points (seconds to tens of seconds each). The fixture
``shared_estimates`` memoises, while a test module that asks for it runs, two entry points of the product:

- ``ckptbench.estimator.estimator.estimate_points``, each point by the exact other arguments (the config's JSON,
  the target, the method, the budget, the card, the rank, CUBLAS_WORKSPACE_CONFIG); ``workers`` and
  ``on_progress`` are left out of the key (the estimates do not depend on them: estimator/estimator.py), and so
  are the other points asked with it (the fast path is exact per point); a call with any point not yet
  estimated estimates all its points, as the product would;
- the estimator behind ``answers``' claim predictions (advise/answers_predictions.py): one Estimator per
  exact (config, target, method, rank, card), and each point's prediction once per Estimator.

The first test to ask computes with the product's own code; later ones get a deep copy of that result.
Tests that compare one estimate path with another (fast against full, a CLI against the core) call the
functions they import by name, which the fixture does not replace, or ask for different arguments.
A test that changes the estimator (a monkeypatched model builder) calls it by name too, so that nothing
it makes reaches the memo. The memo lives in this process only (one pytest-xdist worker), so tests stay
independent of each other's order: a miss computes.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

_POINTS: dict[tuple[Any, ...], dict[Any, Any]] = {}  # arguments but the points -> point -> Estimate
_HEARD: dict[tuple[Any, ...], list[Any]] = {}  # (arguments, points) -> the progress events of their estimate
_ESTIMATORS: dict[tuple[Any, ...], Any] = {}
_PREDICTED: dict[int, dict[Any, Any]] = {}
_REPLAYED: set[tuple[Any, ...]] = set()  # id(shared Estimator) -> point -> PredictedPoint


def _card_key(target: str, gpu: Any) -> str | None:
    from ckptbench.estimator.estimator import card

    return card(gpu).key if target == "cuda" else None


def _memo_estimate_points(real: Callable[..., list[Any]]) -> Callable[..., list[Any]]:
    def estimate_points(cfg: Any, points: Sequence[Any], *, target: str = "cuda", method: str = "fast",
                        budget_bytes: int | None = None, budget_is_cap: bool = False, gpu: Any = None,
                        on_progress: Callable[[Any], None] | None = None, rank: int = 0,
                        workers: int | None = None) -> list[Any]:
        key = (cfg.model_dump_json(), target, method, budget_bytes, budget_is_cap, _card_key(target, gpu), rank,
               os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        known = _POINTS.setdefault(key, {})
        if not all(p in known for p in points):  # a miss computes every point asked, as the product does
            heard: list[Any] = []

            def hear(event: Any) -> None:
                heard.append(event)
                if on_progress is not None:
                    on_progress(event)

            found = real(cfg, points, target=target, method=method, budget_bytes=budget_bytes,
                         budget_is_cap=budget_is_cap, gpu=gpu, on_progress=hear, rank=rank, workers=workers)
            _HEARD[(key, tuple(points))] = heard
            known.update(zip(points, found, strict=True))
            return copy.deepcopy(found)
        # A point's estimate does not depend on the other points asked with it (test_estimate's and
        # test_reserved's fast-against-full tests): a point estimated before, with the same arguments, is reused.
        if on_progress is not None:
            for event in _HEARD.get((key, tuple(points)), []):
                on_progress(event)  # the progress the first ask of these points heard
        return copy.deepcopy([known[p] for p in points])

    return estimate_points


@pytest.fixture(scope="module")
def shared_estimates() -> Iterator[None]:
    """Within the module, estimates of a config already estimated in this process come from the memo."""
    import ckptbench.advise.answers_predictions as claims
    import ckptbench.estimator.estimator as api

    real_estimator, real_predictor = claims.Estimator, claims._Predictor

    def shared_estimator(cfg: Any, *, target: str = "cuda", method: str = "fast", rank: int = 0,
                         gpu: Any = None) -> Any:
        key = (cfg.model_dump_json(), target, method, rank, gpu.key if gpu is not None else None,
               os.environ.get("CUBLAS_WORKSPACE_CONFIG"))
        if key not in _ESTIMATORS:
            _ESTIMATORS[key] = real_estimator(cfg, target=target, method=method, rank=rank, gpu=gpu)  # type: ignore[arg-type]
        return _ESTIMATORS[key]

    class SharedPredictor(real_predictor):  # type: ignore[misc, valid-type]
        """Each point predicted once per shared Estimator; ``done`` still holds only this run's points."""

        def predict(self, point: Any) -> Any:
            known = _PREDICTED.setdefault(id(self.estimator), {})
            if point not in self.done and point in known:
                self.done[point] = known[point]
            found = super().predict(point)
            known[point] = found
            return found

        def prime(self, points: Sequence[Any]) -> None:
            known = _PREDICTED.setdefault(id(self.estimator), {})
            todo = [p for p in points if p not in known]
            if todo:
                super().prime(todo)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(api, "estimate_points", _memo_estimate_points(api.estimate_points))
        mp.setattr(claims, "Estimator", shared_estimator)
        mp.setattr(claims, "_Predictor", SharedPredictor)
        yield


SYNTHETIC_RUN = Path(__file__).parent / "fixtures" / "report_runs" / "synthetic-h200-llama7b"


@pytest.fixture(scope="session")
def synthetic_report_made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """(folder, CliRunner result) of `ckptbench report SYNTHETIC --out FOLDER --budget 80`, made once per process
    for the tests that only read it (tests/test_report_cmd.py, tests/test_layer_report.py); copy it to change it."""
    from typer.testing import CliRunner

    from ckptbench.cli.main import app

    out = tmp_path_factory.mktemp("synthetic-report")
    return out, CliRunner().invoke(app, ["report", str(SYNTHETIC_RUN), "--out", str(out), "--budget", "80"])
