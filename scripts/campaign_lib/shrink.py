"""A GPU config shrunk to a CPU plumbing check (the GPU campaign's DRY=1 form): same axes, tiny model. Pure.

The shrunk config keeps what the stage exercises (layouts, searches, explicit points, technique axes) and
changes what a CPU cannot do or would take minutes for: the tiny preset with a quarter of the layers
(at least 8; each layout maps onto them: first:16 of 32 becomes first:4 of 8, range:8-12 range:2-3),
sequence lengths divided by 32, caps and budgets scaled with the static memory (parameters, gradients,
optimizer state) of the tiny model against the real one, pure bf16 and fp16 turned into fp32 (slow on
most CPUs), offloading, compile and allocator settings (CUDA only) left out, sharded points as two gloo
ranks (``ddp:8`` becomes ``ddp:2``), one warm-up and one measured step, and fewer cells: the first three
layouts of the sweep, its smallest and largest batch, the first four explicit points. Its results are
never measurements of anything but the plumbing.
"""

from __future__ import annotations

import copy
from typing import Any

from ckptbench.config.presets import PRESETS

SEQ_DIVISOR = 32
MAX_SEQ = 128
MIN_LAYERS = 8
MAX_SEARCH_BATCH = 16
MAX_LAYOUTS, MAX_POINTS = 3, 4
DRY_RANKS = 2  # processes per sharded point on the CPU
# Pure bf16 and fp16 matmuls are slow on most CPUs (seconds per tiny step); fp32 and autocast keep DRY fast.
_PRECISION = {"bf16": "fp32", "fp16": "fp32", "amp_fp16": "amp_bf16"}


def _seq(value: int) -> int:
    return max(16, min(MAX_SEQ, value // SEQ_DIVISOR))


def approx_params(model: dict[str, Any]) -> float:
    """Parameters of a LLaMA config (decoder matmuls, embedding and head; norms are negligible)."""
    h, i = float(model["hidden_size"]), float(model["intermediate_size"])
    return float(model["num_hidden_layers"]) * (4 * h * h + 3 * h * i) + 2 * float(model["vocab_size"]) * h


def bytes_per_param(precision: str) -> int:
    """Parameters, gradients and AdamW state: pure low precision 8 bytes, fp32 master weights 16."""
    return 8 if precision in ("bf16", "fp16") else 16


def scale_layout(layout: str, layers: int, small: int) -> str:
    """The same choice of layers on a model with ``small`` instead of ``layers`` decoder layers."""
    if layout == "fit":
        return layout
    selector, _, gran = layout.partition("@")
    kind, _, arg = selector.partition(":")

    def at(i: int) -> int:
        return min(small - 1, i * small // layers)

    def count(k: int) -> int:  # a partial choice stays partial, a non-empty one non-empty
        return max(1, min(small - 1, round(k * small / layers))) if 0 < k < layers else k * small // layers

    if kind in ("first", "last"):
        selector = f"{kind}:{count(int(arg))}"
    elif kind == "range":
        a, b = (int(x) for x in arg.split("-"))
        selector = f"range:{at(a)}-{at(b)}"
    elif kind == "layers":
        selector = "layers:" + ",".join(str(i) for i in sorted({at(int(x)) for x in arg.split(",")}))
    elif kind == "every":
        n, _, off = arg.partition("+")
        n_small = min(int(n), small)
        selector = f"every:{n_small}" + (f"+{int(off) % n_small}" if off else "")
    return selector + (f"@{gran}" if gran else "")


def dry_parallel(value: str) -> str:
    """A sharded point on the CPU: the same kind over two gloo ranks (real collectives, two processes)."""
    kind, _, rest = str(value).partition(":")
    if kind == "none" or not rest:
        return value
    _, _, mode = rest.partition(":")
    return f"{kind}:{DRY_RANKS}" + (f":{mode}" if mode else "")


def _point(spec: dict[str, Any], layers: int, small: int) -> dict[str, Any]:
    out = dict(spec)
    if out.get("layout"):
        out["layout"] = scale_layout(str(out["layout"]), layers, small)
    if out.get("seq_len"):
        out["seq_len"] = _seq(int(out["seq_len"]))
    if out.get("precision"):
        out["precision"] = _PRECISION.get(out["precision"], out["precision"])
    if out.get("offload") not in (None, "none"):
        out["offload"] = "none"  # pinned host memory needs CUDA
    if out.get("compile"):
        out["compile"] = False  # compile cannot run under the CPU tracker
    if out.get("parallel"):
        out["parallel"] = dry_parallel(str(out["parallel"]))
    if out.get("allocator") not in (None, "default"):
        out["allocator"] = "default"  # PYTORCH_CUDA_ALLOC_CONF configures the CUDA allocator only
    return out


def _sweep(axes: dict[str, Any], layers: int, small: int) -> dict[str, Any]:
    out = dict(axes)
    if out.get("layout"):
        out["layout"] = list(dict.fromkeys(scale_layout(str(x), layers, small) for x in out["layout"]))[:MAX_LAYOUTS]
    if isinstance(out.get("batch_size"), list) and len(out["batch_size"]) > 2:
        out["batch_size"] = [min(out["batch_size"]), max(out["batch_size"])]
    if out.get("seq_len"):
        out["seq_len"] = sorted({_seq(int(s)) for s in out["seq_len"]})
    if out.get("precision"):
        out["precision"] = list(dict.fromkeys(_PRECISION.get(p, p) for p in out["precision"]))
    if out.get("offload"):
        out["offload"] = ["none"]
    if out.get("compile"):
        out["compile"] = [False]
    if out.get("parallel"):
        out["parallel"] = list(dict.fromkeys(dry_parallel(str(v)) for v in out["parallel"]))
    if out.get("allocator"):
        out["allocator"] = ["default"]
    return out


def dry_config(data: dict[str, Any]) -> dict[str, Any]:
    """The CPU form of a config's YAML data (before validation)."""
    out = copy.deepcopy(data)
    model = dict(out.get("model") or {})
    real = {**PRESETS[model.get("preset", "llama-7b")], **(model.get("overrides") or {})}
    layers = int(real["num_hidden_layers"])
    small = max(MIN_LAYERS, layers // 4)
    tiny = {**PRESETS["tiny"], "num_hidden_layers": small}
    out["model"] = {"preset": "tiny", "overrides": {"num_hidden_layers": small},
                    "attn_implementation": model.get("attn_implementation", "sdpa")}
    out["name"] = f"{out.get('name', 'config')}-dry"
    out["device"] = "cpu"
    out["warmup_steps"], out["measured_steps"] = 1, 1
    precision = str(((out.get("sweep") or {}).get("precision") or ["bf16"])[0])
    ratio = (approx_params(tiny) * bytes_per_param(_PRECISION.get(precision, precision))
             / (approx_params(real) * bytes_per_param(precision)))
    for field in ("memory_cap_gib", "budget_gib"):
        if out.get(field):  # the same headroom over the static part as on the real card
            out[field] = float(out[field]) * ratio
    if "search_max_batch" in out or (out.get("sweep") or {}).get("batch_size") == "max":
        out["search_max_batch"] = min(int(out.get("search_max_batch", MAX_SEARCH_BATCH)), MAX_SEARCH_BATCH)
    out["sweep"] = _sweep(dict(out.get("sweep") or {}), layers, small)
    out["points"] = [_point(p, layers, small) for p in out.get("points") or []][:MAX_POINTS]
    out.pop("peak_tflops", None)
    return out
