"""`ckptbench advise`: the answer for a model on a card, from predictions, without a GPU."""

from __future__ import annotations

import sys
from enum import Enum
from typing import Annotated, Any

import typer

from ckptbench.cli.common import Command, err, fail, finite, out
from ckptbench.cli.progress import EstimateProgressBar
from ckptbench.config.cards import CARDS
from ckptbench.errors import CkptbenchError
from ckptbench.results.fit import DEFAULT_HEADROOM

# Options that take several values, as `--batch 2 8` (click takes one value per occurrence: `--batch 2 --batch 8`).
_MANY = ("--batch", "--seq", "--times-from")


class AdviseCommand(Command):
    """`advise`'s command: `--batch 2 8` is read as `--batch 2 --batch 8` (the same for --seq, --times-from)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        spread: list[str] = []
        current: str | None = None
        for arg in args:
            if arg in _MANY:
                current = arg
                spread.append(arg)
                continue
            if current is not None and spread[-1] != current and not arg.startswith("-"):
                spread.append(current)  # one more value of the last multi-valued option
            elif arg.startswith("-"):
                current = None
            spread.append(arg)
        return super().parse_args(ctx, spread)


# Generated from the card table (config/cards.py): a few common keys and the count.
_COMMON = ("h100-80gb", "a100-80gb", "a100-40gb", "l40s", "rtx-4090", "a10g", "l4")
CARD_HELP = (f"A card ({', '.join(k for k in _COMMON if any(c.key == k for c in CARDS))}, ...: `ckptbench gpus` lists "
             f"all {len(CARDS)}) or its memory size (24GiB).")


class AdviseFormat(str, Enum):
    """What advise writes: a table for people, Markdown or JSON (every number labelled)."""

    table = "table"
    markdown = "markdown"
    json = "json"


def advise_cmd(
    model: Annotated[str, typer.Option(
        "--model", metavar="MODEL",
        help="A preset (llama-7b, llama-3.1-8b, qwen3-8b, ...), a config.json or its folder, or a Hugging Face id "
             "(org/name: config.json only, the local cache first).")] = "llama-7b",
    gpu: Annotated[str, typer.Option("--gpu", metavar="CARD|SIZE", help=CARD_HELP)] = "a100-80gb",
    batch: Annotated[list[int] | None, typer.Option("--batch", metavar="N", help="Batch size(s) per step.")] = None,
    seq: Annotated[list[int] | None, typer.Option("--seq", metavar="N", help="Sequence length(s).")] = None,
    precision: Annotated[str | None, typer.Option(
        "--precision", metavar="P",
        help="bf16 (pure), amp_bf16 (HF bf16=True), fp16, amp_fp16, fp32. Default: bf16, and one sentence for "
             "amp_bf16.")] = None,
    attention: Annotated[str | None, typer.Option(
        "--attention", metavar="sdpa|eager",
        help="The attention kernels (transformers' attn_implementation): sdpa (the default where the model's code "
             "has it) or eager (the S x S scores materialised).")] = None,
    optimizer: Annotated[str, typer.Option("--optimizer", metavar="NAME",
                                           help="adamw_fused, adamw_foreach, adamw_8bit, sgd, adafactor, ...")]
    = "adamw_fused",
    headroom: Annotated[str, typer.Option(
        "--headroom", metavar="PCT|SIZE", help="Kept free under the budget: a share of it (5%) or a size (2GiB).")]
    = DEFAULT_HEADROOM,
    budget: Annotated[str | None, typer.Option(
        "--budget", metavar="SIZE", help="Memory to fit within (default: the card's usable memory), e.g. 70GiB.")]
    = None,
    parallel: Annotated[str, typer.Option(
        "--parallel", metavar="ddp:N|fsdp2:N", help="N cards, data parallel or FSDP2-sharded: answered per rank.")]
    = "none",
    tflops: Annotated[float | None, typer.Option(
        "--tflops", metavar="TFLOP/S", callback=finite,
        help="With --gpu SIZE: the card's dense bf16 peak, to carry step times over.")] = None,
    bandwidth: Annotated[float | None, typer.Option(
        "--bandwidth", metavar="TB/S", callback=finite, help="With --gpu SIZE: the card's memory bandwidth.")] = None,
    times_from: Annotated[list[str] | None, typer.Option(
        "--times-from", metavar="RUN", help="Fit step times to these runs (default: the committed H200 runs).")]
    = None,
    observed: Annotated[str | None, typer.Option(
        "--observed", metavar="SIZE", help="What nvidia-smi shows for your process (70GB, 71.5GiB).")] = None,
    allow: Annotated[str | None, typer.Option(
        "--allow", metavar="WHAT", help="Ways out that change what is trained, comma-separated: lora.")] = None,
    fmt: Annotated[AdviseFormat, typer.Option("--format", help="table (default), markdown or json.")]
    = AdviseFormat.table,
) -> None:
    """Which layers to checkpoint on your card: predicted memory of every layout family (every count of layers
    predicted), the fastest setup that fits with the headroom kept (micro-batches with gradient accumulation
    weighed), step times, what fills the memory, and the code to apply it. No GPU needed."""
    # The flags are checked before anything imports torch: a mistyped card is refused at once.
    from ckptbench.advise.request import AdviseRequest

    try:
        request = AdviseRequest(
            model=model, gpu=gpu, batches=tuple(batch or [2]), seqs=tuple(seq or [2048]), precision=precision,
            optimizer=optimizer, times_from=tuple(times_from or ()), observed=observed,
            allow=tuple(a.strip() for a in (allow or "").split(",") if a.strip()), headroom=headroom, budget=budget,
            tflops=tflops, bandwidth=bandwidth, parallel=parallel, attn=attention,
        ).checked()
    except CkptbenchError as exc:
        raise fail(exc) from None
    from ckptbench.advise.advice import advise
    from ckptbench.estimator import tracer
    from ckptbench.render.advise import advise_json_text, advise_markdown, advise_renderable

    try:
        with EstimateProgressBar(err) as bar:
            advice = advise(request, on_progress=bar.update)
    except CkptbenchError as exc:
        raise fail(exc) from None
    tracer.answered()  # its traces are on disk: a question on the same model starts no tracer
    if fmt is AdviseFormat.table:
        out.print(advise_renderable(advice))
    else:
        sys.stdout.write(advise_markdown(advice) if fmt is AdviseFormat.markdown else advise_json_text(advice))
