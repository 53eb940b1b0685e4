"""What `ckptbench tune` searches: layouts x batch sizes x micro-batches x techniques, for one training
semantics (the config's precision and optimizer, full-parameter training) and one way of spreading
it (the config's single ``parallel`` value). Pure: config only.

Each axis takes the values the config lists when it lists more than the default; otherwise tune picks
them: every ``first:k`` layout (k = 1 .. L-1) plus ``none``, ``all`` and ``all@selective``; batch sizes
in powers of two (the caller stops at the first batch where nothing is predicted to fit); and every
technique that keeps the semantics and can run on the device (loss heads, the optimizer in backward,
and on CUDA torch.compile). Techniques that change what is trained or the optimizer's numerics come
only with ``--allow`` (``ALLOWABLE``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ckptbench.config.compat import refusal
from ckptbench.config.grid import AXIS_DEFAULTS, Point
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError

# --allow NAME: what it adds, and why it is opt-in.
ALLOWABLE: dict[str, str] = {
    "lora": "LoRA adapters (lora.target_modules): trains adapters, not the full model",
    "8bit": "8-bit AdamW (torchao; bitsandbytes): quantised optimizer state changes the updates",
    "factored": "Adafactor: a factored second moment changes the updates",
    "offload_optimizer": "optimizer state and step on the CPU (torchao's CPUOffloadOptimizer)",
}
# recommend and answers judge measured runs, which may hold any optimizer: one more opt-in there.
MEASURED_ALLOWABLE: dict[str, str] = {**ALLOWABLE, "optimizer": "an optimizer other than the run's (sgd for adamw)"}
DEFAULT_LORA_RANK = "r16"
# Axes whose values change what is trained or how the optimizer computes: fixed unless allowed.
SEMANTIC_AXES = ("optimizer", "lora", "optimizer_offload")
# Axes that change speed in ways FLOPs do not show: candidates are only compared within one class.
SPEED_AXES = ("compile", "attn_implementation", "offload", *SEMANTIC_AXES)


@dataclass(frozen=True)
class TuneSpace:
    """The axes tune searches; ``points`` is their product minus combinations that cannot run."""

    seq_len: int
    precision: str
    layouts: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    techniques: dict[str, tuple[Any, ...]]  # every other point axis -> its candidate values
    allowed: tuple[str, ...]

    def points(
        self, model: str, *, architecture: str = "llama", batch_sizes: Iterable[int] | None = None
    ) -> list[Point]:
        names = list(self.techniques)
        out = []
        for batch in self.batch_sizes if batch_sizes is None else batch_sizes:
            for layout, values in itertools.product(self.layouts, itertools.product(*self.techniques.values())):
                fields = dict(zip(names, values, strict=True))
                point = Point(model=model, architecture=architecture, precision=self.precision,
                              seq_len=self.seq_len, batch_size=batch, layout=layout, **fields)
                if runnable(point):
                    out.append(point)
        return out


def runnable(point: Point) -> bool:
    """Combinations that can run at all: none of config/compat.py's rules refuses it (the config would refuse the
    others, or the runner skip them)."""
    return refusal(point) is None


def parse_allow(text: str | None, *, allowable: Mapping[str, str] = ALLOWABLE) -> tuple[str, ...]:
    """'lora,8bit' -> ('8bit', 'lora'); an unknown name is a ConfigError naming the allowed ones."""
    names = sorted({n.strip() for n in (text or "").split(",") if n.strip()})
    unknown = [n for n in names if n not in allowable]
    if unknown:
        raise ConfigError(f"--allow: {unknown[0]!r} is not one of {', '.join(allowable)}")
    return tuple(names)


def default_layouts(num_layers: int) -> tuple[str, ...]:
    """none, first:1 .. first:L-1, all, all@selective: the fewest early layers that fit is what wins."""
    return ("none", *(f"first:{k}" for k in range(1, num_layers)), "all", "all@selective")


def _listed(cfg: SweepConfig, axis: str) -> list[Any] | None:
    """The config's values of an axis when it lists more than the default, else None (tune picks)."""
    values = cfg.axis_values()[axis]
    return None if values == [AXIS_DEFAULTS.get(axis, values[0] if values else None)] else values


def tune_space(
    cfg: SweepConfig, *, device_type: str, seq_len: int | None, allow: tuple[str, ...], max_batch: int = 64
) -> TuneSpace:
    """The space for ``cfg`` on ``device_type`` ('cpu' or 'cuda') with the opt-in techniques ``allow``."""
    values = cfg.axis_values()
    if len(values["precision"]) != 1:
        raise ConfigError("sweep.precision: tune keeps the precision fixed; list exactly one")
    if len(values["parallel"]) != 1:
        raise ConfigError("sweep.parallel: tune keeps the parallel setting fixed; list exactly one")
    seqs = values["seq_len"]
    if seq_len is None and len(seqs) != 1:
        raise ConfigError(f"--seq-len: the config lists several sequence lengths {seqs}; choose one")
    max_pos = cfg.model.resolved().get("max_position_embeddings")
    if seq_len is not None and (seq_len < 1 or (isinstance(max_pos, int) and seq_len > max_pos)):
        raise ConfigError(f"--seq-len: {seq_len} is not between 1 and the model's max_position_embeddings ({max_pos})")
    layouts = values["layout"] if cfg.sweep.layout != ["none"] else list(default_layouts(cfg.model.num_layers))
    batches = values["batch_size"] if cfg.sweep.batch_size not in ("max", [1]) else _powers_of_two(
        min(cfg.search_max_batch, max_batch)
    )
    return TuneSpace(
        seq_len=seq_len or seqs[0],
        precision=values["precision"][0],
        layouts=tuple(layouts),
        batch_sizes=tuple(batches),
        techniques=_techniques(cfg, device_type, allow),
        allowed=allow,
    )


def _powers_of_two(limit: int) -> list[int]:
    return [2**i for i in range(limit.bit_length()) if 2**i <= limit]


def _techniques(cfg: SweepConfig, device_type: str, allow: tuple[str, ...]) -> dict[str, tuple[Any, ...]]:
    cuda = device_type == "cuda"
    picked: dict[str, list[Any]] = {
        "loss": ["default", "chunked", "fused_linear"] if cuda else ["default", "chunked"],
        "optimizer_in_backward": [False, True],
        "compile": [False, True] if cuda else [False],
        "micro_batches": [1],
        "offload": ["none"],  # activation offloading trades PCIe time for memory: listed, not picked
        "attn_implementation": [cfg.model.attn_implementation],
        "optimizer": [cfg.optimizer],
        "lora": ["none"],
        "optimizer_offload": ["none"],
        "parallel": list(cfg.axis_values()["parallel"]),  # fixed: every candidate spread the same way
    }
    for axis in picked:
        listed = None if axis in SEMANTIC_AXES else _listed(cfg, axis)  # semantics change only with --allow
        if listed is not None:
            picked[axis] = listed
    if "lora" in allow:
        ranks = [r for r in cfg.sweep.lora if r != "none"] or [DEFAULT_LORA_RANK]
        picked["lora"] = _union(picked["lora"], ranks)
    if "8bit" in allow:
        picked["optimizer"] = _union(picked["optimizer"], ["adamw_8bit_torchao", "adamw_8bit"] if cuda else [])
    if "factored" in allow:
        picked["optimizer"] = _union(picked["optimizer"], ["adafactor"])
    if "offload_optimizer" in allow and cuda:
        picked["optimizer_offload"] = _union(picked["optimizer_offload"], ["cpu"])
    return {axis: tuple(v) for axis, v in picked.items()}


def _union(first: list[Any], more: list[Any]) -> list[Any]:
    return list(dict.fromkeys([*first, *more]))


def layout_family(layout: str) -> str:
    """'first:12' -> 'first:k', 'first:3@mlp' -> 'first:k@mlp'; 'none', 'all', 'all@selective' stay."""
    selector, at, granularity = layout.partition("@")
    kind = selector.split(":", 1)[0]
    family = f"{kind}:k" if ":" in selector else kind
    return family + (at + granularity if at else "")


def savers(point: Point) -> frozenset[str]:
    """The memory-saving techniques a point uses besides checkpointing (each costs some time)."""
    found = set()
    if point.loss == "chunked":
        found.add("chunked loss")
    if point.optimizer_in_backward:
        found.add("optimizer in backward")
    if point.micro_batches > 1:
        found.add(f"{point.micro_batches} micro-batches")
    return frozenset(found)


def speed_class(point: Point) -> tuple[Any, ...]:
    key = point.key
    return (*(key[a] for a in SPEED_AXES), point.loss == "fused_linear")


# Optimizers with the same numerics as another (implementations of one algorithm): not a change of training.
_SAME_OPTIMIZER = {"adamw_fused": "adamw", "adamw_foreach": "adamw", "adamw": "adamw"}
# Which --allow name an optimizer needs when it differs from the run's own.
_OPTIMIZER_ALLOW = {"adamw_8bit": "8bit", "adamw_8bit_torchao": "8bit", "adafactor": "factored"}


def training_change(key: Mapping[str, Any], *, optimizer: str) -> tuple[str, str] | None:
    """What makes a point train something other than full fine-tuning with ``optimizer`` (the run's or the
    config's), as (the --allow name it needs, why); None: the same training. The one definition tune,
    recommend and answers share: such a point is never a recommendation unless allowed."""
    lora = key.get("lora", "none")
    if lora != "none":
        return "lora", f"lora={lora}: {ALLOWABLE['lora']}"
    if key.get("optimizer_offload", "none") not in ("none", None):
        return "offload_optimizer", f"optimizer_offload={key['optimizer_offload']}: {ALLOWABLE['offload_optimizer']}"
    opt = str(key.get("optimizer", optimizer))
    if _SAME_OPTIMIZER.get(opt, opt) != _SAME_OPTIMIZER.get(optimizer, optimizer):
        name = _OPTIMIZER_ALLOW.get(opt, "optimizer")
        return name, f"optimizer={opt}: {MEASURED_ALLOWABLE[name]}"
    return None


def semantic_changes(point: Point) -> list[str]:
    """'optimizer=adamw_8bit_torchao' and the like: what changes the training semantics."""
    key = point.key
    return [f"{a}={key[a]}" for a in SEMANTIC_AXES if key[a] != AXIS_DEFAULTS[a]]
