"""The data a run trains or generates on: the bundled WikiText-2 and GSM8K (or a user's file), tokenized into
blocks of exactly the run's length."""

from __future__ import annotations

from typing import Iterator

import torch
from datasets import load_dataset

from profkit.core.bundled import bundled
from profkit.core.settings import RunSettings

BUNDLED_TRAIN_TEXT = "wikitext-2/valid.txt"
BUNDLED_PROMPTS = "gsm8k/test.jsonl"


# --------------------------------------------------------------------------- data

def token_blocks(tokenizer, settings: RunSettings) -> torch.Tensor:
    """``seq_len`` token blocks, shape (blocks, seq_len), from the bundled WikiText-2 or a user's file."""
    path = settings.dataset_path or str(bundled(BUNDLED_TRAIN_TEXT))
    if path.endswith((".jsonl", ".json")):
        ds = load_dataset("json", data_files=path, split="train")
        if "text" not in ds.column_names:
            raise ValueError(f"{path}: a JSON/JSONL training file needs a 'text' field (found {ds.column_names})")
    else:
        ds = load_dataset("text", data_files=path, split="train")
    ds = ds.filter(lambda row: bool(row["text"].strip()))
    ids = [t for row in ds.map(lambda b: tokenizer(b["text"]), batched=True, remove_columns=ds.column_names)["input_ids"]
           for t in row]
    block = settings.seq_len
    n_blocks = len(ids) // block
    if n_blocks < settings.batch_size:
        raise ValueError(f"{path}: {len(ids)} tokens is too little text for batch {settings.batch_size} x {block}")
    return torch.tensor(ids[: n_blocks * block]).view(n_blocks, block)


def training_batches(tokenizer, settings: RunSettings, device: str, rank: int = 0) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches of token blocks, on ``device`` (profkit's own loop); with several ranks, each rank takes
    every ``nproc``-th batch, as a distributed sampler would."""
    blocks = token_blocks(tokenizer, settings)
    n_blocks = len(blocks)
    # Independent tensors: a view would keep the whole corpus' storage alive in the memory timeline.
    starts = list(range(0, n_blocks - settings.batch_size + 1, settings.batch_size))[rank::settings.nproc]
    if not starts:
        raise ValueError(f"too little text for {settings.nproc} ranks of batch {settings.batch_size} x {settings.seq_len}")
    batches = [blocks[i:i + settings.batch_size].clone().to(device) for i in starts]
    while True:
        for batch in batches:
            yield {"input_ids": batch, "labels": batch}


def inference_prompts(tokenizer, settings: RunSettings, device: str) -> Iterator[torch.Tensor]:
    """Endless prompts of exactly ``batch_size`` x ``seq_len`` tokens, cut from GSM8K's questions (bundled) or a
    user's JSONL ('question' or 'text') read as one token stream, as serving benchmarks fix input and output
    lengths: every request then has the same prefill and KV cache, so latencies compare and the estimate applies."""
    path = settings.dataset_path or str(bundled(BUNDLED_PROMPTS))
    ds = load_dataset("json", data_files=path, split="train")
    field = "question" if "question" in ds.column_names else "text"
    if field not in ds.column_names:
        raise ValueError(f"{path}: an inference file needs a 'question' or 'text' field (found {ds.column_names})")
    stream = [t for q in ds[field] for t in tokenizer(q)["input_ids"]]
    size = settings.batch_size * settings.seq_len
    if len(stream) < size:
        raise ValueError(f"{path}: {len(stream)} tokens is too little text for prompts of batch "
                         f"{settings.batch_size} x {settings.seq_len}")
    prompts = [torch.tensor(stream[i:i + size]).view(settings.batch_size, settings.seq_len)
               for i in range(0, len(stream) - size + 1, size)]
    while True:
        for p in prompts:
            yield p.to(device)

