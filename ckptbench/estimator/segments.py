"""Where the segments of a traced training step begin: module, tensor and optimizer hooks.

Forward boundaries are module hooks; backward boundaries are tensor hooks on the hidden states
between decoder layers, which fire when that tensor's gradient is complete (autograd runs every
node of a layer before the previous layer's, and accumulates weight gradients first). The hooks
only mark and tag; they hold no tensors, so they do not change what the step keeps alive.
See estimator/trace.py for the segment labels.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ckptbench.estimator.step_trace import ACTIVATIONS, GRADS, LOGITS_LOSS, TRANSIENT
from ckptbench.estimator.tracker import StepTracker
from ckptbench.train.model import causal_lm, decoder_layers


class SegmentMarks:
    """Marks segment boundaries in a StepTracker while one training step runs."""

    def __init__(self, tracker: StepTracker, model: Any) -> None:
        self.tracker = tracker
        self.model = model
        self.base = causal_lm(model)
        self.layers = decoder_layers(model)
        self.micro = -1  # index of the running micro-batch

    @contextlib.contextmanager
    def installed(self, opt: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]) -> Iterator[None]:
        """The hooks, for the duration of the block."""
        stack, base = self.base.model, self.base
        handles = [
            stack.register_forward_pre_hook(self._model_pre),
            stack.register_forward_hook(self._stack_post),
            self.model.register_forward_hook(self._model_post),
            stack.norm.register_forward_pre_hook(self._norm_pre),
            base.lm_head.register_forward_pre_hook(self._lm_head_pre),
            opt.register_step_pre_hook(self._opt_pre),
            opt.register_step_post_hook(self._opt_post),
        ]
        for i, layer in enumerate(self.layers):
            # Prepended: they run before FSDP2's hooks on the layer, so a layer's segments hold its own
            # all-gather (forward) and its own pre-backward unshard (see _layer_post).
            handles.append(layer.register_forward_pre_hook(self._layer_pre(i), with_kwargs=True, prepend=True))
            handles.append(layer.register_forward_hook(self._layer_post(i), prepend=True))
        for p in params:
            handles.append(p.register_post_accumulate_grad_hook(self._on_accumulated))
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _on_accumulated(self, param: torch.Tensor) -> None:
        # The optimizer in backward may have applied and freed the gradient already (its hook runs first).
        if param.grad is not None:
            self.tracker.reclassify(param.grad, GRADS)

    def _on_grad(self, label: str) -> Callable[[torch.Tensor], None]:
        # Runs when the tensor's gradient is complete; captures no tensor. The gradient is what the
        # open segment hands down to the next one.
        def hook(grad: torch.Tensor) -> None:
            self.tracker.note_output(grad)
            self.tracker.mark(f"{label}@{self.micro}")

        return hook

    def _model_pre(self, module: Any, args: Any) -> None:
        self.micro += 1
        self.tracker.tag = ACTIVATIONS
        self.tracker.mark(f"pre@{self.micro}")

    def _layer_pre(self, i: int) -> Callable[..., None]:
        def hook(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            self.tracker.mark(f"fwd:{i}@{self.micro}")
            hidden = args[0] if args else kwargs["hidden_states"]
            if i:
                self.tracker.note_output(hidden, f"fwd:{i - 1}@{self.micro}")
            if self.micro == 0:
                self.tracker.note_input(i, hidden)
            if i == 0:
                self.tracker.share(t for t in tree_leaves((args[1:], kwargs)) if t is not hidden)
                self.tracker.share([hidden], kind="input0")
            if i == 0 and hidden.requires_grad:
                hidden.register_hook(self._on_grad("tail"))

        return hook

    def _layer_post(self, i: int) -> Callable[..., None]:
        def hook(module: Any, args: Any, output: Any) -> None:
            # On the layer's output, before FSDP2's post-forward registers its pre-backward hook there:
            # the layer's backward segment starts before FSDP2 unshards the layer for it.
            out = output[0] if isinstance(output, tuple) else output
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._on_grad(f"bwd:{i}"))

        return hook

    def _norm_pre(self, module: Any, args: tuple[Any, ...]) -> None:
        # Marked at the final norm, not in the last layer's forward hook: the layer call must have
        # released its arguments (the last layer's input) so that they are freed in its segment.
        self.tracker.mark(f"head@{self.micro}")
        self.tracker.note_output(args[0], f"fwd:{len(self.layers) - 1}@{self.micro}")  # bwd: see _layer_post

    def _stack_post(self, module: Any, args: Any, output: Any) -> None:
        self.tracker.mark(f"logits@{self.micro}")

    def _model_post(self, module: Any, args: Any, output: Any) -> None:
        self.tracker.mark(f"exit@{self.micro}")
        self.tracker.pending_label = f"back@{self.micro}"  # opened at the next op: after the scopes close

    def _lm_head_pre(self, module: Any, args: tuple[Any, ...]) -> None:
        self.tracker.tag = LOGITS_LOSS
        args[0].register_hook(lambda grad: setattr(self.tracker, "tag", TRANSIENT))

    def _opt_pre(self, *_: Any) -> None:
        self.tracker.mark("opt")
        self.tracker.tag = TRANSIENT

    def _opt_post(self, *_: Any) -> None:
        self.tracker.mark("zero")
        self.tracker.tag = LOGITS_LOSS  # the step's returned (mean) loss, which the runner keeps
