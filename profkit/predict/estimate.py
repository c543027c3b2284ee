"""Predicted memory by category for a training method, without running a step.

The model is built on the meta device (shapes and dtypes, no memory, no weights) exactly as the workload builds it:
the method's dtypes, peft's LoRA layers, transformers' choice of which Linear layers bitsandbytes quantizes. Each owner
or mechanism is a module of ``predict.memory`` that returns what it adds to the step (``memory.contribution``): the
parameters (``parameters``), the optimizer and its gradients (``optimizer``; under ZeRO, ``zero``), FSDP's shards and
what it gathers (``fsdp``), DDP's buckets (``ddp``), what autograd saves in one meta-device forward and what the loss
holds (``activations``), what another loop or an older library keeps (``stack_effects``), gradient accumulation
(``accumulation``); ``memory.training`` combines them, ``memory.generation`` estimates generate().

Three things the meta device does not do as the target device would are set by ``predict.stand_ins``: the
attention kernel, CUDA's dropout and autocast. Under autocast, linear layers and attention see 16-bit
copies of their inputs and weights, and autocast's float32 ops (on CUDA norms, softmax, exp, pow, the losses)
return fp32. tests/test_autocast_stand_in.py holds the stand-in to PyTorch's own autocast and dropout kernels,
run without a GPU on fake CUDA tensors (``profkit.model.fake_cuda``); analyses/autocast_stand_in.py does so over
every architecture transformers knows.

Predictions are for three instants of a step: ``forward`` (its end), ``backward`` and ``optimizer``; for
generate(), the prompt's pass (``prefill``) and the last new token's (``decode``). The peak is allocated bytes
(``max_memory_allocated``). Reserved bytes (``max_memory_reserved``) add what the caching allocator reserves
beyond it when the step's allocations are replayed through its policy (``predict.step_replay``); where a step
cannot be replayed, the allocator's overhead measured on real training steps' snapshots, a range
(``memory.result.Estimate``).
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from profkit.core.methods import Method, UnsupportedError
from profkit.core.quiet import library_output
from profkit.core.stack import Stack
from profkit.model.build import model_code_refusal, model_config
from profkit.predict.memory.generation import estimate_generation, kv_cache_bytes
from profkit.predict.memory.optimizer import optimizer_state_bytes
from profkit.predict.memory.parameters import nf4_bytes
from profkit.predict.memory.result import (CATEGORIES, DEVICE_BASIS, GROWING_BASIS, RESERVED_BASIS, Estimate,
                                           EstimateError, outside_allocator, reserved_ratios)
from profkit.predict.mechanisms import NotModelled, stacked_run
from profkit.predict.memory.training import estimate_training
from profkit.predict.stand_ins import Target

__all__ = ["CATEGORIES", "DEVICE_BASIS", "GROWING_BASIS", "RESERVED_BASIS", "Estimate", "EstimateError", "at_peak",
           "estimate", "estimate_methods", "estimate_run", "frame", "kv_cache_bytes", "nf4_bytes",
           "optimizer_state_bytes", "outside_allocator", "reserved_ratios"]


def estimate(method: Method, config, batch_size: int, seq_len: int, world_size: int = 1,
             target: Target = "cuda", model_name: str = "", engine: str = "loop", new_tokens: int = 1) -> Estimate:
    """Training: one step at ``batch_size`` x ``seq_len``. Inference: generate() of ``new_tokens`` after a prompt
    of ``batch_size`` x ``seq_len`` tokens. ``engine``: ``loop`` (profkit's own), ``trainer`` (transformers'
    Trainer through accelerate) or ``session`` (someone else's loop: as profkit's, without the DeepSpeed config
    profkit's loop writes)."""
    # peft, bitsandbytes and DeepSpeed announce themselves at import and warn about their own deprecations.
    with library_output():
        try:
            if method.kind == "infer":
                return estimate_generation(method, config, batch_size, seq_len, new_tokens, world_size, target,
                                           model_name)
            return estimate_training(method, config, batch_size, seq_len, world_size, target, model_name, engine)
        except UnsupportedError as exc:  # the model or the method's settings, said before anything runs
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: {exc}") from None
        except (RuntimeError, NotImplementedError) as exc:  # torch's meta kernels refuse what they cannot model
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: the meta-device forward "
                                f"that counts what autograd saves failed ({type(exc).__name__}: {first})") from None
        except Exception as exc:  # the model's own code refusing this config (a default it leaves unset)
            refusal = model_code_refusal(exc)
            if refusal is None:
                raise
            raise EstimateError(f"{method.name} on {model_name or type(config).__name__}: {refusal}") from None


def estimate_run(method: Method, settings, target: Target, world_size: int = 1) -> Estimate:
    """The estimate for what ``RunSettings`` describe (preset or local model, batch and length)."""
    settings = replace(settings, method=method.name).resolved()  # the method decides the default batch
    return estimate(method, model_config(settings), settings.batch_size, settings.seq_len, world_size,
                    target, settings.model_path or settings.preset, settings.engine, settings.max_new_tokens)


def estimate_methods(methods: list[Method], settings, target: Target, world_size: int = 1,
                     stack: Stack | None = None, given: dict | None = None) -> list[Estimate]:
    """Each method's estimate. With a ``stack``, each method first takes the settings that stack calls for
    (``predict.mechanisms``; those in ``given``, the user's, stay) and its loop's engine; each estimate's notes
    begin with why, and it names the stack it assumed."""
    if stack is None:
        return [estimate_run(m, settings, target, world_size) for m in methods]
    try:
        with library_output():
            pairs = stacked_run(methods, given or {}, stack, settings)
    except NotModelled as exc:
        raise EstimateError(str(exc)) from None
    settings = replace(settings, engine=stack.engine)
    estimates = []
    for method, notes in pairs:
        e = estimate_run(method, settings, target, world_size)
        e.notes[:0] = notes
        e.stack = stack.to_json()
        estimates.append(e)
    return estimates


def frame(estimates: list[Estimate]) -> pd.DataFrame:
    """Long format: method, instant, category, bytes; plus one ``peak`` row per method (at its peak instant)."""
    rows = [{"method": e.method, "instant": instant, "category": c, "bytes": b}
            for e in estimates for instant, cats in e.instants.items() for c, b in cats.items()]
    rows += [{"method": e.method, "instant": e.peak_instant, "category": "peak", "bytes": e.peak_bytes}
             for e in estimates]
    return pd.DataFrame(rows, columns=["method", "instant", "category", "bytes"])


def at_peak(estimates: list[Estimate]) -> pd.DataFrame:
    """Rows: categories, ``peak`` (allocated), for CUDA targets ``reserved``, ``nvidia_smi`` and, where the step is
    replayed, ``reserved_lengths_grow`` (see ``Estimate.reserved``, ``device_used`` and ``reserved_if_lengths_grow``)
    and, where
    a method offloads, ``host_offloaded`` (pinned host memory); columns: methods; bytes at each method's peak."""
    host = any(e.host for e in estimates)
    return pd.DataFrame({e.method: {**e.at_peak(), "peak": e.peak_bytes,
                                    **({"reserved": e.reserved()["bytes"]} if e.reserved() else {}),
                                    **({"nvidia_smi": e.device_used()["bytes"]} if e.device_used() else {}),
                                    **({"reserved_lengths_grow": e.reserved_if_lengths_grow()["bytes"]}
                                       if e.reserved_if_lengths_grow() else {}),
                                    **({"host_offloaded": sum(e.host.values())} if host else {})}
                         for e in estimates})
