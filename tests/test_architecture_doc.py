"""docs/architecture.md against the code: every module it names exists, every module of a room is named in its room's
row, and every symbol the "Where new things go" table points a newcomer to is defined where it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "ckptbench"
ROOMS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def _room_rows() -> dict[str, str]:
    """The rooms table: room -> its 'owns' cell."""
    rows = {}
    for line in DOC.splitlines():
        found = re.match(r"^\| `(\w+)/` \| (.*) \|[^|]*\|$", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_every_room_has_a_row() -> None:
    assert set(_room_rows()) == set(ROOMS)


@pytest.mark.parametrize("room", ROOMS)
def test_every_module_of_a_room_is_named_in_its_row(room: str) -> None:
    row = _room_rows()[room]
    modules = sorted(p.name for p in (PACKAGE / room).iterdir()
                     if p.suffix in (".py", ".c") and p.name != "__init__.py" and not p.name.startswith("_native"))
    missing = [m for m in modules if f"`{m}`" not in row and f"`{room}/{m}`" not in row]
    assert not missing, f"docs/architecture.md's {room}/ row does not name {missing}"


def test_every_module_the_doc_names_exists() -> None:
    named = set(re.findall(r"`((?:[a-z_]+/)+[a-z_0-9]+\.(?:py|c|md|sh))", DOC))
    missing = [n for n in sorted(named)
               if not any((base / n).exists() for base in (ROOT, PACKAGE, ROOT / "tests", ROOT / "scripts"))]
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def _where_new_things_go() -> list[str]:
    section = DOC.split("## Where new things go", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| you add")]


@pytest.mark.parametrize(("path", "symbol"), [
    ("config/grid.py", "KEY_AXES"), ("config/grid.py", "class Point"), ("config/sweep_axes.py", "class SweepAxes"),
    ("config/compat.py", "RULES"), ("config/cards.py", "class Card"), ("processes/launch.py", "class FreshProcesses"),
    ("sweep/sweep.py", "def make_runner"), ("results/record.py", "host_offload_peak_bytes"),
    ("measure/runner.py", "class Place"),
])
def test_the_symbols_a_newcomer_is_pointed_to_are_where_the_doc_says(path: str, symbol: str) -> None:
    assert any(f"`{path}" in row for row in _where_new_things_go()), f"the table no longer names {path}"
    assert symbol in (PACKAGE / path).read_text(encoding="utf-8"), f"{symbol} is not in {path}"
