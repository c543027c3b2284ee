"""The workload of a recording: a built method (model, optimizer, data, DeepSpeed engine) and one step of it, in
profkit's own loop, through ``transformers.Trainer``, or as ``generate()``. ``run(make_session)`` steps a session
until it has every step it needs; the session labels the phases, the loop only calls ``session.step()``."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.profiler import record_function
from transformers import Trainer, TrainingArguments

from profkit.core import labels
from profkit.core.methods import Method, UnsupportedError
from profkit.core.settings import RunSettings
from profkit.model.build import (build_model, make_optimizer, plan, setting_unsupported, tokenizer_for,
                                 unsupported_reason)
from profkit.model.data import inference_prompts, token_blocks, training_batches
from profkit.model.distributed import init_process_group
from profkit.model.fsdp import shard, trainer_fsdp_arguments
from profkit.model.loss import causal_lm_loss, loss_of_logits
from profkit.model.zero import init_zero_process_group, torch_autocast_config, trainer_deepspeed_config
from profkit.record.hf import TrainerCallback


@dataclass
class Workload:
    """A built method: the objects that hold memory, and ``run(session)``, which trains or generates until the
    session has every step it needs. The session labels the phases; the loop only calls ``session.step()``."""

    method: Method
    device: str
    model: Any  # the nn.Module, or the DeepSpeed engine around it
    optimizer: Any  # torch optimizer, or DeepSpeed's ZeRO optimizer
    step: Callable[[], None] | None  # one step of profkit's own loop (None: another engine drives the loop)
    tokens_per_step: int
    run_loop: Callable[[Any], None] | None = None

    def run(self, make_session: Callable[[Any, Any], Any]) -> None:
        """Train (or generate) until the session has every step it needs. ``make_session(model, optimizer)``
        is called once the objects exist: for the Trainer engine, when the Trainer has built its optimizer."""
        if self.run_loop is not None:
            self.run_loop(make_session)
            return
        with make_session(self.model, self.optimizer) as session:
            while not session.done:
                self.step()
                session.step()


def _autocast(device: str, dtype: torch.dtype | None):
    return torch.autocast(device, dtype=dtype) if dtype is not None else nullcontext()


def build(method: Method, settings: RunSettings, device: str) -> Workload:
    reason = unsupported_reason(method, device)
    if not reason and settings.engine == "trainer" and method.fsdp and device == "cpu":
        # accelerate (under the Trainer) turns its FSDP plugin on only where its distributed type is FSDP, which it
        # never is on CPU: the Trainer would train the model unsharded.
        reason = ("FSDP through the Trainer on CPU: accelerate enables its FSDP plugin on accelerators only (on CPU "
                  "its distributed type stays NO and the model would train unsharded); use --engine loop, or GPUs")
    if not reason and settings.engine == "trainer" and settings.nproc > 1 and device == "cpu":
        # accelerate (under the Trainer) starts its distributed state only for accelerators, or with use_cpu,
        # which turns DeepSpeed off: on CPU every rank would count itself as the only process.
        reason = ("the Trainer on several CPU ranks: accelerate, under the Trainer, sees one process per rank "
                  "unless use_cpu is set, and use_cpu turns DeepSpeed off; use --engine loop, or GPUs")
    if not reason and settings.engine == "trainer" and method.loss == "chunked":
        reason = ("--loss chunked through the Trainer: the Trainer's model computes the whole logits in its forward "
                  "before the loss sees them; use --engine loop, or a Session in a loop of your own")
    if not reason:
        reason = setting_unsupported(method, device)
    if reason:
        raise UnsupportedError(reason)
    torch.manual_seed(settings.seed)
    tokenizer = tokenizer_for(settings)
    model = build_model(method, settings, device)
    if method.kind == "infer":
        return _inference_workload(method, settings, device, tokenizer, model)

    if settings.engine == "trainer":
        return _trainer_workload(method, settings, device, tokenizer, model)
    batches = training_batches(tokenizer, settings, device, int(os.environ.get("RANK", 0)) if settings.nproc > 1 else 0)
    p = plan(method, device)
    if method.fsdp:
        init_process_group(device)
        model = shard(model, method, p.fsdp_param_dtype, device)  # before the optimizer: it steps on the shards
    trainable = [prm for prm in model.parameters() if prm.requires_grad]
    optimizer = make_optimizer(method, trainable)
    autocast = p.autocast
    engine = None
    if method.zero_stage:
        import deepspeed  # optional: ZeRO methods only (build checked it imports)
        init_zero_process_group(device)
        zero: dict[str, Any] = {"stage": method.zero_stage}
        if method.offload != "none":
            zero["offload_optimizer"] = {"device": "cpu"}
            if method.offload == "optimizer+params":
                zero["offload_param"] = {"device": "cpu"}
        ds_config = {"train_micro_batch_size_per_gpu": settings.batch_size,
                     "gradient_accumulation_steps": method.grad_accum,
                     "zero_optimization": zero, "zero_allow_untested_optimizer": True,
                     "zero_force_ds_cpu_optimizer": False, "steps_per_print": 10**9}
        ds_config.update(torch_autocast_config(autocast))
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)

    def step() -> None:
        # One optimizer step over ``grad_accum`` micro-batches. DeepSpeed's engine counts them itself (its backward
        # scales the loss, its step steps at the boundary only); FSDP2 reduce-scatters each micro-batch's gradients
        # into the shards (torchtitan's and torchtune's loops), or with --grad-sync last holds them unsharded until
        # the last micro-batch (accelerate's no_sync).
        for micro in range(method.grad_accum):
            if method.fsdp and method.grad_sync == "last":
                model.set_requires_gradient_sync(micro == method.grad_accum - 1)
            batch = next(batches)
            with _autocast(device, autocast):
                loss = causal_lm_loss(engine or model, batch, method.loss)
            if engine:
                engine.backward(loss)
                engine.step()
            else:
                (loss / method.grad_accum if method.grad_accum > 1 else loss).backward()
        if not engine:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return Workload(method, device, engine or model, optimizer, step,
                    settings.batch_size * settings.seq_len * method.grad_accum)


TRAINER_OPTIM = {"adamw": "adamw_torch", "adamw-8bit": "adamw_bnb_8bit", "paged-adamw-8bit": "paged_adamw_8bit",
                 "sgd": "sgd"}


def _trainer_workload(method: Method, settings: RunSettings, device: str, tokenizer, model) -> Workload:
    """The method through ``transformers.Trainer``, as the reference study and most users run it: precision and
    gradient checkpointing from ``TrainingArguments``, ZeRO from a DeepSpeed config with "auto" sizes, FSDP2 from
    ``fsdp_config`` (accelerate's plugin)."""
    blocks = token_blocks(tokenizer, settings)
    dataset = [{"input_ids": row, "labels": row} for row in blocks.clone()]
    # The Trainer's bf16/fp16 flags: accelerate sets its FSDP policy and autocast from them, DeepSpeed its engine.
    half = plan(method, device, engine="trainer").mixed_dtype
    if method.zero_stage:
        init_zero_process_group(device)
    out_dir = tempfile.mkdtemp(prefix="profkit-trainer-")
    args = TrainingArguments(
        output_dir=out_dir, per_device_train_batch_size=settings.batch_size, max_steps=settings.total_steps,
        gradient_accumulation_steps=method.grad_accum,
        # accelerate holds FSDP's gradients unsharded between micro-batches (no_sync) unless it syncs each batch
        accelerator_config={"gradient_accumulation_kwargs": {"sync_each_batch": method.grad_sync == "each"}},
        learning_rate=method.learning_rate, lr_scheduler_type="constant", optim=TRAINER_OPTIM[method.optimizer],
        gradient_checkpointing=method.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False} if method.gradient_checkpointing else None,
        bf16=half == torch.bfloat16, fp16=half == torch.float16, use_cpu=device == "cpu" and not method.zero_stage,
        deepspeed=trainer_deepspeed_config(method.zero_stage, method.offload) if method.zero_stage else None,
        **(trainer_fsdp_arguments(method, model) if method.fsdp else {}), seed=settings.seed, data_seed=settings.seed, report_to="none",
        save_strategy="no", logging_strategy="no", disable_tqdm=True, remove_unused_columns=False,
        dataloader_pin_memory=device == "cuda")

    loss_func = None
    if method.loss != "fp32":  # the Trainer pops the labels and hands the model's outputs over
        def loss_func(outputs, labels, num_items_in_batch=None):
            return loss_of_logits(outputs.logits, labels, method.loss, num_items_in_batch)

    def run_loop(make_session) -> None:
        trainer = Trainer(model=model, args=args, train_dataset=dataset, compute_loss_func=loss_func,
                          callbacks=[TrainerCallback(session_factory=make_session, stop_when_done=True)])
        try:
            trainer.train()
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)

    return Workload(method, device, model, None, None, settings.batch_size * settings.seq_len * method.grad_accum,
                    run_loop)


def _inference_workload(method: Method, settings: RunSettings, device: str, tokenizer, model) -> Workload:
    prompts = inference_prompts(tokenizer, settings, device)
    new_tokens = settings.max_new_tokens
    autocast = plan(method, device).autocast

    @torch.inference_mode()
    def step() -> None:
        # Inference has no optimizer step for the session to time data loading against: labelled here.
        with record_function(labels.DATA):
            input_ids = next(prompts)
        with record_function(labels.GENERATE), _autocast(device, autocast):
            # min_new_tokens = max_new_tokens: every step generates the same count, so tokens/s compare.
            model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                           max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                           pad_token_id=tokenizer.pad_token_id)

    return Workload(method, device, model, None, step, settings.batch_size * new_tokens)
