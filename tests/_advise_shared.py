"""Answers of `ckptbench advise` shared by the advise test files of one pytest process: one Estimator per model and
optimizer (its traces serve every card: ``Estimator.on_card``), one per card on top of it (its replays serve every
budget and headroom), and the step-time model fitted once.

The answers are the product's own (``advise(request, estimator=..., times=...)``): only the traces and replays
that several requests share are made once. tests/conftest.py runs the files that use it on one worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_BASE: dict[tuple[str, str], Any] = {}
_ON_CARD: dict[tuple[str, str, str], Any] = {}
_TIMES: list[Any] = []


@contextmanager
def at_root() -> Iterator[None]:
    """From the repository root: the default step-time calibration names the committed runs relative to it."""
    old = os.getcwd()
    os.chdir(ROOT)
    try:
        yield
    finally:
        os.chdir(old)


def estimator_for(request: Any) -> Any:
    from ckptbench.advise.predictor import PRIMED
    from ckptbench.estimator.estimator import Estimator

    card = request.card()
    on_card = (request.model, request.optimizer, card.key)
    if on_card not in _ON_CARD:
        base_key = (request.model, request.optimizer)
        base = _BASE.get(base_key)
        if base is None:
            base = _BASE[base_key] = Estimator(request.config(layouts=PRIMED), target="cuda", gpu=card)
        _ON_CARD[on_card] = base if base.gpu == card else base.on_card(card)
    return _ON_CARD[on_card]


def times() -> Any:
    from ckptbench.advise.advice import step_times
    from ckptbench.advise.request import AdviseRequest

    if not _TIMES:
        with at_root():
            _TIMES.append(step_times(AdviseRequest())[0])
    return _TIMES[0]


def advise_shared(**fields: Any) -> Any:
    """The advice for an AdviseRequest of these fields, sharing traces, replays and the step-time model."""
    from ckptbench.advise.advice import advise
    from ckptbench.advise.request import AdviseRequest

    request = AdviseRequest(**fields).checked()
    with at_root():
        return advise(request, estimator=estimator_for(request), times=times())


def rendered(advice: Any, width: int = 80) -> str:
    """The table output as the CLI prints it at ``width`` columns."""
    import io

    from rich.console import Console

    from ckptbench.render.advise import advise_renderable

    console = Console(width=width, record=True, file=io.StringIO(), highlight=False, soft_wrap=False)
    console.print(advise_renderable(advice))
    return console.export_text()
