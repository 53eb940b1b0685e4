"""Model families: every supported architecture from a preset or a checkpoint's config.json, a tiny sweep of each on
CPU with its estimate equal to the tracker's peak to the byte, published presets that estimate on the CUDA target,
unsupported architectures refused in one line, the architecture in every key, FLOPs counted per family."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from ckptbench.api import SweepOptions, run_sweep
from ckptbench.cli.main import app
from ckptbench.config.families import FAMILIES
from ckptbench.config.grid import point_of
from ckptbench.config.layouts import parse_layout
from ckptbench.config.load import load_config, parse_config
from ckptbench.config.presets import PUBLISHED, TINY_FAMILIES, preset_source
from ckptbench.errors import ConfigError
from ckptbench.estimator import trace as trace_module
from ckptbench.estimator.estimator import estimate_points
from ckptbench.results.record import PointRecord
from ckptbench.train.checkpointing import plan_modules
from ckptbench.train.flops import step_flops
from ckptbench.train.model import (
    build_model,
    decoder_layers,
    hf_config,
    layer_parts,
    lora_targets,
    model_shape,
)
from tests._known import known

# Estimates of one config are made once per process and shared (tests/_est_shared.py).
pytestmark = pytest.mark.usefixtures("shared_estimates")

REPO = Path(__file__).resolve().parents[1]
QWEN3_8B_JSON = REPO / "configs" / "models" / "Qwen3-8B" / "config.json"
# none, all, a partial layout, a granularity and per-op checkpointing: five plans whose peaks all differ.
LAYOUTS = ["none", "all", "last:2", "every:2@mlp", "all@selective"]
# The presets the issue names (sizes as published); the other published ones are the cheap extra families.
LISTED = ["llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "llama-3.2-3b",
          "mistral-7b", "qwen2.5-7b", "qwen2.5-14b", "qwen2.5-32b", "qwen3-8b", "qwen3-14b", "qwen3-32b"]


def _attn(preset_fields: dict[str, Any]) -> str:
    """Gemma-2 soft-caps attention logits: eager only."""
    return FAMILIES[preset_fields.get("model_type", "llama")].attention[0]


def _family_data(preset: str) -> dict[str, Any]:
    return {
        "name": f"fam-{preset}", "device": "cpu", "warmup_steps": 1, "measured_steps": 1,
        "model": {"preset": preset, "attn_implementation": _attn(TINY_FAMILIES[preset])},
        "sweep": {"layout": LAYOUTS, "batch_size": [2], "seq_len": [64], "precision": ["fp32"]},
    }


@pytest.fixture(scope="module")
def tiny_sweeps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], list[PointRecord]]]:
    """A tiny sweep of a family (run once per module, when a test first asks): its point records."""
    done: dict[str, list[PointRecord]] = {}
    root = tmp_path_factory.mktemp("families")

    def sweep(preset: str) -> list[PointRecord]:
        if preset not in done:
            outcome = run_sweep(_family_data(preset), SweepOptions(out=root / preset))
            assert outcome.status == "complete", outcome.failure
            done[preset] = list(outcome.records)
        return done[preset]

    yield sweep
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("preset", list(TINY_FAMILIES))
def test_a_tiny_sweep_of_each_family_is_predicted_to_the_byte(
    tiny_sweeps: Callable[[str], list[PointRecord]], preset: str
) -> None:
    """The CPU estimate (recorded before each point ran) equals the CPU tracker's measured peak for none, all, a
    partial layout, a granularity and per-op checkpointing; the layouts really differ; checkpointing keeps the
    losses; every key carries the family's architecture; FLOPs are counted."""
    records = {r.key["layout"]: r for r in tiny_sweeps(preset)}
    assert list(records) == LAYOUTS
    for layout, rec in records.items():
        assert rec.status == "ok", (layout, rec.reason)
        assert rec.predicted_peak_allocated_bytes == rec.peak_allocated_bytes, layout
        assert rec.key["architecture"] == TINY_FAMILIES[preset]["model_type"]
        assert rec.model_flops_per_step and rec.hardware_flops_per_step
        if layout != "none":
            assert rec.loss_check is not None and rec.loss_check.match, layout
    peaks = [records[x].peak_allocated_bytes for x in LAYOUTS]
    assert len(set(peaks)) == len(LAYOUTS)
    assert known(records["none"].peak_allocated_bytes) > known(records["last:2"].peak_allocated_bytes) > known(
        records["all"].peak_allocated_bytes)


def _without_qk_norm(model: nn.Module) -> None:
    for layer in decoder_layers(model):
        attn = layer.self_attn
        assert isinstance(attn, nn.Module)
        attn.q_norm = nn.Identity()
        attn.k_norm = nn.Identity()


def _without_q_bias(model: nn.Module) -> None:
    for layer in decoder_layers(model):
        layer.get_submodule("self_attn.q_proj").register_parameter("bias", None)  # as ``q_proj.bias = None``


# A family's special case removed from the estimator's model only (the sweep measured the real one).
BREAKS: dict[str, tuple[str, dict[str, Any], Callable[[nn.Module], None] | None]] = {
    "tied embeddings ignored": ("tiny-qwen3", {"tie_word_embeddings": False}, None),
    "q/k norms ignored": ("tiny-qwen3", {}, _without_qk_norm),
    "sliding window ignored": ("tiny-mistral", {"sliding_window": None}, None),
    "soft-capping ignored": ("tiny-gemma2", {"attn_logit_softcapping": None}, None),
    "biases ignored": ("tiny-qwen2", {}, _without_q_bias),
}


@pytest.mark.parametrize("broken", list(BREAKS))
def test_the_exactness_check_fails_when_a_family_special_case_is_ignored(
    tiny_sweeps: Callable[[str], list[PointRecord]], broken: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-family check has teeth: an estimator that builds the family without its special case predicts
    other peaks than the sweep measured."""
    preset, overrides, edit = BREAKS[broken]
    real = trace_module.build_model

    def build(spec: Any, **kwargs: Any) -> Any:
        model = real(spec.model_copy(update={"overrides": {**spec.overrides, **overrides}}), **kwargs)
        if edit is not None:
            edit(model)
        return model

    monkeypatch.setattr(trace_module, "build_model", build)
    cfg = parse_config(_family_data(preset))
    measured = {r.key_id: r.peak_allocated_bytes for r in tiny_sweeps(preset)}
    predicted = {e.point.key_id: e.peak_bytes for e in estimate_points(cfg, cfg.points_list(), target="cpu")}
    assert predicted.keys() == measured.keys()
    assert predicted != measured


@pytest.mark.parametrize("preset", list(TINY_FAMILIES))
def test_attention_and_mlp_are_found_by_structure(preset: str) -> None:
    """@attn and @mlp wrap each family's attention and MLP, whatever their projections are called (Phi-3 fuses them)."""
    cfg = parse_config(_family_data(preset))
    model = build_model(cfg.model, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    attn = plan_modules(model, parse_layout("all@attn", cfg.model.num_layers))
    mlp = plan_modules(model, parse_layout("layers:1@mlp", cfg.model.num_layers))
    assert [type(m).__name__ for m in attn] == [type(decoder_layers(model)[0].self_attn).__name__] * 4
    assert attn[0].__class__.__name__.endswith("Attention") and mlp[0].__class__.__name__.endswith("MLP")
    assert layer_parts(decoder_layers(model)[1])["mlp"] is mlp[0]


def test_lora_targets_follow_fused_projections() -> None:
    cfg = parse_config(_family_data("tiny-phi3"))
    model = build_model(cfg.model, device=torch.device("cpu"), dtype=torch.float32, seed=0)
    assert lora_targets(model, ["q_proj", "k_proj", "v_proj", "o_proj"]) == ["qkv_proj", "o_proj"]
    assert lora_targets(model, ["gate_proj", "down_proj"]) == ["gate_up_proj", "down_proj"]


# Parameter counts as published on each model's hub page (safetensors metadata).
PUBLISHED_PARAMS = {
    "llama-2-7b": 6_738_415_616, "llama-3.1-8b": 8_030_261_248, "mistral-7b": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512, "qwen3-8b": 8_190_735_360, "gemma-7b": 8_537_680_896,
}


@pytest.mark.parametrize("preset", list(PUBLISHED_PARAMS))
def test_published_presets_have_the_published_parameter_counts(preset: str) -> None:
    """The presets' sizes are the published models' (the shape counted on the family's own modules)."""
    cfg = parse_config({"name": "p", "model": {"preset": preset}})
    hf: Any = hf_config(cfg.model)
    shape = model_shape(hf)
    embed = hf.vocab_size * hf.hidden_size
    total = shape.num_layers * shape.layer_params + embed + hf.hidden_size
    total += 0 if hf.tie_word_embeddings else shape.lm_head_params
    assert total == PUBLISHED_PARAMS[preset]
    assert preset_source(preset) is not None and preset_source(preset).endswith("config.json")  # type: ignore[union-attr]


def test_flops_are_counted_per_family() -> None:
    """LLaMA's count is unchanged; Gemma's attention is 16 x 256 wide on a 3072 hidden size; Mistral-7B v0.1
    attends within its 4096-token window; biases and q/k norms count in the parameters."""
    def shape(preset: str) -> Any:
        return model_shape(hf_config(parse_config({"name": "p", "model": {"preset": preset}}).model))

    llama = shape("llama-7b")
    d, ff, v = 4096, 11008, 32000
    assert (llama.attn_params, llama.mlp_params, llama.layer_params, llama.lm_head_params) == (
        4 * d * d, 3 * d * ff, 4 * d * d + 3 * d * ff + 2 * d, v * d)
    assert llama.attn_width is None and llama.sliding_windows == ()
    plan = parse_layout("all", 32)
    tokens = 8192
    model, hw = step_flops(llama, plan, tokens=tokens, seq_len=4096)
    assert model == tokens * (6 * (32 * llama.layer_params + v * d) + 3 * 32 * 4 * d * 4096)
    assert hw - model == tokens * 32 * (2 * llama.layer_params + 4 * d * 4096)
    gemma = shape("gemma-7b")
    assert gemma.attn_width == 4096 and gemma.hidden_size == 3072
    mistral = shape("mistral-7b")
    short, _ = step_flops(mistral, plan, tokens=tokens, seq_len=4096)
    long, _ = step_flops(mistral, plan, tokens=tokens, seq_len=8192)
    assert long == short  # beyond the window a token attends to 4096 tokens, not more
    assert shape("qwen2.5-7b").attn_params == 3584 * 3584 * 2 + 2 * 3584 * 512 + 3584 + 2 * 512  # q/k/v biases
    assert shape("qwen3-8b").attn_params == 4096 * 4096 * 2 + 2 * 4096 * 1024 + 2 * 128  # q/k norms


def _cli_estimate(tmp_path: Path, model: dict[str, Any], *args: str, name: str = "e") -> Any:
    """`ckptbench estimate` of one point (layout none, batch 1, 64 tokens, bf16; SGD: a short optimizer trace)."""
    path = tmp_path / f"{name}.yaml"
    data = {"name": name, "model": model, "optimizer": "sgd",
            "sweep": {"layout": ["none"], "batch_size": [1], "seq_len": [64], "precision": ["bf16"]}}
    path.write_text(json.dumps(data))
    return CliRunner().invoke(app, ["estimate", str(path), *args], env={"COLUMNS": "200"})


@pytest.mark.slow
def test_estimate_predicts_every_listed_preset_on_the_cuda_target(tmp_path: Path) -> None:
    """`ckptbench estimate` on a config naming each listed preset (batch 1, 64 tokens, CUDA target, H200):
    a predicted peak, larger for the larger sizes of a family."""
    peaks = {}
    for preset in LISTED:
        result = _cli_estimate(tmp_path, {"preset": preset}, "--format", "json", name=preset)
        assert result.exit_code == 0, result.output
        (point,) = json.loads(result.stdout)
        assert point["key"]["model"] == preset
        assert point["key"]["architecture"] == PUBLISHED[preset][1]["model_type"]
        peaks[preset] = point["predicted_peak_allocated_bytes"]
    assert peaks["llama-2-7b"] < peaks["llama-2-13b"] < peaks["llama-2-70b"]
    assert peaks["llama-3.2-1b"] < peaks["llama-3.2-3b"] < peaks["llama-3.1-8b"] < peaks["llama-3.1-70b"]
    assert peaks["qwen2.5-7b"] < peaks["qwen2.5-14b"] < peaks["qwen2.5-32b"]
    assert peaks["qwen3-8b"] < peaks["qwen3-14b"] < peaks["qwen3-32b"]


def test_a_hand_written_qwen3_8b_config_json_estimates_like_the_preset(tmp_path: Path) -> None:
    """The repository's configs/qwen3-8b-config-json.yaml points at a Qwen3-8B-shaped config.json (with the fields
    that do not matter: torch_dtype, transformers_version, architectures, token ids): its table prints predictions,
    and the config.json's peaks are the qwen3-8b preset's."""
    cfg = load_config(REPO / "configs" / "qwen3-8b-config-json.yaml")
    assert cfg.model.config_fields is not None and cfg.model.config_fields["torch_dtype"] == "bfloat16"
    assert cfg.model.name == "Qwen3-8B" and cfg.model.architecture == "qwen3"
    table = CliRunner().invoke(app, ["estimate", str(REPO / "configs" / "qwen3-8b-config-json.yaml")],
                               env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    rows = [line for line in table.stdout.splitlines() if line.startswith("│ ")]
    assert [r.split("│")[1].strip() for r in rows] == ["none", "all"] and all(r.count("GiB") >= 4 for r in rows)
    peaks = []
    # the preset's config is the one test_estimate_predicts_every_listed_preset estimated (shared_estimates)
    for model, name in (({"config": str(QWEN3_8B_JSON)}, "e"), ({"preset": "qwen3-8b"}, "qwen3-8b")):
        result = _cli_estimate(tmp_path, model, "--format", "json", name=name)
        assert result.exit_code == 0, result.output
        (point,) = json.loads(result.stdout)
        assert point["key"]["architecture"] == "qwen3"
        peaks.append((point["predicted_peak_allocated_bytes"], point["predicted_peak_reserved_bytes"]))
    assert peaks[0] == peaks[1] and peaks[0][0] > 16 * 2**30  # bf16 weights alone are 15.3 GiB


MIXTRAL = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_local_experts": 8, "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768}
T5 = {"architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "d_model": 512, "num_layers": 6,
      "is_encoder_decoder": True, "vocab_size": 32128}


@pytest.mark.parametrize(
    ("fields", "what"),
    [(MIXTRAL, "a mixture-of-experts model"), (T5, "an encoder-decoder model"),
     ({**MIXTRAL, "model_type": "qwen3_moe"}, "a mixture-of-experts model"),
     ({**MIXTRAL, "model_type": "qwen3", "num_experts": 64}, "a mixture-of-experts model (num_experts: 64)"),
     ({"model_type": "mamba", "hidden_size": 768}, "a state-space"), ({"model_type": "bert"}, "not a supported")],
    ids=["mixtral", "t5", "qwen3-moe", "experts-field", "mamba", "bert"],
)
@pytest.mark.parametrize("command", ["estimate", "sweep"])
def test_unsupported_architectures_are_refused_in_one_line(
    tmp_path: Path, fields: dict[str, Any], what: str, command: str
) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(fields))
    (tmp_path / "c.yaml").write_text("name: x\ndevice: cpu\nmodel: {config: m/config.json}\n")
    result = CliRunner().invoke(app, [command, str(tmp_path / "c.yaml"), "--out", str(tmp_path / "run")]
                                if command == "sweep" else [command, str(tmp_path / "c.yaml")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and what in line and "model.config" in line
    assert "llama, mistral, qwen2, qwen3, gemma, gemma2, phi3, olmo2" in line
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_config_json_forms(tmp_path: Path) -> None:
    """model.config: read relative to the YAML's folder, stored in the run (never needed again), memory-irrelevant
    fields kept but ignored, overrides on top, unknown override names named with the family's config class."""
    (tmp_path / "ckpt").mkdir()
    shutil.copy(QWEN3_8B_JSON, tmp_path / "ckpt" / "config.json")
    yaml = tmp_path / "c.yaml"
    yaml.write_text("name: x\nmodel:\n  config: ckpt/config.json\n  overrides: {num_hidden_layers: 2}\n")
    cfg = load_config(yaml)
    assert cfg.model.num_layers == 2 and cfg.model.name == "ckpt+num_hidden_layers=2"
    dumped = cfg.model_dump(mode="json")
    (tmp_path / "ckpt" / "config.json").unlink()
    again = parse_config(dumped)  # a stored run's config: the file is no longer needed
    assert again.model == cfg.model and again.points_list() == cfg.points_list()
    hf: Any = hf_config(cfg.model)
    assert type(hf).__name__ == "Qwen3Config" and hf.num_hidden_layers == 2 and hf.dtype is None
    assert parse_config({"name": "x"}).model_dump(mode="json")["model"] == {
        "preset": "llama-7b", "overrides": {}, "attn_implementation": "sdpa"}  # a preset's spec dumps as before
    with pytest.raises(ConfigError, match=r"model\.overrides\.q_norm_eps: not a Qwen3Config field"):
        parse_config({"name": "x", "model": {"config_fields": json.loads(QWEN3_8B_JSON.read_text()),
                                             "overrides": {"q_norm_eps": 1.0}}})  # refused when read, before any trace
    for model, message in [
        ({"config": "nope/config.json"}, "model.config: no such file 'nope/config.json'"),
        ({"preset": "qwen3-8b", "config": "x.json"}, "model: give either a preset or a config"),
        ({"preset": "qwen3-8b", "overrides": {"model_type": "llama"}}, "model_type cannot be overridden"),
        ({"preset": "gemma-2-9b"}, "model.attn_implementation: sdpa is not supported by Gemma-2"),
    ]:
        with pytest.raises(ConfigError, match=message):
            parse_config({"name": "x", "model": model})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad.json is not JSON \(line 1"):
        parse_config({"name": "x", "model": {"config": str(tmp_path / "bad.json")}})


def test_keys_carry_the_architecture_and_old_runs_are_llama(tmp_path: Path) -> None:
    """Two config.json files in folders of the same name build points whose keys differ in the architecture alone
    (compare never matches them); a record written before the axis existed reads back as LLaMA."""
    keys = []
    for model_type in ("llama", "qwen3"):
        folder = tmp_path / model_type / "m"
        folder.mkdir(parents=True)
        fields = {**TINY_FAMILIES["tiny-qwen3"], "model_type": model_type}
        (folder / "config.json").write_text(json.dumps(fields))
        (point,) = parse_config({"name": "x", "model": {"config": str(folder / "config.json")}}).points_list()
        keys.append(point.key)
    assert keys[0]["model"] == keys[1]["model"] == "m"
    assert {k: v for k, v in keys[0].items() if keys[1][k] != v} == {"architecture": "llama"}
    old = {k: v for k, v in keys[1].items() if k != "architecture"}
    rec = PointRecord.read({"key": old, "status": "ok"})
    assert rec.key["architecture"] == "llama" and point_of(rec.key) is not None


@pytest.mark.slow
def test_tune_recommend_and_report_on_a_qwen3(tmp_path: Path) -> None:
    """tune picks and measures a Qwen3 point under a budget (its candidates' keys carry the architecture, tune's
    FLOPs count the family's own layers), and recommend and report read the run."""
    config = tmp_path / "q.yaml"
    config.write_text(json.dumps({**_family_data("tiny-qwen3"), "sweep": {
        "layout": ["none"], "batch_size": [2], "seq_len": [64], "precision": ["fp32"]}}))
    run_dir = tmp_path / "run"
    runner = CliRunner()
    tuned = runner.invoke(app, ["tune", str(config), "--budget", "6MiB", "--headroom", "0", "--out", str(run_dir),
                                "--max-points", "1", "--format", "json"])
    assert tuned.exit_code == 0, tuned.output
    answer = json.loads(tuned.stdout)["answer"]
    assert answer["key"]["architecture"] == "qwen3" and answer["key"]["model"] == "tiny-qwen3"
    recommended = runner.invoke(app, ["recommend", str(run_dir), "--budget", "6MiB", "--format", "json"])
    assert recommended.exit_code == 0, recommended.output
    assert json.loads(recommended.stdout)["best"]["key"] == answer["key"]
    report = runner.invoke(app, ["report", str(run_dir), "--no-estimate"])
    assert report.exit_code == 0, report.output
