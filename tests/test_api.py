"""The Python API: the README's "Use from Python" example runs as written; importing ckptbench stays light."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import ckptbench
from ckptbench import SweepOptions, compare_runs, estimate, load_config, load_run, recommend, run_sweep
from ckptbench.errors import ConfigError, ResultsError

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PUBLIC = {"SweepOptions", "__version__", "apply", "compare_runs", "estimate", "load_config", "load_run", "plan",
          "recommend", "run_sweep"}


def readme_example() -> str:
    """The one Python block of the README's "Use from Python" section."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Use from Python\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```python\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 1, "the section holds one Python example"
    return str(blocks[0])


def test_the_readme_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the example names configs/tiny.yaml, as a user in a checkout would
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        exec(compile(readme_example(), "README.md (Use from Python)", "exec"), {"__name__": "readme_example"})
    lines = shown.getvalue().splitlines()
    estimated = dict(re.findall(r"^estimated (\w+): ([0-9.]+) MiB$", shown.getvalue(), flags=re.M))
    measured = dict(re.findall(r"^measured (\w+): ok, ([0-9.]+) MiB, [0-9]+ ms/step$", shown.getvalue(), flags=re.M))
    assert list(estimated) == list(measured) == ["none", "all"], lines
    assert estimated == measured  # the CPU tracker's peak is predicted exactly
    assert float(measured["all"]) < float(measured["none"])  # checkpointing every layer saves memory
    assert [line.split(":")[0] for line in lines if line.startswith("compared")] == [
        "compared none b=2 s=128 fp32", "compared all b=2 s=128 fp32"]
    assert lines[-1] == "recommended: all b=2 s=128"  # none needs more than the 40 MiB budget less headroom


def test_importing_ckptbench_imports_no_torch() -> None:
    """`ckptbench --help` starts fast: the package's import (and so the API's) leaves the core for later."""
    code = ("import sys, ckptbench; heavy = {'torch', 'transformers', 'pandas', 'pydantic', 'typer', 'rich'}; "
            "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "[]"


def test_the_package_exports_the_api_and_its_version() -> None:
    assert set(ckptbench.__all__) == PUBLIC
    assert all(getattr(ckptbench, name) is not None for name in PUBLIC)
    assert re.fullmatch(r"\d+\.\d+\.\d+", ckptbench.__version__)


def test_load_config_reads_a_file_text_a_mapping_and_overrides() -> None:
    from_file = load_config(ROOT / "configs" / "tiny.yaml")
    from_text = load_config((ROOT / "configs" / "tiny.yaml").read_text(encoding="utf-8"))
    assert from_text == from_file == load_config(str(ROOT / "configs" / "tiny.yaml"))
    assert load_config(from_file) is from_file
    changed = load_config(from_file, overrides={"measured_steps": 7})
    assert (changed.measured_steps, from_file.measured_steps) == (7, 3)
    assert changed.model_copy(update={"measured_steps": 3}) == from_file
    assert load_config({"name": "x", "device": "cpu"}).name == "x"


def test_bad_input_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"^nope\.yaml: no such config file$"):
        load_config("nope.yaml")
    with pytest.raises(ConfigError, match="measured_steps"):
        load_config(ROOT / "configs" / "tiny.yaml", overrides={"measured_steps": 0})
    with pytest.raises(ConfigError, match="budget_gib"):
        recommend(ROOT / "results" / "h200-gpu-check-2" / "check", budget_gib=-1)
    with pytest.raises(ResultsError, match="no such run directory"):
        load_run("no-such-run", results_root=ROOT / "results")
    with pytest.raises(ResultsError, match="no such run directory"):
        compare_runs("no-such-run", "no-such-run")


def test_the_api_answers_as_the_core_does() -> None:
    """recommend and compare_runs on a committed run: the same answers as the core functions."""
    from ckptbench.analysis.compare import compare_runs as core_compare
    from ckptbench.analysis.recommend import recommend as core_recommend
    from ckptbench.results.store import load_run as core_load

    path = ROOT / "results" / "h200-gpu-check-2" / "check"
    run = load_run(path)
    assert run == core_load(path)
    rec = recommend(run, budget_gib=80)
    assert rec.to_json() == core_recommend(core_load(path), budget_bytes=80 * 2**30, headroom_bytes=4 * 2**30).to_json()
    assert recommend(path, budget_gib=80, headroom="4GiB").to_json() == rec.to_json()
    assert compare_runs(path, run).to_dict() == core_compare(run, core_load(path)).to_dict()


def test_estimate_of_chosen_points_and_sweep_options(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "configs" / "tiny.yaml")
    point = cfg.points_list()[1]
    (one,) = estimate(cfg, points=[point], target="cpu", budget_gib=1)
    assert (one.point, one.target, one.budget_bytes) == (point, "cpu", 2**30)
    assert SweepOptions().results_root == Path("results") and SweepOptions().out is None
    with pytest.raises(ConfigError, match="no such config file"):
        run_sweep(tmp_path / "missing.yaml", SweepOptions(out=tmp_path / "run"))


def test_no_api_name_is_also_a_module_of_the_package() -> None:
    """Importing a submodule sets the package's attribute of that name: a room named like an API function would
    replace the function (``ckptbench.estimate`` was a room before it was the function)."""
    import importlib.util

    import ckptbench

    clashes = [name for name in ckptbench.__all__ if importlib.util.find_spec(f"ckptbench.{name}") is not None]
    assert clashes == []
    importlib.import_module("ckptbench.estimator.estimator")
    importlib.import_module("ckptbench.sweep.sweep")
    assert all(callable(getattr(ckptbench, name)) for name in ckptbench.__all__ if name != "__version__")


def test_compare_runs_refuses_different_runs_unless_allowed() -> None:
    """compare_runs refuses runs on different devices, as the command does, unless allow_different says so."""
    from ckptbench.analysis.compare import NotComparableRuns
    from ckptbench.results.store import Run

    check = load_run(ROOT / "results" / "h200-gpu-check-2" / "check")
    on_cpu_env = check.environment.model_copy(update={"device_type": "cpu"})
    on_cpu = Run(path=Path("on-cpu"), meta=check.meta.model_copy(update={"environment": on_cpu_env}),
                 points=check.points)
    with pytest.raises(NotComparableRuns, match=r"the devices differ \(cuda vs cpu\).*--allow-different"):
        compare_runs(check, on_cpu)
    comp = compare_runs(check, on_cpu, allow_different=True)
    assert "compared although the devices differ (cuda vs cpu) (--allow-different)" in comp.notes
    assert len(comp.points) == len(check.points)
