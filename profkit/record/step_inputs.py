"""What the model's forwards saw, step by step, through every phase: the tokens, the training forwards between two
optimizer steps (a loop's gradient accumulation), the loss, and the first batch's shape and autocast."""

from __future__ import annotations

import statistics
from typing import Any, Callable

import torch


class StepInputs:
    def __init__(self) -> None:
        self.tokens_now = 0
        self.forwards: list[int] = []  # training forwards per step
        self.forwards_now = 0
        self.last_loss: torch.Tensor | None = None
        self.input_shape: tuple | None = None  # (batch, sequence) of the first token batch: what the estimate needs
        self.autocast = None  # the autocast dtype the model's first forward ran under
        self.handles: list = []

    def attach(self, model: torch.nn.Module, device_type: str, forward_done: Callable[[Any], None]) -> None:
        """Follow ``model``'s forwards on ``device_type`` (cuda, cpu); ``forward_done(output)`` after each."""
        self._device_type, self._forward_done = device_type, forward_done
        self.handles = [model.register_forward_pre_hook(self._count_inputs, with_kwargs=True),
                        model.register_forward_hook(self._keep_loss)]

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def next_step(self) -> None:
        """A step ended: the counts start afresh."""
        self.tokens_now = 0
        if self.forwards_now:
            self.forwards.append(self.forwards_now)
        self.forwards_now = 0
        self.last_loss = None

    def grad_accum(self) -> int | None:
        """Micro-batches a step (a loop's gradient accumulation), counted, not asked; None without a forward."""
        return max(1, int(statistics.median(self.forwards))) if self.forwards else None

    def _count_inputs(self, module, args, kwargs) -> None:
        if torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1:
            ids = kwargs.get("input_ids") if kwargs else None
            if ids is None:
                ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
                self.tokens_now += ids.numel()
                self.forwards_now += 1
                if self.input_shape is None and ids.dim() == 2:
                    self.input_shape = tuple(ids.shape)
                    # Autocast as the forward runs (inside a DeepSpeed engine: as the engine left it): with the
                    # weights' dtypes, the precision the estimate takes (a user loop on an H100 loaded fp32 weights
                    # under bf16 autocast; taken for bf16 weights, its peak was estimated 25% low).
                    kind = self._device_type
                    self.autocast = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else None

    def _keep_loss(self, module, args, output) -> None:
        self._forward_done(output)
        loss = getattr(output, "loss", None) if not isinstance(output, dict) else output.get("loss")
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.last_loss = loss.detach()
