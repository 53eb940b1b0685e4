"""The code that applies an answer in the frameworks people train with: transformers (HF Trainer, TRL), plain
PyTorch, and the nearest setting of torchtitan and Megatron-Core, saying plainly where none is exact.

An answer is a ``Setup``: the checkpoint layout, the micro-batch and the gradient accumulation steps, and the way
out it takes when the layout alone does not fit (8-bit AdamW, optimizer state on the CPU, LoRA). transformers'
own per-layer switch is used where it can say the layout (``every_n_layers`` checkpoints layers 0, n, 2n, ...);
where it cannot (first:k, last:k), each layer's ``gradient_checkpointing`` flag is set after enabling it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.config.layouts import LayoutPlan, compress_ranges
from ckptbench.config.parallel import ParallelSpec, parse_parallel

# TrainingArguments' and PyTorch's way to say each precision (train/step.py: what the precision means).
_PRECISION_ARGS = {
    "bf16": ("# pure bf16: load the model with dtype=torch.bfloat16; no bf16=True", None),
    "fp16": ("# pure fp16: load the model with dtype=torch.float16; no fp16=True", None),
    "fp32": (None, None),
    "amp_bf16": (None, "bf16=True"),
    "amp_fp16": (None, "fp16=True"),
}


@dataclass(frozen=True)
class Setup:
    """What the code applies: the layout, the batch as micro-batches, and any way out beyond the layout."""

    plan: LayoutPlan
    micro_batch: int  # per_device_train_batch_size
    accumulation: int = 1  # gradient_accumulation_steps
    precision: str = "bf16"
    optimizer: str = "adamw_fused"
    optimizer_offload: bool = False  # torchao's CPUOffloadOptimizer
    lora_rank: int | None = None  # LoRA adapters of this rank (peft)
    native_every_n: bool = False  # the installed transformers offers every_n_layers
    activation_api: bool = False  # it names the switch activation_checkpointing_enable (gradient_... deprecated)
    parallel: str = "none"  # 'ddp:N' or 'fsdp2:N[:noreshard]' (config/parallel.py)

    @property
    def sharded(self) -> ParallelSpec:
        return parse_parallel(self.parallel)

    @property
    def fsdp_checkpoints_all(self) -> bool:
        """FSDP2 with every whole layer checkpointed: FSDP's own activation checkpointing says it."""
        p = self.plan
        return self.sharded.kind == "fsdp2" and p.granularity == "block" and len(p.layers) == p.num_layers

    @property
    def every_n(self) -> int | None:
        """n when the layout is whole layers 0, n, 2n, ... (what transformers' every_n_layers checkpoints)."""
        p = self.plan
        if p.granularity != "block" or not p.layers:
            return None
        for n in range(1, p.num_layers + 1):
            if p.layers == tuple(range(0, p.num_layers, n)):
                return n
        return None


@dataclass(frozen=True)
class Snippets:
    """One setup's code per framework (Python for transformers and PyTorch, settings for the others)."""

    layout: str
    transformers: str
    pytorch: str
    torchtitan: str
    megatron: str
    accelerate: str = ""  # the launcher's settings on several cards ('' on one)

    def to_json(self) -> dict[str, str]:
        return {"layout": self.layout, "transformers": self.transformers, "pytorch": self.pytorch,
                "torchtitan": self.torchtitan, "megatron": self.megatron, "accelerate": self.accelerate}


def _layers(plan: LayoutPlan) -> str:
    """The layer indices as Python: 'range(0, 12)' for a run, else a set literal."""
    layers = plan.layers
    if layers and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"set(range({layers[0]}, {layers[-1] + 1}))"
    return "{" + ", ".join(map(str, layers)) + "}"


def model_code(setup: Setup) -> str:
    """transformers: the model's own switches, to run on ``model`` after loading it (LoRA first, then the
    layout)."""
    plan, lines = setup.plan, []
    if setup.lora_rank is not None:
        lines += ["from peft import LoraConfig, get_peft_model",
                  f"model = get_peft_model(model, LoraConfig(r={setup.lora_rank}, lora_alpha=16,",
                  '    target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))',
                  "model.enable_input_require_grads()  # checkpointed layers need inputs that require grad",
                  "base = model.get_base_model()"]
    owner = "base" if setup.lora_rank is not None else "model"
    if not plan.layers:
        lines.append("# No checkpointing: leave it off (TRL's SFTConfig turns it on by default).")
        return "\n".join(lines)
    if setup.fsdp_checkpoints_all:
        lines.append("# Every layer under FSDP2: FSDP's own activation checkpointing (fsdp_config below).")
        return "\n".join(lines)
    if plan.granularity != "block":
        sub = {"attn": "self_attn", "mlp": "mlp", "attn+mlp": "self_attn and mlp", "selective": "per-op"}
        lines += ["# No exact equivalent: transformers checkpoints whole decoder layers only",
                  f"# ({sub[plan.granularity]} needs the plain PyTorch wrapping below)."]
        return "\n".join(lines)
    n = setup.every_n
    if n is not None and setup.native_every_n:
        every = f"every_n_layers={n},\n    " if n > 1 else ""
        lines += [f"# {plan.layout}: layers {plan.describe_layers()}, transformers' own switch",
                  f"{owner}.activation_checkpointing_enable({every}"
                  'activation_checkpointing_kwargs={"use_reentrant": False})']
        return "\n".join(lines)
    why = ("this transformers has no every_n_layers" if n is not None else
           f"{plan.layout} is not an every_n_layers layout (0, n, 2n, ...)")
    enable = ("activation_checkpointing_enable(\n    activation_checkpointing_kwargs" if setup.activation_api
              else "gradient_checkpointing_enable(\n    gradient_checkpointing_kwargs")
    lines += [f"# {why}:", "# enable checkpointing, then set each layer's flag",
              f'{owner}.{enable}={{"use_reentrant": False}})',
              f"CHECKPOINTED = {_layers(plan)}  # {plan.layout}: layers {plan.describe_layers()}",
              f"for i, layer in enumerate({owner}.model.layers):",
              "    layer.gradient_checkpointing = i in CHECKPOINTED"]
    return "\n".join(lines)


def trainer_arguments(setup: Setup) -> str:
    """HF Trainer / TRL: the TrainingArguments (SFTConfig) fields of the setup."""
    n = setup.every_n
    native = n is not None and setup.native_every_n and setup.plan.granularity == "block"
    native = native and not setup.fsdp_checkpoints_all
    args = [f"per_device_train_batch_size={setup.micro_batch},"]
    if setup.accumulation > 1:
        args.append(f"gradient_accumulation_steps={setup.accumulation},")
    if native:
        every = f', "every_n_layers": {n}' if n and n > 1 else ""
        args += ["gradient_checkpointing=True,", f'gradient_checkpointing_kwargs={{"use_reentrant": False{every}}},']
    else:
        why = "  # else train() turns on every layer" if setup.plan.layers else ""
        args.append(f"gradient_checkpointing=False,{why}")
    spec = setup.sharded
    if spec.kind == "fsdp2":
        ac = "True" if setup.fsdp_checkpoints_all else "False"
        args += ["fsdp=True,", f'fsdp_config={{"version": 2, "activation_checkpointing": {ac},',
                 f'            "reshard_after_forward": {spec.reshard_after_forward}}},']
    comment, flag = _PRECISION_ARGS.get(setup.precision, (None, None))
    if flag:
        args.append(f"{flag},")
    if setup.optimizer == "adamw_8bit":
        args.append('optim="adamw_bnb_8bit",  # bitsandbytes')
    lines = [comment] if comment else []
    if spec.distributed:
        lines.append(f"# launch on {spec.world_size} cards: torchrun --nproc_per_node {spec.world_size} train.py")
    lines += ["args = TrainingArguments(  # or SFTConfig(...) with TRL", "    ...,", *(f"    {a}" for a in args), ")"]
    if setup.optimizer_offload:
        lines += ["# AdamW state on the CPU: Trainer(..., optimizers=(optimizer, None)),",
                  "# the optimizer made as in the plain PyTorch code"]
    return "\n".join(lines)


def transformers_code(setup: Setup | LayoutPlan) -> str:
    """transformers / HF Trainer / TRL: the model's switches, then the Trainer's arguments."""
    s = setup if isinstance(setup, Setup) else Setup(setup, micro_batch=1)
    return f"{model_code(s)}\n{trainer_arguments(s)}"


def _optimizer_line(setup: Setup) -> str:
    params = "[p for p in model.parameters() if p.requires_grad]" if setup.lora_rank else "model.parameters()"
    if setup.optimizer_offload:
        return ("from torchao.optim import CPUOffloadOptimizer\n"
                f"optimizer = CPUOffloadOptimizer({params}, torch.optim.AdamW, lr=LR)")
    if setup.optimizer == "adamw_8bit":
        return f"import bitsandbytes as bnb\noptimizer = bnb.optim.AdamW8bit({params}, lr=LR)"
    fused = ", fused=True" if setup.optimizer == "adamw_fused" else ""
    return f"optimizer = torch.optim.AdamW({params}, lr=LR{fused})"


def wrapping_code(plan: LayoutPlan) -> str:
    """Plain PyTorch: ``torch.utils.checkpoint`` around the chosen modules (runs on ``model``)."""
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


def pytorch_code(setup: Setup | LayoutPlan) -> str:
    """Plain PyTorch: the wrapping, the optimizer, and the accumulation loop when there is one."""
    s = setup if isinstance(setup, Setup) else None
    if s is None:
        return wrapping_code(setup)  # type: ignore[arg-type]
    lines = [wrapping_code(s.plan), "", _optimizer_line(s)]
    if s.accumulation > 1:
        lines += [f"for i, batch in enumerate(loader):  # batches of {s.micro_batch}",
                  f"    (model(**batch).loss / {s.accumulation}).backward()",
                  f"    if (i + 1) % {s.accumulation} == 0:",
                  "        optimizer.step()",
                  "        optimizer.zero_grad(set_to_none=True)"]
    return "\n".join(lines)


def accelerate_settings(setup: Setup) -> str:
    """accelerate's config (accelerate launch --config_file) for a setup on several cards; '' on one."""
    spec = setup.sharded
    if spec.kind == "none":
        return ""
    if spec.kind == "ddp":
        return f"distributed_type: MULTI_GPU\nnum_processes: {spec.world_size}"
    return "\n".join([
        "distributed_type: FSDP", f"num_processes: {spec.world_size}", "fsdp_config:", "  fsdp_version: 2",
        "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP",
        f"  fsdp_reshard_after_forward: {str(spec.reshard_after_forward).lower()}",
        f"  fsdp_activation_checkpointing: {str(setup.fsdp_checkpoints_all).lower()}"
        + ("" if setup.fsdp_checkpoints_all or not setup.plan.layers else "  # the layers: the model code above"),
    ])


def _torchtitan_parallel(setup: Setup) -> str:
    spec = setup.sharded
    if spec.kind == "fsdp2":
        return f"[parallelism] data_parallel_shard_degree = {spec.world_size}; "
    if spec.kind == "ddp":
        return f"[parallelism] data_parallel_replicate_degree = {spec.world_size}; "
    return ""


def _megatron_parallel(setup: Setup) -> str:
    spec = setup.sharded
    if spec.kind == "fsdp2":
        return (f"; {spec.world_size} data-parallel ranks, nearest to FSDP2: --use-distributed-optimizer (shards the "
                "optimizer state only)")
    if spec.kind == "ddp":
        return f"; {spec.world_size} data-parallel ranks (torchrun --nproc_per_node {spec.world_size})"
    return ""


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


def snippets(setup: Setup | LayoutPlan) -> Snippets:
    s = setup if isinstance(setup, Setup) else Setup(setup, micro_batch=1)
    titan = _torchtitan_parallel(s) + torchtitan_setting(s.plan)
    megatron = megatron_setting(s.plan) + _megatron_parallel(s)
    return Snippets(s.plan.layout, transformers_code(s), pytorch_code(s), titan, megatron, accelerate_settings(s))
