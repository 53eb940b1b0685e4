"""The question `ckptbench advise` answers, checked, and the sweep config the estimator needs for it."""

from __future__ import annotations

import difflib
import functools
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import get_args

from pydantic import ValidationError

from ckptbench.advise.verdict import Limit
from ckptbench.config.axes import MAX_BATCH, OptimizerName, Precision
from ckptbench.config.cards import card_or_size
from ckptbench.config.model import MAX_STEP_FLOPS, ModelSpec, step_flops_bound
from ckptbench.config.model_source import model_section
from ckptbench.config.parallel import parse_parallel, world_size
from ckptbench.config.schema import SweepConfig
from ckptbench.errors import ConfigError
from ckptbench.estimator.gpus import GPUS, GpuModel, sized
from ckptbench.json_object import JsonObject
from ckptbench.results.fit import DEFAULT_HEADROOM
from ckptbench.units import GIB, MIB, fmt_bytes, parse_headroom, parse_size

PRECISIONS: tuple[str, ...] = get_args(Precision)
# Without --precision the answer is for pure bf16, with one more sentence for HF Trainer's bf16=True (amp_bf16).
DEFAULT_PRECISION, ALSO_PRECISION = "bf16", "amp_bf16"
OPTIMIZERS: tuple[str, ...] = get_args(OptimizerName)
ATTENTIONS = ("sdpa", "eager")  # --attention: transformers' attn_implementation values the estimator traces
ALLOWABLE = ("lora",)  # what changes what is trained: shown as a way out only when allowed
# What each precision means for the bytes of weights, gradients and optimizer state (train/step.py).
PRECISION_MEANS = {
    "bf16": "pure bf16: weights, gradients and optimizer state in bf16, no fp32 master copy",
    "fp16": "pure fp16: weights, gradients and optimizer state in fp16, no fp32 master copy",
    "fp32": "fp32 weights, gradients, optimizer state and compute",
    "amp_bf16": "fp32 weights, gradients and optimizer state, bf16 autocast compute (HF Trainer bf16=True)",
    "amp_fp16": "fp32 weights, gradients and optimizer state, fp16 autocast and a grad scaler (HF fp16=True)",
}
_OBSERVED = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(gb|gib|mb|mib)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class AdviseRequest:
    """The user's setup: what to train, on which card, at which batch sizes and sequence lengths."""

    model: str = "llama-7b"
    gpu: str = "a100-80gb"
    batches: tuple[int, ...] = (2,)
    seqs: tuple[int, ...] = (2048,)
    precision: str | None = None  # None: bf16, and a sentence for amp_bf16 (HF Trainer's bf16=True)
    optimizer: str = "adamw_fused"
    times_from: tuple[str, ...] = ()  # runs to fit step times to; empty: the committed H200 runs
    observed: str | None = None  # what nvidia-smi shows for the process ('70GB', '71.5GiB', '72000MiB')
    allow: tuple[str, ...] = field(default=())
    headroom: str = DEFAULT_HEADROOM  # kept free under the budget: a share of it ('5%') or a size ('2GiB')
    budget: str | None = None  # the memory to fit (default: the card's usable memory)
    parallel: str = "none"  # 'ddp:N' or 'fsdp2:N': N cards, answered per rank
    model_fields_json: str | None = None  # a config given as fields (ckptbench.plan on a config or a model), as JSON
    attn: str | None = None  # --attention: sdpa or eager; None: the family's own (sdpa where its code has it)
    tflops: float | None = None  # a card given by its size: its dense bf16 peak (carries step times over)
    bandwidth: float | None = None  # ... and its memory bandwidth in TB/s

    def card(self) -> GpuModel:
        """The card: one of the table (config/cards.py) by key, alias or name, or a memory size with the peaks given."""
        found = card_or_size(self.gpu)
        if isinstance(found, int):
            return sized(found, tflops=self.tflops,
                         bandwidth_bytes_per_s=self.bandwidth * 1e12 if self.bandwidth is not None else None)
        for flag, value in (("--tflops", self.tflops), ("--bandwidth", self.bandwidth)):
            if value is not None:
                raise ConfigError(f"{flag}: only with --gpu SIZE; {found.key} has its datasheet figures "
                                  "(ckptbench gpus)")
        return GPUS[found.key]

    @functools.cached_property
    def model_section(self) -> JsonObject:
        """The model as a sweep config's ``model:`` holds it: a preset, a config.json, or a hub id's fields."""
        if self.model_fields_json is not None:
            return {"config_fields": json.loads(self.model_fields_json)}
        return model_section(self.model)

    @property
    def model_name(self) -> str:
        """How the answer names the model: the preset, the config.json's folder, the hub id's name."""
        return self.model_spec().name

    @functools.cached_property
    def attention(self) -> str:
        """The attention the answer assumes: the one asked for (``--attention``), else sdpa (flash/memory-efficient
        kernels) where the family's code has it, else the family's own (Gemma-2 soft-caps its attention logits:
        eager). ConfigError for one the family's code does not run."""
        family = self._validated({**self.model_section, "attn_implementation": "eager"}).family  # every family: eager
        if self.attn is not None:
            _choice("--attention", self.attn, ATTENTIONS)
            if self.attn not in family.attention:
                raise ConfigError(f"--attention: {family.name}'s code runs {' or '.join(family.attention)} attention "
                                  f"only, not {self.attn}")
            return self.attn
        return "sdpa" if "sdpa" in family.attention else family.attention[0]

    def model_spec(self) -> ModelSpec:
        """The model checked (a family ckptbench builds; MoE, encoder-decoder and state-space models refused; its
        fields as transformers takes them), with the attention the answer assumes."""
        return self._validated({**self.model_section, "attn_implementation": self.attention})

    def _validated(self, section: JsonObject) -> ModelSpec:
        try:
            return ModelSpec.model_validate(section)
        except ValidationError as exc:
            msg = str(exc.errors()[0].get("msg", "invalid model")).removeprefix("Value error, ")
            # The field as the user gave it: their config.json's, or the hub model's, not a sweep config's section.
            msg = msg.removeprefix("model.config: ").removeprefix("model.config_fields.").removeprefix("model: ")
            raise ConfigError(f"--model: {self.model}: {msg}" if not msg.startswith(self.model) else f"--model: {msg}")\
                from None

    @property
    def answered_precision(self) -> str:
        """The precision the tables answer: --precision, else pure bf16."""
        return self.precision or DEFAULT_PRECISION

    @property
    def also_precision(self) -> str | None:
        """The precision one more sentence answers when none was asked for: HF Trainer's bf16=True."""
        return ALSO_PRECISION if self.precision is None else None

    @property
    def precisions(self) -> tuple[str, ...]:
        return (self.answered_precision, *((self.also_precision,) if self.also_precision else ()))

    def limit(self) -> Limit:
        """The budget (the card's usable memory, or --budget, at most the card's) less the headroom."""
        card = self.card()
        budget = card.total_bytes if self.budget is None else parse_size(self.budget, what="--budget")
        if budget > card.total_bytes:
            raise ConfigError(f"--budget: {fmt_bytes(budget)} is more than the {card.key}'s "
                              f"{fmt_bytes(card.total_bytes)} usable; give at most that")
        headroom = parse_headroom(self.headroom, budget_bytes=budget)
        return Limit(card, budget, headroom, self.headroom.strip(), budget_given=self.budget is not None)

    def observed_bytes(self) -> int | None:
        """The --observed figure in bytes; GB and MB are read as nvidia-smi writes them (2^30, 2^20 bytes)."""
        if self.observed is None:
            return None
        m = _OBSERVED.match(self.observed)
        # A size of hundreds of digits reads as an infinite float: refused as not a size, never an OverflowError.
        if not m or len(m.group(1)) > 24 or not 0 < float(m.group(1)) < math.inf:
            raise ConfigError(
                f"--observed: {self.observed!r} is not a memory size; give what nvidia-smi shows, e.g. 70GB, "
                "71.5GiB or 72000MiB"
            )
        unit = (m.group(2) or "gib").lower()
        return int(float(m.group(1)) * (MIB if unit.startswith("m") else GIB))

    def checked(self) -> AdviseRequest:
        """The request itself, or ConfigError (exit 2) naming the flag and what is allowed."""
        spec = self.model_spec()  # (--attention checked with it)
        for flag, value in (("--tflops", self.tflops), ("--bandwidth", self.bandwidth)):
            if value is not None and not 0 < value < math.inf:
                raise ConfigError(f"{flag}: give a positive number, got {value}")
        self.card()
        try:
            parse_parallel(self.parallel)
        except ValueError as exc:
            raise ConfigError(f"--parallel: {exc}") from None
        if self.precision is not None:
            _choice("--precision", self.precision, PRECISIONS)
        _choice("--optimizer", self.optimizer, OPTIMIZERS)
        for flag, values in (("--batch", self.batches), ("--seq", self.seqs)):
            if not values or any(v < 1 for v in values):
                raise ConfigError(f"{flag}: give positive integers, got {' '.join(map(str, values)) or 'none'}")
        if max(self.batches) > MAX_BATCH:
            raise ConfigError(f"--batch: at most {MAX_BATCH:,} sequences per step (got {max(self.batches):,})")
        max_pos = int(spec.resolved().get("max_position_embeddings") or 0)
        too_long = [s for s in self.seqs if max_pos and s > max_pos]
        if too_long:
            raise ConfigError(f"--seq: {too_long[0]} exceeds {spec.name}'s max_position_embeddings ({max_pos})")
        self._check_work(spec)
        for item in self.allow:
            _choice("--allow", item, ALLOWABLE)
        self.observed_bytes()
        self.limit()
        self.config()  # the question as a sweep config: anything it refuses is refused now, before any work
        return self

    def _check_work(self, spec: ModelSpec) -> None:
        """ConfigError naming --batch unless a step of each batch and sequence length stays countable (its FLOPs
        fit the int64 a record stores them in: config/schema.py's check, said in the flags' words)."""
        ranks = world_size(self.parallel)
        for seq in sorted(self.seqs, reverse=True):
            per_sequence = step_flops_bound(spec.resolved(), tokens=seq * ranks, seq_len=seq)
            most = MAX_STEP_FLOPS // per_sequence
            if max(self.batches) > most:
                raise ConfigError(
                    f"--batch: at most {most:,} at --seq {seq} on {spec.name} (got {max(self.batches):,}): a larger "
                    "step is more work than ckptbench can count (its FLOPs overflow an int64)"
                )

    def config(self, *, layouts: Sequence[str] = ("none",), precisions: Sequence[str] | None = None) -> SweepConfig:
        """The sweep config of the question: the model, precisions (default: every one the answer gives) and
        optimizer, on CUDA, at every batch and sequence length (measured_steps 3, as the committed H200 runs were
        measured)."""
        data = {
            "name": re.sub(r"[^A-Za-z0-9_.-]+", "-", f"advise-{self.model_spec().name}-{self.gpu}")[:100],
            "model": {**self.model_section, "attn_implementation": self.attention},
            "device": "cuda",
            "optimizer": self.optimizer,
            "measured_steps": 3,
            "sweep": {"layout": list(layouts), "batch_size": list(self.batches), "seq_len": list(self.seqs),
                      "precision": list(precisions or self.precisions), "parallel": [self.parallel]},
        }
        try:
            return SweepConfig.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = tuple(str(x) for x in first.get("loc", ()))
            flag = next((f for path, f in _FLAGS.items() if loc[:len(path)] == path), "advise")
            msg = str(first.get("msg", "invalid setup")).removeprefix("Value error, ")
            raise ConfigError(f"{flag}: {msg}" + (f" (got {first['input']!r})" if "input" in first and
                                                    not isinstance(first["input"], dict | list) else "")) from None


# Where the flags land in the sweep config advise validates (a refusal names the flag, not the field).
_FLAGS = {("sweep", "batch_size"): "--batch", ("sweep", "seq_len"): "--seq", ("sweep", "precision"): "--precision",
          ("sweep", "parallel"): "--parallel", ("optimizer",): "--optimizer", ("model",): "--model"}


def _choice(flag: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        hint = difflib.get_close_matches(value, list(allowed), n=1)
        extra = f" (did you mean {hint[0]!r}?)" if hint else ""
        raise ConfigError(f"{flag}: unknown {flag[2:]} {value!r}{extra}; allowed: {', '.join(allowed)}")
