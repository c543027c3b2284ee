"""generate(): the prompt's forward pass (prefill) and the last new token's (decode, the largest cache), each
simulated on the meta device with every storage's lifetime followed."""

from __future__ import annotations

import math

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from profkit.core.methods import Method
from profkit.core.units import human_bytes
from profkit.model.build import check_sequence, meta_model
from profkit.model.storage import storage_bytes, storage_id
from profkit.predict.memory.parameters import count_parameters
from profkit.predict.memory.result import CATEGORIES, Estimate, EstimateError
from profkit.predict.stand_ins import Target, TargetDevice, contiguous_batches


def kv_cache_bytes(config, batch_size: int, tokens: int, element_size: int) -> int:
    """What generate()'s KV cache holds for ``tokens`` positions: a key and a value per decoder layer, each
    batch x key-value heads x tokens x head size. (After N new tokens it holds prompt + N - 1: the last token
    is returned, not fed back.)"""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return config.num_hidden_layers * 2 * batch_size * kv_heads * tokens * head_dim * element_size



class _LiveStorages(TorchDispatchMode):
    """Live bytes on the meta device beside the weights, op by op: every op's outputs are new storages until Python
    frees them (CPython frees at once, as on a device). torch's ``MemTracker`` reports a peak by its own categories but
    not which storages were live at it; the estimate needs that to tell the KV cache from the transients."""

    def __init__(self, static: list[torch.Tensor], existing: list[torch.Tensor]):
        """``static``: tensors alive throughout (weights), left out of the count; ``existing``: others alive at the
        start (the cache so far)."""
        super().__init__()
        self.static = {storage_id(t) for t in static}
        self.live: dict[tuple[str, int], tuple[StorageWeakRef, int]] = {}
        for t in existing:
            self._add(t)
        self.peak, self.at_peak = 0, {}
        self._measure()

    def _add(self, t: torch.Tensor) -> None:
        storage, key = t.untyped_storage(), storage_id(t)
        if key not in self.live and key not in self.static:
            self.live[key] = (StorageWeakRef(storage), storage.nbytes())

    def _measure(self) -> None:
        total = sum(n for _, n in self.live.values())
        if total > self.peak:
            self.peak, self.at_peak = total, {k: n for k, (_, n) in self.live.items()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:  # freed since the last op
            del self.live[key]
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t)
        self._measure()
        return out


def _cache_tensors(cache) -> list[torch.Tensor]:
    return [t for layer in cache.layers for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor)]


def _generate_pass(model, input_ids, cache, target: Target, autocast, static: list[torch.Tensor],
                   method: Method):
    """One forward pass as generate() makes it, under a live-storage tracker: the logits ``method.prefill_logits``
    says (the last position's; or every position's, in the model's dtype or upcast to fp32 in the forward), then
    the last position's fp32 copy and the min-new-tokens processor's copy. Under ``kv_cache`` "tuples" the cache the
    pass was given stays alive beside the one it returns, as transformers' tuples were until the pass ended. Returns
    the tracker and the cache."""
    cache = cache if cache is not None else DynamicCache(config=model.config)
    previous = _cache_tensors(cache) if method.kv_cache == "tuples" else []
    with torch.inference_mode(), _LiveStorages(static, [input_ids, *_cache_tensors(cache)]) as live, \
            TargetDevice(target, autocast):
        out = model(input_ids=input_ids, past_key_values=cache, use_cache=True,
                    logits_to_keep=1 if method.prefill_logits == "last" else 0)  # 0: every position
        cache, logits = out.past_key_values, out.logits
        del out
        if method.prefill_logits == "all-fp32":
            logits = logits.float()  # the model's own upcast: only the fp32 logits stay referenced
        scores = logits[:, -1, :].to(copy=True, dtype=torch.float32)
        processed = torch.where(torch.zeros_like(scores, dtype=torch.bool), -math.inf, scores)
        processed.argmax(dim=-1)
        del logits, scores, processed, previous
    return live, cache


def estimate_generation(method: Method, config, batch_size: int, prompt: int, new_tokens: int, world_size: int,
                        target: Target, model_name: str) -> Estimate:
    """generate(): the prompt's forward pass (prefill) and the last new token's (decode, the largest cache),
    each simulated on the meta device with every storage's lifetime followed. The KV cache at each instant is
    the cache as that pass leaves it, as the breakdown measures it."""
    if world_size != 1:
        raise EstimateError(f"{method.name}: generation is estimated on one device (world size 1)")
    model, quantized, plan = meta_model(method, config, target, torch.bfloat16 if target == "cuda" else None)
    check_sequence(model, prompt + new_tokens - 1)  # the last new token is never fed
    model.config.use_cache = True
    cpu_packed = bool(quantized) and target == "cpu" and _bnb_packs_for_this_cpu()
    counted = count_parameters(model, quantized, method.double_quant if quantized else False, cpu_packed)
    params, parts = counted.counts, counted.bytes
    static = [*model.parameters(), *model.buffers()]
    weights = {k: v for k, v in parts.items() if k != "parameters_trainable"}

    def instant(live: _LiveStorages, cache_after: int) -> dict[str, int]:
        # Everything live at the pass's peak that is neither a weight nor the cache as the pass leaves it: the
        # transients, and while a layer's cache grows (a concatenation), its old copy beside the new one.
        transient = sum(live.at_peak.values()) - cache_after
        return {**{c: 0 for c in CATEGORIES}, **weights, "kv_cache": cache_after, "activations": max(transient, 0)}

    with contiguous_batches():
        live, cache = _generate_pass(model, torch.zeros(batch_size, prompt, dtype=torch.long, device="meta"),
                                     None, target, plan.autocast, static, method)
        prefill = instant(live, storage_bytes(_cache_tensors(cache)))
        kv_dtype = _cache_tensors(cache)[0].dtype
        decode = None
        if new_tokens > 1:
            # The cache before the last pass (prompt + new_tokens - 2 positions): the prefill's, each layer's keys
            # and values lengthened on the meta device (a forward pass to build it would cost as much as the rest).
            cache = _lengthened(cache, prompt + new_tokens - 2)
            live, cache = _generate_pass(model, torch.zeros(batch_size, 1, dtype=torch.long, device="meta"),
                                         cache, target, plan.autocast, static, method)
            decode = instant(live, storage_bytes(_cache_tensors(cache)))
    element = torch.empty((), dtype=kv_dtype).element_size()
    kv_final = kv_cache_bytes(config, batch_size, prompt + new_tokens - 1, element)
    notes = list(plan.notes)
    if decode is not None and decode["kv_cache"] != kv_final:
        notes.append(f"the simulated cache holds {decode['kv_cache']:,} bytes, the configuration's formula "
                     f"{kv_final:,}: this model's cache is not one key and value per layer and position")
    notes.append(_generate_note(method, batch_size * prompt * model.get_output_embeddings().weight.shape[0],
                                plan.load_dtype.itemsize, kv_cache_bytes(config, batch_size, prompt + new_tokens - 2,
                                                                         element) if new_tokens > 1 else 0))
    if cpu_packed:
        notes.append("CPU target with AVX512-BF16: bitsandbytes repacks each 4-bit layer at its first inference pass "
                     "(bf16 absmax per block, no nested quantization state)")
    if target == "cuda" and quantized:
        # bitsandbytes multiplies by a 4-bit weight through a dequantized copy in the compute dtype, except for a
        # single row (batch-1 decoding), which its gemv kernel reads in 4 bits.
        names = dict(model.named_parameters())
        dequantized = max(names[n].numel() for n in quantized) * plan.quantization.bnb_4bit_compute_dtype.itemsize
        prefill["temporaries"] = dequantized
        if decode is not None and batch_size > 1:
            decode["temporaries"] = dequantized
        notes.append("CUDA target: bitsandbytes dequantizes each 4-bit weight into the compute dtype for its "
                     "matmul (the largest is a temporary), except for batch-1 decoding (its gemv kernel)")
    instants = {"prefill": prefill, **({"decode": decode} if decode is not None else {})}
    detail = {"kv_cache_bytes_per_token": kv_final // max(batch_size * (prompt + new_tokens - 1), 1),
              "kv_cache_final": kv_final}
    settings = {"batch_size": batch_size, "seq_len": prompt, "max_new_tokens": new_tokens, "world_size": 1,
                "device": target, "model": model_name, "precision": plan.precision, "method": method.settings(),
                "kv_cache_dtype": str(kv_dtype).removeprefix("torch.")}
    return Estimate(method.label, settings, instants, params, detail, notes)


def _generate_note(method: Method, prompt_logits: int, itemsize: int, previous_cache: int) -> str:
    """Which of transformers' ways of running generate() the estimate took, and what the others hold
    (``prompt_logits``: elements of every prompt position's logits; ``previous_cache``: the cache's bytes before the
    last pass)."""
    every = {"all": prompt_logits * itemsize, "all-fp32": prompt_logits * (itemsize + 4)}
    logits = {"last": "the prompt pass computes logits at its last position only (--prefill-logits last, "
                      "transformers >= 4.45)",
              "all": "the prompt pass computes logits at every position, in the model's dtype (--prefill-logits all)",
              "all-fp32": "the prompt pass computes logits at every position and upcasts them to fp32 in the forward "
                          "(--prefill-logits all-fp32, Llama-family models before transformers 4.45)"}
    logits = logits[method.prefill_logits]
    if method.prefill_logits == "last":
        logits += (f"; before 4.45 every position's, {human_bytes(every['all'])} more at the prompt pass "
                   f"({human_bytes(every['all-fp32'])} where the model upcast them to fp32)")
    cache = ("the KV cache is updated in place, layer by layer (--kv-cache dynamic, transformers >= 4.36)"
             if method.kv_cache == "dynamic" else
             "each pass returns new key and value tuples while the previous pass's stay alive until it ends "
             "(--kv-cache tuples, transformers before 4.36)")
    if method.kv_cache == "dynamic" and previous_cache:
        cache += f"; before 4.36 the previous pass's tuples, {human_bytes(previous_cache)}, were alive beside them"
    return f"generate(): {logits}; {cache}"


def _lengthened(cache, positions: int):
    """A transformers cache like ``cache`` that has seen ``positions`` positions (meta tensors): every layer holds
    them, a sliding-window layer the last of them its window keeps, and counts them all (its attention mask is
    built from that count)."""
    for layer in cache.layers:
        kept = min(positions, layer.sliding_window - 1) if getattr(layer, "is_sliding", False) else positions
        for name in ("keys", "values"):
            t = getattr(layer, name)
            setattr(layer, name, t.new_empty((*t.shape[:-2], kept, t.shape[-1])))
        if hasattr(layer, "cumulative_length"):
            layer.cumulative_length = positions
    return cache


def _bnb_packs_for_this_cpu() -> bool:
    """Whether bitsandbytes takes its packed CPU inference path here (it asks the CPU for AVX512-BF16)."""
    try:
        from bitsandbytes.functional import has_avx512bf16  # optional: absent, the CPU path is not taken
    except Exception:  # no bitsandbytes, or an older one without the CPU path
        return False
    return bool(has_avx512bf16())

