"""The code that applies a layout in the frameworks people train with: transformers (HF Trainer, TRL), plain
PyTorch, and the nearest setting of torchtitan and Megatron-Core, saying plainly where none is exact."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.config.layouts import LayoutPlan, compress_ranges


@dataclass(frozen=True)
class Snippets:
    """One layout's code per framework (Python for transformers and PyTorch, settings for the others)."""

    layout: str
    transformers: str
    pytorch: str
    torchtitan: str
    megatron: str

    def to_json(self) -> dict[str, str]:
        return {"layout": self.layout, "transformers": self.transformers, "pytorch": self.pytorch,
                "torchtitan": self.torchtitan, "megatron": self.megatron}


def _layers(plan: LayoutPlan) -> str:
    """The layer indices as Python: 'range(0, 12)' for a run, else a set literal."""
    layers = plan.layers
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"set(range({layers[0]}, {layers[-1] + 1}))"
    return "{" + ", ".join(map(str, layers)) + "}"


def transformers_code(plan: LayoutPlan) -> str:
    """transformers / HF Trainer / TRL: the per-layer ``gradient_checkpointing`` flag after enabling it."""
    if not plan.layers:
        return (
            "# No checkpointing: leave it off (TRL's SFTConfig turns it on by default)\n"
            "model.gradient_checkpointing_disable()\n"
            "# HF Trainer / TRL: TrainingArguments(..., gradient_checkpointing=False)"
        )
    if plan.granularity != "block":
        sub = {"attn": "self_attn", "mlp": "mlp", "attn+mlp": "self_attn and mlp", "selective": "per-op"}
        return (
            f"# No exact equivalent: transformers checkpoints whole decoder layers only\n"
            f"# ({sub[plan.granularity]} needs the plain PyTorch wrapping below)."
        )
    return (
        "# after loading the model, before Trainer(...)/SFTTrainer(...);\n"
        "# transformers 5 also names it activation_checkpointing_enable\n"
        "model.gradient_checkpointing_enable(\n"
        '    gradient_checkpointing_kwargs={"use_reentrant": False})\n'
        f"CHECKPOINTED = {_layers(plan)}  # {plan.layout}: layers {plan.describe_layers()}\n"
        "for i, layer in enumerate(model.model.layers):\n"
        "    layer.gradient_checkpointing = i in CHECKPOINTED\n"
        "# HF Trainer / TRL: gradient_checkpointing=False in TrainingArguments /\n"
        "# SFTConfig, so that train() does not turn it back on for every layer"
    )


def pytorch_code(plan: LayoutPlan) -> str:
    """Plain PyTorch: ``torch.utils.checkpoint`` around the chosen modules."""
    if not plan.layers:
        return "# No checkpointing: call the layers as they are."
    if plan.granularity == "selective":
        return (
            "# Per-op (selective): torch.utils.checkpoint with a policy that saves\n"
            "# matmul and attention outputs (create_selective_checkpoint_contexts);\n"
            "# torchtitan's selective 'op' mode is a worked example."
        )
    parts = {"block": [""], "attn": [".self_attn"], "mlp": [".mlp"], "attn+mlp": [".self_attn", ".mlp"]}
    targets = " + ".join(f"[m{p} for m in chosen]" if p else "chosen" for p in parts[plan.granularity])
    return (
        "import torch.utils.checkpoint as cp\n"
        "\n"
        "def checkpointed(module):\n"
        "    forward = module.forward\n"
        "    def run(*args, **kwargs):\n"
        "        return cp.checkpoint(forward, *args, use_reentrant=False,\n"
        "                             **kwargs)\n"
        "    module.forward = run\n"
        "\n"
        f"chosen = [model.model.layers[i] for i in sorted({_layers(plan)})]\n"
        f"for module in {targets}:\n"
        "    checkpointed(module)"
    )


def torchtitan_setting(plan: LayoutPlan) -> str:
    """torchtitan's nearest [activation_checkpoint] setting."""
    n, count = plan.num_layers, len(plan.layers)
    if not count:
        return '[activation_checkpoint] mode = "none" (exact)'
    if plan.granularity == "selective" and count == n:
        return '[activation_checkpoint] mode = "selective", selective_ac_option = "op" (nearest: its own op list)'
    if plan.granularity not in ("block",):
        return (f'no exact equivalent (torchtitan wraps whole blocks); nearest: mode = "full" '
                f"({plan.granularity} only is not offered)")
    if count == n:
        return '[activation_checkpoint] mode = "full" (exact)'
    step = n // count if n % count == 0 else None
    if step is not None and plan.layers == tuple(range(step - 1, n, step)):
        return f'[activation_checkpoint] mode = "selective", selective_ac_option = "{step}" (exact)'
    freq = round(n / count)
    if freq <= 1:
        return (f'no exact equivalent (no setting picks blocks {compress_ranges(plan.layers)}); nearest: '
                f'mode = "full" (all {n} blocks)')
    picked = len(range(freq - 1, n, freq))
    return (f'no exact equivalent (no setting picks blocks {compress_ranges(plan.layers)}); nearest: mode = '
            f'"selective", selective_ac_option = "{freq}" (every {freq} blocks: {picked} of {n})')


def megatron_setting(plan: LayoutPlan) -> str:
    """Megatron-Core's nearest recompute flags."""
    n, count = plan.num_layers, len(plan.layers)
    if not count:
        return "no --recompute-granularity (exact)"
    if plan.granularity == "selective":
        return "--recompute-granularity selective (nearest: recomputes core attention only)"
    if plan.granularity != "block":
        return ("no exact equivalent; nearest: --recompute-granularity selective (core attention), or "
                "--recompute-modules on recent Megatron-Core")
    if count == n:
        return "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1 (exact)"
    if plan.layers == tuple(range(count)):
        return f"--recompute-granularity full --recompute-method block --recompute-num-layers {count} (exact)"
    return (f"no exact equivalent (--recompute-method block recomputes the first N layers); nearest: "
            f"--recompute-granularity full --recompute-method block --recompute-num-layers {count}")


def snippets(plan: LayoutPlan) -> Snippets:
    return Snippets(plan.layout, transformers_code(plan), pytorch_code(plan), torchtitan_setting(plan),
                    megatron_setting(plan))
