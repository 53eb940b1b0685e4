"""The config cases of the adversarial pass (issue 16): one line naming the field, exit 2, nothing started,
through `sweep` and `layouts` alike; explicit points count toward the point limit."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config import schema
from ckptbench.config.load import parse_config
from ckptbench.errors import ConfigError
from tests.test_bad_input import GOOD, axes, merged

HEAD = "name: bad\ndevice: cpu\nsweep: {seq_len: [64]}\nmodel:\n  preset: tiny\n"  # model last: overrides follow


def overrides(**values: Any) -> dict[str, Any]:
    return merged(model={"preset": "tiny", "overrides": values})


def _bomb(levels: int = 7) -> str:
    """Seven levels of ten aliases: a ~550-byte YAML text that is 10**7 values once walked."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels)]
    return "\n".join(lines)


BOMB_IN_OVERRIDES = HEAD + "  overrides:\n" + "".join(f"    {line}\n" for line in _bomb().splitlines())

# (id, config: a dict dumped as YAML or raw YAML text, text that must appear in the one error line)
CASES: list[tuple[str, Any, str]] = [
    ("budget-infinite", merged(budget_gib=float("inf")), "budget_gib: Input should be a finite number"),
    ("lora-alpha-infinite", merged(lora={"alpha": float("inf")}), "lora.alpha: Input should be a finite number"),
    ("memory-cap-nan", HEAD + "memory_cap_gib: .nan\n", "memory_cap_gib: Input should be a finite number"),
    ("peak-tflops-negative-infinite", HEAD + "peak_tflops: -.inf\n", "peak_tflops"),
    ("override-nan", overrides(rms_norm_eps=float("nan")), "model.overrides.rms_norm_eps: must be a finite number"),
    ("hidden-negative", overrides(hidden_size=-128), "model.overrides.hidden_size: Input should be greater"),
    ("hidden-zero", overrides(hidden_size=0), "model.overrides.hidden_size: Input should be greater"),
    ("vocab-zero", overrides(vocab_size=0), "model.overrides.vocab_size: Input should be greater"),
    ("kv-heads-zero", overrides(num_key_value_heads=0), "model.overrides.num_key_value_heads: Input should be"),
    ("size-a-bool", overrides(intermediate_size=True), "model.overrides.intermediate_size: Input should be"),
    ("size-absurd", overrides(hidden_size=10**25),
     "model.overrides.hidden_size: must be at most 9,223,372,036,854,775,807"),
    ("heads-do-not-divide-hidden", overrides(hidden_size=130), "must be a multiple of num_attention_heads (4)"),
    (
        "kv-heads-do-not-divide-heads",
        overrides(num_key_value_heads=3),
        "model.overrides.num_key_value_heads: num_attention_heads (4) must be a multiple of num_key_value_heads (3)",
    ),
    ("odd-head-size", overrides(hidden_size=12), "model.overrides.hidden_size: the head size (3) must be even"),
    ("alias-bomb-in-overrides", BOMB_IN_OVERRIDES, "model.overrides.a6: expands to more than 2,000,000 values"),
    ("alias-bomb-elsewhere", HEAD + _bomb() + "\n", "a6: expands to more than"),
    ("alias-to-itself", HEAD + "  overrides: &r {a: *r}\n", "model.overrides.a: a YAML alias refers to itself"),
    ("every-5000-digits", merged(sweep=axes(layout=["every:" + "9" * 5000])), "sweep.layout.0: layout 'every:"),
    ("first-arabic-indic-3", merged(sweep=axes(layout=["first:٣"])), "sweep.layout.0: layout 'first:٣': K must be"),
    ("every-fullwidth-2", merged(sweep=axes(layout=["every:２"])), "sweep.layout.0: layout 'every:２': N must be"),
    ("point-layer-in-devanagari", merged(points=[{"layout": "layers:१"}]), "points.0.layout"),
    ("duplicate-top-level-key", HEAD + "name: again\n", "line 6, column 1: duplicate key 'name' (first given on line"),
    ("duplicate-nested-key", HEAD.replace("  preset: tiny\n", "  preset: tiny\n  preset: small\n"),
     "line 6, column 3: duplicate key 'preset' (first given on line 5)"),
    ("duplicate-flow-key", HEAD + "lora: {alpha: 8, alpha: 16}\n", "line 6, column 18: duplicate key 'alpha'"),
    ("batch-10-to-the-25", merged(sweep=axes(batch_size=[10**25])), "sweep.batch_size.0: Input should be less than"),
    ("point-batch-huge", merged(points=[{"batch_size": 2**40}]), "points.0.batch_size: Input should be less than"),
    ("micro-batches-huge", merged(sweep=axes(micro_batches=[10**9])), "sweep.micro_batches.0"),
    ("measured-steps-huge", merged(measured_steps=10**12), "measured_steps: Input should be less than"),
    ("lora-rank-huge", merged(sweep=axes(lora=["r99999999999"])), "sweep.lora"),
    ("all-and-ALL", merged(sweep=axes(layout=["all", "ALL"])), "sweep.layout: entry 1 ('ALL') is entry 0 ('all')"),
    ("all-and-space-all", merged(sweep=axes(layout=["all", " all"])), "entry 1 (' all') is entry 0 ('all') again"),
    ("all-and-all-at-block", merged(sweep=axes(layout=["all", "all@block"])), "both spell 'all'"),
    (
        "all-and-range-0-7",
        merged(sweep=axes(layout=["all", "range:0-7"])),
        "sweep.layout.1: 'range:0-7' checkpoints the same as sweep.layout.0 'all' (8/8 layers [0-7]",
    ),
    ("all-and-first-8", merged(sweep=axes(layout=["none", "all", "first:8"])), "sweep.layout.2: 'first:8'"),
    ("none-and-none-at-mlp", merged(sweep=axes(layout=["none", "none@mlp"])), "both spell 'none'"),
    (
        "point-first-8-beside-all",
        merged(sweep=axes(layout=["all"]), points=[{"layout": "first:8"}]),
        "points.0.layout: 'first:8' checkpoints the same as sweep.layout.0 'all'",
    ),
]


def _write(tmp: Path, content: Any) -> Path:
    path = tmp / "config.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content, allow_unicode=True))
    return path


@pytest.mark.parametrize(("case", "content", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", ["sweep", "layouts"])
def test_bad_config_is_one_line_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str, case: str, content: Any, expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, content)
    started = time.monotonic()
    result = CliRunner().invoke(app, [command, str(path)] + (["--results", "r"] if command == "sweep" else []))
    assert time.monotonic() - started < 20, "took far too long: validation walked an expanded alias bomb?"
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (case, result.stderr, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines
    assert len(lines[0]) < 400 and result.stdout == "" and not (tmp_path / "r").exists()


def test_same_spellings_in_explicit_points_merge_into_one_layout() -> None:
    cfg = parse_config(merged(sweep=axes(layout=["all"]), points=[{"layout": "ALL", "batch_size": 2}]))
    assert {p.layout for p in cfg.points_list()} == {"all"}  # 'ALL' is 'all': one layout, two batch sizes


def test_explicit_points_count_toward_the_real_limit() -> None:
    one = {"layout": "all", "seq_len": 64}
    points = [{**one, "batch_size": 1 + i} for i in range(schema.MAX_GRID_POINTS + 1)]
    with pytest.raises(ConfigError, match=r"points: 100001 explicit points, more than 100000"):
        parse_config(merged(points=points, points_mode="replace"))
    grid = axes(batch_size=[1, 2], seq_len=[64])  # 2 grid points + 99,999 explicit ones
    with pytest.raises(ConfigError, match=r"sweep: the grid has 2 and points adds 99999 points, more than 100000"):
        parse_config(merged(sweep=grid, points=points[: schema.MAX_GRID_POINTS - 1]))


@pytest.mark.parametrize(
    ("points_mode", "count", "expected"),
    [("replace", 11, "points: 11 explicit points, more than 10"), ("add", 5, "the grid has 6 and points adds 5")],
)
def test_explicit_points_count_toward_the_limit_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, points_mode: str, count: int, expected: str
) -> None:
    monkeypatch.setattr(schema, "MAX_GRID_POINTS", 10)  # the same check as at 100,000, with a small file
    points = [{"layout": "none", "batch_size": 10 + i} for i in range(count)]
    data = merged(sweep=axes(layout=["none", "all", "every:2"], batch_size=[1, 2]), points=points,
                  points_mode=points_mode)
    result = CliRunner().invoke(app, ["sweep", str(_write(tmp_path, data)), "--results", str(tmp_path / "r")])
    assert result.exit_code == 2 and expected in result.stderr, result.stderr
    assert not (tmp_path / "r").exists()


def test_good_config_still_loads() -> None:
    assert parse_config(GOOD).sweep.layout == ["none"]
