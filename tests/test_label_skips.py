"""place_labels skips measuring a place whose guessed box is surely nearer another point; the labels it
places are exactly those it placed measuring every place (issue 24: a 1,000-point report in seconds)."""

from __future__ import annotations

import random

import pytest
from matplotlib.figure import Figure

from ckptbench.plots import labels as labels_module
from ckptbench.plots.labels import Label, place_labels


def _placed(seed: int) -> list[tuple[str, tuple[float, float], str, str]]:
    rng = random.Random(seed)
    fig = Figure(figsize=(5, 4), layout="constrained")  # no pyplot: nothing global to close
    ax = fig.add_subplot()
    xs = [rng.uniform(0, 100) for _ in range(150)]
    ys = [rng.uniform(0, 50) for _ in range(150)]
    ax.scatter(xs, ys, s=20)
    labels = [Label(x, y, f"p{i} {'w' * rng.randint(1, 6)}", radius=rng.uniform(2, 6))
              for i, (x, y) in enumerate(zip(xs, ys, strict=True))]
    notes = place_labels(fig, ax, labels, lines=[[(0.0, 40.0), (50.0, 40.0), (50.0, 10.0)]])
    return [(n.get_text(), n.xyann, n.get_horizontalalignment(), n.get_verticalalignment()) for n in notes]

@pytest.mark.parametrize("seed", [0, 1])
def test_skipped_measurements_change_no_label(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    skip = labels_module._surely_nearer_another

    def counted(*args: object) -> bool:
        calls.append(skip(*args))  # type: ignore[arg-type]
        return calls[-1]

    monkeypatch.setattr(labels_module, "_surely_nearer_another", counted)
    quick = _placed(seed)
    assert any(calls)  # places were skipped
    monkeypatch.setattr(labels_module, "_surely_nearer_another", lambda *args: False)
    assert quick == _placed(seed)  # every place measured: the same labels at the same places
    assert quick  # and some were placed
