"""Layout grammar -> exact layer sets and sub-modules; errors name the problem."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptbench.config.layouts import compress_ranges, parse_layout
from ckptbench.errors import LayoutError


@pytest.mark.parametrize(
    ("layout", "layers", "targets_head"),
    [
        ("none", (), ()),
        ("all", tuple(range(8)), ("0", "1")),
        ("every:2", (0, 2, 4, 6), ("0", "2")),
        ("every:4+3", (3, 7), ("3", "7")),
        ("every:1", tuple(range(8)), ("0",)),
        ("first:3", (0, 1, 2), ("0",)),
        ("last:3", (5, 6, 7), ("5",)),
        ("range:2-4", (2, 3, 4), ("2",)),
        ("range:5-5", (5,), ("5",)),
        ("layers:7,1,3,1", (1, 3, 7), ("1",)),
        ("all@attn", tuple(range(8)), ("0.self_attn", "1.self_attn")),
        ("first:2@mlp", (0, 1), ("0.mlp", "1.mlp")),
        ("every:4@attn+mlp", (0, 4), ("0.self_attn", "0.mlp", "4.self_attn", "4.mlp")),
        (" ALL @block ", tuple(range(8)), ("0",)),
    ],
)
def test_layout_layers(layout: str, layers: tuple[int, ...], targets_head: tuple[str, ...]) -> None:
    plan = parse_layout(layout, 8)
    assert plan.layers == layers
    assert plan.targets[: len(targets_head)] == targets_head


@pytest.mark.parametrize(
    ("layout", "fragment"),
    [
        ("every:0", "N >= 1"),
        ("every:2+2", "OFFSET must be below N"),
        ("first:9", "K must be 1..8"),
        ("last:0", "K must be 1..8"),
        ("range:4-8", "A <= B <= 7"),
        ("range:5-2", "A <= B"),
        ("range:3", "range needs A-B"),
        ("layers:1,8", "layer 8 does not exist"),
        ("layers:a", "must be a non-negative integer"),
        ("half", "unknown or incomplete layout"),
        ("bogus:3", "unknown selector 'bogus'"),
        ("all@ffn", "unknown granularity 'ffn'"),
        ("none:3", "takes no argument"),
        ("", "non-empty"),
    ],
)
def test_layout_errors(layout: str, fragment: str) -> None:
    with pytest.raises(LayoutError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        parse_layout(layout, 8)


def test_describe_and_ranges() -> None:
    assert compress_ranges((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    assert compress_ranges(()) == "-"
    plan = parse_layout("range:8-19@attn", 32)
    assert plan.describe() == "12/32 layers [8-19], self_attn only"
    assert parse_layout("none", 32).describe() == "nothing checkpointed"


@given(n=st.integers(1, 64), every=st.integers(1, 16))
def test_every_offsets_partition_the_layers(n: int, every: int) -> None:
    seen: list[int] = []
    for offset in range(every):
        seen += parse_layout(f"every:{every}+{offset}", n).layers
    assert sorted(seen) == list(range(n))


@given(n=st.integers(1, 64), data=st.data())
def test_first_and_last_complement(n: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, n))
    first = set(parse_layout(f"first:{k}", n).layers)
    assert first == set(range(k))
    if k < n:
        last = set(parse_layout(f"last:{n - k}", n).layers)
        assert first.isdisjoint(last) and first | last == set(range(n))


@given(n=st.integers(1, 64), data=st.data())
def test_range_and_explicit_list_agree(n: int, data: st.DataObject) -> None:
    a = data.draw(st.integers(0, n - 1))
    b = data.draw(st.integers(a, n - 1))
    by_range = parse_layout(f"range:{a}-{b}", n).layers
    by_list = parse_layout("layers:" + ",".join(map(str, range(a, b + 1))), n).layers
    assert by_range == by_list == tuple(range(a, b + 1))
    assert compress_ranges(by_range) == (str(a) if a == b else f"{a}-{b}")


@given(layout=st.text(max_size=30), n=st.integers(1, 40))
def test_parse_never_crashes(layout: str, n: int) -> None:
    try:
        plan = parse_layout(layout, n)
    except LayoutError:
        return
    assert all(0 <= i < n for i in plan.layers)
    assert list(plan.layers) == sorted(set(plan.layers))
