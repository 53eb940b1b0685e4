"""Every kind of bad input: one line naming the field, exit code 2, no traceback, nothing started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ckptbench.cli.main import app
from ckptbench.config.load import loads_config, parse_config
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from tests.conftest import tiny_data

REPO = Path(__file__).resolve().parent.parent
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA GPU")

GOOD: dict[str, Any] = tiny_data(
    name="bad",
    measured_steps=1,
    sweep={"layout": ["none"], "batch_size": [1], "seq_len": [64], "precision": ["fp32"]},
)


def merged(**changes: Any) -> dict[str, Any]:
    """GOOD with top-level fields replaced; a value of None removes the field."""
    data = {**GOOD, **changes}
    return {k: v for k, v in data.items() if v is not None}


def axes(**changes: Any) -> dict[str, Any]:
    return {**GOOD["sweep"], **changes}


# (id, config file content: a dict dumped as YAML, raw text, or None for "no file"; extra CLI args;
#  text that must appear in the one error line)
CASES: list[Any] = [
    ("missing-file", None, [], "no such config file"),
    ("directory", "DIR", [], "is a directory"),
    ("not-utf8", b"name: \xff\xfe\n", [], "not UTF-8"),
    ("invalid-yaml", "name: [unclosed\n", [], "invalid YAML at line"),
    ("impossible-date", "name: x\nseed: 2020-13-45\n", [], "invalid YAML value"),
    ("empty-file", "", [], "empty"),
    ("top-level-list", "- 1\n- 2\n", [], "top level"),
    ("unknown-key", merged(warmup_step=1), [], "'warmup_step'; did you mean 'warmup_steps'"),
    ("unknown-nested-key", merged(model={"presett": "tiny"}), [], "'model.presett'; did you mean 'preset'"),
    ("unknown-point-key", merged(points=[{"layuot": "all"}]), [], "'points.0.layuot'; did you mean 'layout'"),
    ("wrong-type-int", merged(warmup_steps="two"), [], "warmup_steps"),
    ("wrong-type-list-item", merged(sweep=axes(batch_size=["a"])), [], "sweep.batch_size.0"),
    ("wrong-type-section", merged(model="tiny"), [], "model:"),
    ("every-0", merged(sweep=axes(layout=["every:0"])), [], "sweep.layout.0"),
    ("range-past-last-layer", merged(sweep=axes(layout=["none", "range:2-8"])), [], "sweep.layout.1"),
    ("first-k-too-big", merged(sweep=axes(layout=["first:9"])), [], "sweep.layout.0"),
    ("point-layout-bad", merged(points=[{"layout": "last:0"}]), [], "points.0.layout"),
    ("seq-above-max-positions", merged(sweep=axes(seq_len=[64, 2048])), [], "sweep.seq_len"),
    ("point-seq-above-max", merged(points=[{"seq_len": 4096}]), [], "points.0.seq_len"),
    ("batch-zero", merged(sweep=axes(batch_size=[0])), [], "sweep.batch_size"),
    ("batch-negative-point", merged(points=[{"batch_size": -1}]), [], "points.0.batch_size"),
    (
        "unknown-preset",
        merged(model={"preset": "tiyn"}),
        [],
        "model.preset: unknown preset (did you mean 'tiny'?)",
    ),
    ("unknown-precision", merged(sweep=axes(precision=["bf61"])), [], "sweep.precision.0"),
    ("unknown-optimizer", merged(optimizer="adam"), [], "optimizer"),
    (
        "fp16-on-cpu",
        merged(sweep=axes(precision=["fp16"])),
        [],
        "sweep.precision: fp16 is not supported on CPU",
    ),
    ("amp-fp16-point-on-cpu", merged(points=[{"precision": "amp_fp16"}]), [], "points.0.precision"),
    ("offload-on-cpu", merged(sweep=axes(offload=["all"])), [], "sweep.offload: all moves activations to host"),
    ("micro-batches-zero", merged(sweep=axes(micro_batches=[0])), [], "sweep.micro_batches"),
    ("unknown-loss", merged(sweep=axes(loss=["fused"])), [], "sweep.loss.0"),
    (
        "fused-loss-on-cpu",
        merged(sweep=axes(loss=["default", "fused_linear"])),
        [],
        "sweep.loss: fused_linear runs Triton kernels (Liger, cut-cross-entropy) and needs CUDA",
    ),
    (
        "torchao-8bit-on-cpu",
        merged(points=[{"optimizer": "adamw_8bit_torchao"}]),
        [],
        "points.0.optimizer: adamw_8bit_torchao compiles its step (torchao) and needs CUDA",
    ),
    (
        "optimizer-offload-on-cpu",
        merged(sweep=axes(optimizer_offload=["cpu"])),
        [],
        "sweep.optimizer_offload: cpu (torchao's CPUOffloadOptimizer) needs a CUDA device",
    ),
    (
        "grid-too-big",
        merged(sweep=axes(batch_size=list(range(1, 1001)), seq_len=list(range(1, 201)))),
        [],
        "sweep: the grid",
    ),
    ("negative-cap", merged(memory_cap_gib=-1), [], "memory_cap_gib"),
    ("infinite-lr", merged(lr=float("inf")), [], "lr: Input should be a finite number"),
    ("bad-name", merged(name="a/b"), [], "name"),
    (
        "unknown-override",
        merged(model={"preset": "tiny", "overrides": {"hiden_size": 64}}),
        [],
        "model.overrides.hiden_size: not a LlamaConfig field; did you mean 'hidden_size'",
    ),
    (
        "override-wrong-type",
        merged(model={"preset": "tiny", "overrides": {"hidden_size": "big"}}),
        [],
        "model.overrides",
    ),
    (
        "override-no-layers",
        merged(model={"preset": "tiny", "overrides": {"num_hidden_layers": 0}}),
        [],
        "model.overrides.num_hidden_layers",
    ),
    ("timeout-without-isolate", GOOD, ["--point-timeout", "5"], "--point-timeout needs --isolate"),
    (
        "allocator-on-cpu",
        merged(sweep=axes(allocator=["default", "expandable_segments"])),
        [],
        "sweep.allocator: expandable_segments configures the CUDA caching allocator (PYTORCH_CUDA_ALLOC_CONF) "
        "and needs a CUDA device",
    ),
    ("allocator-unknown-option", merged(sweep=axes(allocator=["max_split_mb:64"])), [], "'max_split_mb' is not an"),
    ("allocator-too-small", merged(sweep=axes(allocator=["max_split_size_mb:10"])), [], "must be >= 20"),
    (
        "timeout-not-positive",
        GOOD,
        ["--isolate", "--point-timeout", "0"],
        "--point-timeout must be a positive number",
    ),
    ("resume-missing-run", GOOD, ["--resume", "no-such-run"], "--resume no-such-run: no such run directory"),
    ("resume-with-out", GOOD, ["--resume", "x", "--out", "y"], "--resume"),
    pytest.param(
        "fp16-on-auto-cpu",
        merged(device="auto", sweep=axes(precision=["fp16"])),
        [],
        "sweep.precision: fp16 is not supported on CPU",
        marks=NO_GPU,
        id="fp16-on-auto-cpu",
    ),
    pytest.param(
        "cuda-without-gpu",
        merged(device="cuda"),
        [],
        "device: cuda was requested but no CUDA GPU",
        marks=NO_GPU,
        id="cuda-without-gpu",
    ),
]


def _write(tmp: Path, content: Any) -> Path:
    path = tmp / "config.yaml"
    if content is None:
        return path
    if content == "DIR":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(content), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("case", "content", "args", "expected"),
    [pytest.param(*c, id=c[0]) if type(c) is tuple else c for c in CASES],
)
def test_bad_input_is_one_line_exit_2_and_nothing_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, content: Any, args: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = _write(tmp_path, content)
    results = tmp_path / "results"
    result = CliRunner().invoke(app, ["sweep", str(path), "--results", str(results), *args])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2, (case, result.stderr, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: ") and expected in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert not results.exists(), "a run directory was created for bad input"
    assert not (tmp_path / "y").exists()


def test_memory_cap_on_cpu_is_allowed() -> None:
    # Decided for ckptbench: the CPU live-tensor tracker enforces the cap (an allocation past it is an OOM).
    cfg = parse_config(merged(memory_cap_gib=0.5))
    assert cfg.memory_cap_gib == 0.5 and cfg.device == "cpu"


def test_bad_config_in_a_real_process_prints_one_line_without_traceback(tmp_path: Path) -> None:
    path = _write(tmp_path, merged(sweep=axes(layout=["every:0"])))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, "-m", "ckptbench", "sweep", str(path), "--results", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: {path}: sweep.layout.0: layout 'every:0': every:N needs N >= 1, got 0"
    ]
    assert proc.stdout == "" and not (tmp_path / "r").exists()


# ---------------------------------------------------------------- fuzzing: no input may crash the loader

FIELDS = sorted(
    {
        *SweepConfig.model_fields,
        "preset",
        "overrides",
        "layout",
        "batch_size",
        "seq_len",
        "precision",
        "num_hidden_layers",
        "max_position_embeddings",
        "attn_implementation",
        "offload",
        "lora",
        "micro_batches",
        "compile",
        "optimizer",
    }
)
scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.sampled_from(["all", "none", "every:2", "first:0", "range:9-1", "layers:1,99", "fp16", "tiny", "cpu"])
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=20,
)


def _only_config_errors(call: Any) -> None:
    try:
        call()
    except ConfigError as exc:
        text = str(exc)
        assert text and "\n" not in text, repr(text)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=values)
def test_fuzz_arbitrary_data(data: Any) -> None:
    _only_config_errors(lambda: parse_config(data))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(section=st.sampled_from([None, "model", "sweep"]), field=st.sampled_from(FIELDS), value=values)
def test_fuzz_one_field_of_a_good_config(section: str | None, field: str, value: Any) -> None:
    data = {**GOOD, "model": dict(GOOD["model"]), "sweep": dict(GOOD["sweep"])}
    (data if section is None else data[section])[field] = value
    _only_config_errors(lambda: parse_config(data))


YAML_BITS = st.sampled_from(
    [
        ": ",
        "- ",
        "\n",
        "  ",
        "[",
        "]",
        "{",
        "}",
        ",",
        "&a ",
        "*a",
        "!!int ",
        "!!binary ",
        "!!python/name:x ",
        "'",
        '"',
        "#",
        "?",
        "|",
        ">",
        "%YAML 1.1\n",
        "---\n",
        "2020-13-45",
        "1e999",
        ".nan",
        "0x1F",
        "~",
        "name",
        "sweep",
        "layout",
        "model",
        "overrides",
        "seed",
        "points",
        "tiny",
        "every:0",
    ]
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=80) | st.lists(YAML_BITS, max_size=25).map("".join))
def test_fuzz_arbitrary_text(text: str) -> None:
    _only_config_errors(lambda: loads_config(text))
