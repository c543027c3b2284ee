"""The phase labels of a session's profiling cycles, found without the user annotating anything: the model's
forward (module hooks; for generation, prefill and decode passes), backward (``torch.autograd.backward``, which
``Tensor.backward``, DeepSpeed and accelerate all call), the optimizer step (torch's step hooks, or DeepSpeed's
``step``), data loading (from ``step()`` to the next forward), gradient-checkpointing recompute and normalization
layers. Hooks are installed for those cycles only, so timed steps run with nothing added; ranges are opened and
closed on the thread that runs the code they label."""

from __future__ import annotations

import threading
from typing import Any, Callable

import torch
import torch.utils.checkpoint as checkpoint_module
from torch.autograd.profiler import record_function

from profkit.core import labels

NORM_CLASS_SUFFIXES = ("RMSNorm", "LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d")


class PhaseLabels:
    """The phase labels of the profiling cycles: hooks installed for those cycles only, so timed steps run
    with nothing added. Ranges are opened and closed on the thread that runs the code they label."""

    def __init__(self, parts, inference: bool, at_optimizer_step: Callable[[], None]):
        self.parts = parts  # the model and optimizer labelled (describe.Parts)
        self.inference = inference
        self.at_optimizer_step = at_optimizer_step  # called as each optimizer step begins (the inventory's moment)
        self.handles: list = []
        self.patched: list[tuple[Any, str, Any, bool]] = []  # (object, attribute, original, was instance attr)
        self.local = threading.local()
        self.data = None
        self.active = False
        self.now = "unattributed"  # the phase work runs in now (read by the storage tracker, on any thread)

    def _local(self, name: str, default):
        if not hasattr(self.local, name):
            setattr(self.local, name, default)
        return getattr(self.local, name)

    # -- install / remove

    def install(self) -> None:
        if self.active:
            return
        self.active = True
        model = self.parts.model
        self.handles.append(model.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        self.handles.append(model.register_forward_hook(self._forward_post, always_call=True))
        # Hooks cost a few microseconds per call: only on normalization layers.
        for module in model.modules():
            if module is not model and type(module).__name__.endswith(NORM_CLASS_SUFFIXES):
                self.handles.append(module.register_forward_pre_hook(self._module_pre))
                self.handles.append(module.register_forward_hook(self._module_post, always_call=True))
        # Gradient checkpointing: transformers (and peft, TRL) checkpoint through each layer's
        # ``_gradient_checkpointing_func``, bound when checkpointing was enabled; other code calls
        # ``torch.utils.checkpoint.checkpoint``. Both are wrapped so the recomputation is labelled.
        if self.parts.optimizer is not None:
            for module in model.modules():
                func = vars(module).get("_gradient_checkpointing_func")
                if func is not None:
                    self._patch(module, "_gradient_checkpointing_func", self._recompute_labelled(func))
            self._patch(checkpoint_module, "checkpoint", self._recompute_labelled(checkpoint_module.checkpoint))
        self._patch(torch.autograd, "backward", self._wrap(torch.autograd.backward, labels.BACKWARD))
        self._label_optimizer()

    def _label_optimizer(self) -> None:
        p = self.parts
        if p.engine is not None:
            stepped = self._wrap(p.engine.step, labels.OPTIMIZER, optimizer_step=True)
            original = p.engine.step
            engine = p.engine

            def step(*args, **kwargs):
                # Under gradient accumulation the engine's step between micro-batches only counts them: the
                # optimizer steps (and is labelled) at the boundary.
                boundary = getattr(engine, "is_gradient_accumulation_boundary", lambda: True)()
                return (stepped if boundary else original)(*args, **kwargs)

            self._patch(p.engine, "step", step)
        elif isinstance(p.optimizer, torch.optim.Optimizer):
            self.handles.append(p.optimizer.register_step_pre_hook(lambda *a: self._optimizer_pre()))
            self.handles.append(p.optimizer.register_step_post_hook(lambda *a: self._optimizer_post()))
        elif p.optimizer is not None and callable(getattr(p.optimizer, "step", None)):
            self._patch(p.optimizer, "step", self._wrap(p.optimizer.step, labels.OPTIMIZER, optimizer_step=True))

    def _patch(self, obj: Any, attr: str, replacement: Any) -> None:
        had = attr in vars(obj)
        self.patched.append((obj, attr, vars(obj).get(attr), had))
        setattr(obj, attr, replacement)

    def remove(self) -> None:
        self.close_forward()
        self.close_data()
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for obj, attr, original, had in reversed(self.patched):
            if had:
                setattr(obj, attr, original)
            else:
                delattr(obj, attr)
        self.patched.clear()
        self.active = False

    # -- ranges

    def _open(self, name: str):
        self.now = labels.PHASE_OF_LABEL.get(name, self.now)
        rf = record_function(name)
        rf.__enter__()
        return rf

    def open_data(self) -> None:
        # Training only: between one optimizer step and the next forward is the data loading. Inference has
        # no such boundary (generate() calls forward once per token), so its loop labels data itself.
        if self.active and self.data is None and self.parts.optimizer is not None:
            self.close_forward()
            self.data = self._open(labels.DATA)

    def close_data(self) -> None:
        if self.data is not None:
            self.data.__exit__(None, None, None)
            self.data = None

    def _wrap(self, fn: Callable, name: str, optimizer_step: bool = False) -> Callable:
        def labelled(*args, **kwargs):
            if optimizer_step:
                self.at_optimizer_step()
            inside = self._local("inside", set())
            if name in inside:  # DeepSpeed's step calling a wrapped step, a backward inside a backward
                return fn(*args, **kwargs)
            inside.add(name)
            self.close_forward()
            self.now = labels.PHASE_OF_LABEL.get(name, self.now)
            try:
                with record_function(name):
                    return fn(*args, **kwargs)
            finally:
                inside.discard(name)
        labelled.__wrapped__ = fn
        return labelled

    def _optimizer_pre(self) -> None:
        self.close_forward()
        self.at_optimizer_step()
        self.local.optimizer = self._open(labels.OPTIMIZER)

    def _optimizer_post(self) -> None:
        rf = self._local("optimizer", None)
        if rf is not None:
            rf.__exit__(None, None, None)
            self.local.optimizer = None

    def _forward_pre(self, module, args, kwargs) -> None:
        self.close_data()
        self.close_forward()
        stack = self._local("forward", [])
        outermost = not any(stack)
        if self.inference:
            # generate(): the prompt's pass (several tokens per row) is the prefill, each later pass a decode.
            ids = _token_ids(args, kwargs)
            label = labels.PREFILL if ids is not None and ids.shape[-1] > 1 else labels.DECODE
            stack.append(self._open(label) if outermost else None)
            return
        labelled = torch.is_grad_enabled() and torch._C._current_graph_task_id() == -1 and outermost
        stack.append(self._open(labels.FORWARD) if labelled else None)

    def _forward_post(self, module, args, output) -> None:
        stack = self._local("forward", [])
        if stack:
            rf = stack.pop()
            if rf is not None and not self.inference:
                # The loss runs between the model's forward and backward, outside the model where a script computes
                # its own (torchtune, a Trainer's compute_loss_func): it is forward work, so the label stays open
                # until whatever comes next opens its own.
                self.local.open_forward = rf
            elif rf is not None:
                rf.__exit__(None, None, None)

    def close_forward(self) -> None:
        rf = getattr(self.local, "open_forward", None)
        if rf is not None:
            self.local.open_forward = None
            rf.__exit__(None, None, None)

    @staticmethod
    def _recompute_labelled(checkpoint_func: Callable) -> Callable:
        def checkpoint(function, *args, **kwargs):
            def run(*a, **k):
                # Inside autograd's backward a graph task is running: this call is the recomputation.
                if torch._C._current_graph_task_id() != -1:
                    with record_function(labels.RECOMPUTE):
                        return function(*a, **k)
                return function(*a, **k)
            return checkpoint_func(run, *args, **kwargs)
        checkpoint.__wrapped__ = checkpoint_func
        return checkpoint

    def _module_pre(self, module, args) -> None:
        self._local("modules", []).append(self._open(labels.NORM))

    def _module_post(self, module, args, output) -> None:
        stack = self._local("modules", [])
        if stack:
            stack.pop().__exit__(None, None, None)


def _token_ids(args, kwargs):
    ids = kwargs.get("input_ids") if kwargs else None
    if ids is None:
        ids = next((a for a in args if isinstance(a, torch.Tensor)), None)
    return ids if isinstance(ids, torch.Tensor) else None
