"""Predicted step time of a training method on a GPU profkit has not seen run it.

The work comes from the same meta-device model the memory estimate builds (``model.build.meta_model``, the
target's attention kernels and autocast, ``predict.stand_ins.TargetDevice``): one forward and one backward run
on meta tensors under a dispatch mode that records every op with its input shapes, each op's FLOPs and bytes
from the formulas the trace analysis uses (``core.work``), so what is predicted and what is measured are counted
alike. What the meta pass does not run is added from what the framework does:

- gradient checkpointing: each checkpointed decoder layer's forward runs again in backward;
- NF4: bitsandbytes dequantizes each 4-bit weight before its forward GEMM and again before the GEMM of its
  input gradient (and in a recomputed forward): the packed weight read, the 16-bit weight written;
- the optimizer step: AdamW reads a parameter, its gradient and two moments and writes three (fp32);
- ZeRO and FSDP: the collectives' bytes over the GPU link, ring algorithms ((N-1)/N of the data each way).

Each op's time is a latency plus the larger of its compute and memory times at the efficiency measured on real
GPU traces (``data/step_time/calibration.json``, fitted by ``analyses/fit_step_time.py``); a step is at least
the host's time to launch its ops (eager PyTorch launches them one at a time). Communication is added, not
overlapped: an upper bound where the framework overlaps it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from profkit.core import work as work_of
from profkit.core.bundled import bundled
from profkit.core.gpus import Gpu
from profkit.core.methods import Method, UnsupportedError
from profkit.core.quiet import library_output
from profkit.model.build import check_sequence, decoder_layers, meta_model, model_code_refusal, model_config
from profkit.model.loss import causal_lm_loss
from profkit.predict.estimate import EstimateError
from profkit.predict.stand_ins import TargetDevice, contiguous_batches

CALIBRATION = bundled("step_time") / "calibration.json"
# torch dtypes as torch.profiler writes them ("Input type"), so core.work reads both alike.
_TYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
               torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int", torch.int8: "signed char",
               torch.uint8: "unsigned char", torch.bool: "bool"}
ADAMW_BYTES_PER_ELEMENT = 7 * 4  # fp32: parameter, gradient, two moments read; parameter, two moments written


def attention_family(gpu: Gpu) -> str:
    """Which instructions the attention kernels transformers runs (FlashAttention-2: PyTorch's SDPA flash backend,
    flash-attn 2) issue on this GPU, against those its dense peak is quoted for. FlashAttention-2 is written for
    Ampere's mma.sync: on Ampere, Ada and consumer Blackwell (compute capability 8.x, 12.x) that is the peak's own
    instruction; Hopper's and datacenter Blackwell's peaks (9.x, 10.x) are quoted for wgmma and tcgen05, which it
    never issues (FlashAttention-3's paper: 35% of an H100's peak against 70% of an A100's). AMD: its own kernels."""
    if gpu.vendor != "NVIDIA":
        return gpu.vendor
    major = int(gpu.compute_capability.split(".")[0]) if gpu.compute_capability else 8
    return "sm90-sm100" if major in (9, 10) else "mma.sync"


@dataclass(frozen=True)
class Calibration:
    """Per GPU vendor (its libraries: cuBLAS or rocBLAS) and kind of work: the share of the roof reached (gemm:
    compute; memory, dequantize: bandwidth) and a latency per op; the host's time per launched op (eager PyTorch
    with transformers).

    Attention, per kernel family (``attention_family``): the best share of the compute roof forward and backward,
    reached by tiles of much work, and ``half_tile_flop``: a tile's fixed cost is spread over the forward FLOPs it
    computes, so a tile of that many reaches half the best share (a short sequence or a small head dimension, far
    less)."""

    efficiency: dict[str, dict[str, float]]  # vendor -> kind -> share of the roof
    latency_s: dict[str, float]
    host_per_op_s: float
    source: str
    attention: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> forward, backward, half_tile_flop

    @staticmethod
    def load() -> "Calibration":
        data = json.loads(CALIBRATION.read_text())
        return Calibration(data["efficiency"], data["latency_s"], data["host_per_op_s"], data["fitted_on"],
                           data["attention"])

    def share(self, gpu: Gpu, kind: str, tile_flop: float = 0.0, backward: bool = False) -> float:
        if kind == "attention" and self.attention:
            family = self.attention.get(attention_family(gpu)) or self.attention["mma.sync"]
            best = family["backward" if backward else "forward"]
            if not tile_flop > 0:
                return best
            return best * tile_flop / (tile_flop + family["half_tile_flop"])
        mine = self.efficiency.get(gpu.vendor) or next(iter(self.efficiency.values()))
        return mine.get(kind, mine["memory" if kind == "dequantize" else "gemm"])


@dataclass
class StepTime:
    method: str
    gpu: str
    seconds: float
    tokens_per_s: float
    by_category: dict[str, float]  # seconds per step: gemm, attention, elementwise, quantization, recompute, ...
    flop: float
    model_flop: float
    bound: str  # "device" or "host": which side the step waits on
    notes: list[str] = field(default_factory=list)
    lower_bound: bool = False  # a part of the step is not predicted (the host's optimizer step under offload)

    def to_json(self) -> dict:
        return {"predicted": True, "gpu": self.gpu, "step_time_s": self.seconds, "tokens_per_s": self.tokens_per_s,
                "seconds_by_category": self.by_category, "flop_per_step": self.flop,
                "model_flop_per_step": self.model_flop, "bound": self.bound, "lower_bound": self.lower_bound,
                "notes": self.notes}


def _describe(func, args, kwargs) -> tuple[str, list, list, list]:
    """An op call as torch.profiler records it: the schema's name and its inputs' dims, types, values."""
    schema = func._schema
    values = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
    dims, types, concrete = [], [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            dims.append(list(v.shape))
            types.append(_TYPE_NAMES.get(v.dtype, str(v.dtype)))
            concrete.append("")
        else:
            dims.append([])
            types.append("Scalar" if isinstance(v, (int, float, bool)) else "")
            concrete.append(str(v) if isinstance(v, (int, float, bool)) else "")
    return schema.name, dims, types, concrete


class _Recorder(TorchDispatchMode):
    """Every op the meta pass dispatches, with its work, the phase and whether it ran in a decoder layer."""

    def __init__(self):
        super().__init__()
        self.phase, self.in_layer = "forward", False
        self.ops: list[tuple[str, bool, str, work_of.Work]] = []
        self._cache: dict[tuple, work_of.Work] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, dims, types_, concrete = _describe(func, args, kwargs)
        key = (name, repr(dims), tuple(types_), tuple(concrete))
        w = self._cache.get(key)
        if w is None:
            w = self._cache[key] = work_of.work(name, dims, types_, concrete)
        if w.kind:
            self.ops.append((self.phase, self.in_layer, name, w))
        return func(*args, **kwargs)


def step_work(method: Method, config, batch_size: int, seq_len: int) -> pd.DataFrame:
    """One training step's ops on the meta device for a CUDA target: phase (forward, backward, recompute,
    optimizer), kind, flops, model_flops, bytes, precision; one row per op call."""
    if method.kind != "train":
        raise EstimateError(f"{method.name}: step time is predicted for training methods")
    try:
        with library_output():
            model, quantized, plan = meta_model(method, config, "cuda", torch.bfloat16)
        check_sequence(model, seq_len)
    except UnsupportedError as exc:  # the model or the method's settings, said before anything runs
        raise EstimateError(f"{method.name}: {exc}") from None
    except Exception as exc:  # the model's own code refusing this config, as the memory estimate says it
        refusal = model_code_refusal(exc)
        if refusal is None:
            raise
        raise EstimateError(f"{method.name}: {refusal}") from None
    layers = decoder_layers(model)
    rec = _Recorder()
    nf4_calls: list[tuple[bool, int, int]] = []  # (in a layer, weight elements, packed bytes)
    quantized_ids = {id(p) for n, p in model.named_parameters() if n in quantized}

    def enter(module, args):
        rec.in_layer = True

    def leave(module, args, output):
        rec.in_layer = False

    def nf4(module, args):
        if id(getattr(module, "weight", None)) in quantized_ids:
            n = module.weight.numel()
            nf4_calls.append((rec.in_layer, n, n // 2 + 4 * math.ceil(n / 64)))

    handles = [h for m in layers for h in (m.register_forward_pre_hook(enter), m.register_forward_hook(leave))]
    handles += [m.register_forward_pre_hook(nf4) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    batch = torch.zeros(batch_size, seq_len, dtype=torch.long, device="meta")
    try:
        with library_output(), contiguous_batches(), TargetDevice("cuda", torch.bfloat16), rec:
            loss = causal_lm_loss(model, {"input_ids": batch, "labels": batch}, method.loss)
            rec.phase = "backward"
            loss.backward()
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EstimateError(f"{method.name}: the meta-device training step that counts the work failed ({first})") \
            from None
    except Exception as exc:  # the model's own code refusing this config, as the memory estimate says it
        refusal = model_code_refusal(exc)
        if refusal is None:
            raise
        raise EstimateError(f"{method.name}: {refusal}") from None
    finally:
        for h in handles:
            h.remove()
    rows = [dict(phase=phase, in_layer=in_layer, name=name, kind=w.kind, flops=w.flops, model_flops=w.model,
                 bytes=w.bytes, precision=w.precision, tiles=w.tiles, tile_flop=w.tile_flop, backward=w.backward)
            for phase, in_layer, name, w in rec.ops]
    if method.gradient_checkpointing:
        rows += [{**r, "phase": "recompute", "model_flops": 0.0} for r in rows
                 if r["phase"] == "forward" and r["in_layer"]]
    for in_layer, n, packed in nf4_calls:
        # Forward, the input gradient's GEMM, and the recomputed forward under checkpointing.
        passes = ["forward", "backward"] + (["recompute"] if method.gradient_checkpointing and in_layer else [])
        rows += [dict(phase=p, in_layer=in_layer, name="bitsandbytes::dequantize_4bit", kind="dequantize",
                      flops=0.0, model_flops=0.0, bytes=float(packed + 2 * n), precision="") for p in passes]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    tensors = sum(1 for p in model.parameters() if p.requires_grad)
    rows.append(dict(phase="optimizer", in_layer=False, name="AdamW.step", kind="memory", flops=0.0, model_flops=0.0,
                     bytes=float(trainable * ADAMW_BYTES_PER_ELEMENT), precision="", tensors=tensors))
    frame = pd.DataFrame(rows).fillna({"tiles": 0, "tile_flop": 0.0, "backward": False})
    # What the collectives move: the weights in 16 bits (4-bit ones as stored), the trainable parameters.
    frame.attrs["weight_bytes"] = sum(p.numel() * 2 if n not in quantized else p.numel() // 2
                                      for n, p in model.named_parameters())
    frame.attrs["trainable"] = trainable
    return frame


def predict(method: Method, config, batch_size: int, seq_len: int, gpu: Gpu, world_size: int = 1,
            calibration: Calibration | None = None) -> StepTime:
    if world_size > 1 and not method.sharded:
        raise EstimateError(f"{method.name}: DDP's gradient all-reduce over {world_size} ranks is not modelled in the "
                            "step time (its memory is estimated); predict one rank's step with --world-size 1")
    cal = calibration or Calibration.load()
    ops = step_work(method, config, batch_size, seq_len)
    if method.grad_accum > 1:
        # Each micro-batch runs forward and backward again (and launches their ops again); the optimizer steps once.
        attrs = dict(ops.attrs)
        ops = pd.concat([ops[ops.phase != "optimizer"]] * method.grad_accum + [ops[ops.phase == "optimizer"]],
                        ignore_index=True)
        ops.attrs.update(attrs)
    notes = []
    device_s = ops.apply(lambda r: op_seconds(r.kind, r.flops, r.bytes, r.precision, gpu, cal, r.tiles, r.tile_flop,
                                              r.backward), axis=1)
    ops = ops.assign(seconds=device_s)
    # Under ZeRO and FSDP each rank does 1/world_size of the optimizer step (its partition).
    if method.sharded and world_size > 1:
        ops.loc[ops.phase == "optimizer", "seconds"] /= world_size
    category = ops.apply(_category, axis=1)
    by_category = ops.groupby(category).seconds.sum().to_dict()
    comm = communication_seconds(method, ops, gpu, world_size)
    if comm:
        by_category["communication"] = comm
    if method.offload != "none":
        # The optimizer steps on the host; the GPU's step is the transfers to and from it.
        by_category.pop("optimizer", None)
        moved = offload_bytes(method, ops, world_size)
        if gpu.host_bytes_per_s:
            by_category["offload"] = moved / gpu.host_bytes_per_s
        notes.append(f"offload: {moved / 2**30:,.2f} GiB per rank cross the host link each step"
                     + ("" if gpu.host_bytes_per_s else f" ({gpu.key}'s host link is not in profkit's GPU table: "
                                                        "not timed)")
                     + "; the optimizer's step on the host CPU depends on its cores and memory and is not predicted:"
                       " the step time is a lower bound")
    device = sum(by_category.values())
    launched = len(ops[ops.phase != "optimizer"]) + int(ops.get("tensors", pd.Series(dtype=float)).fillna(0).sum())
    host = launched * cal.host_per_op_s
    seconds = max(device, host)
    if host > device:
        by_category["host_overhead"] = host - device
        notes.append(f"the host's launches ({launched:,} ops x {cal.host_per_op_s * 1e6:.0f} µs) take longer than "
                     "the GPU's work: the step waits on the host")
    if method.zero_stage == 3 or method.fsdp:
        notes.append("parameter gathers and gradient reduce-scatters added to the step, not overlapped with compute "
                     "(an upper bound where the framework overlaps them)")
    tokens = batch_size * seq_len * method.grad_accum
    return StepTime(method.name, gpu.key, seconds, tokens / seconds, by_category, float(ops.flops.sum()),
                    float(ops.model_flops.sum()), "host" if host > device else "device", notes,
                    lower_bound=method.offload != "none")


def offload_bytes(method: Method, ops: pd.DataFrame, world_size: int) -> float:
    """What crosses the host link per rank and step under CPU offload: the rank's gradient partition to the host
    (16-bit under ZeRO; FSDP reduces in fp32); back, the updated 16-bit parameters (optimizer offload), or, where
    the parameters live on the host (optimizer+params), the rank's shard of every weight for forward and again
    for backward. Not overlapped with compute: an upper bound on the transfers where the framework overlaps them."""
    trainable, weights = ops.attrs["trainable"], ops.attrs["weight_bytes"]
    to_host = trainable * (4 if method.fsdp else 2) / world_size
    to_gpu = 2 * weights / world_size if method.offload == "optimizer+params" else trainable * 2 / world_size
    return float(to_host + to_gpu)


def predict_run(method: Method, settings, gpu: Gpu, world_size: int = 1) -> StepTime:
    """The prediction for what ``RunSettings`` describe (preset or local model, batch and length)."""
    settings = replace(settings, method=method.name).resolved()  # the method decides the default batch
    return predict(method, model_config(settings), settings.batch_size, settings.seq_len, gpu, world_size)


def occupancy(tiles: float, sms: int | None) -> float:
    """The share of the GPU's multiprocessors a kernel of ``tiles`` independent blocks keeps busy over its waves:
    16 tiles on 132 SMs use 12% of them; 140 tiles take two waves, the second nearly empty (53%). 1 where either
    is unknown."""
    if not tiles or not sms or tiles != tiles:
        return 1.0
    waves = math.ceil(tiles / sms)
    return tiles / (waves * sms)


def op_seconds(kind: str, flops: float, nbytes: float, precision: str, gpu: Gpu, cal: Calibration,
               tiles: float = 0, tile_flop: float = 0.0, backward: bool = False) -> float:
    """Latency plus the larger of the compute time (at the kind's efficiency against the precision's peak; for
    attention, at the rate its tiles' work reaches, on the share of the multiprocessors they occupy) and the
    memory time (at the memory efficiency against the bandwidth)."""
    peak = gpu.peak_flop_per_s(precision) if precision else None
    busy = occupancy(tiles, gpu.sms) if kind == "attention" else 1.0
    share = cal.share(gpu, kind, tile_flop, bool(backward))
    compute = flops / (share * busy * peak) if flops and peak else 0.0
    memory = nbytes / (cal.share(gpu, "memory") * gpu.bytes_per_s) if nbytes else 0.0
    return cal.latency_s.get(kind, cal.latency_s["memory"]) + max(compute, memory)


def _category(r) -> str:
    if r.phase == "optimizer":
        return "optimizer"
    if r.phase == "recompute":
        return "recompute"
    return {"gemm": "gemm", "attention": "attention", "dequantize": "quantization"}.get(r.kind, "elementwise")


def communication_seconds(method: Method, ops: pd.DataFrame, gpu: Gpu, world_size: int) -> float:
    """Ring collectives over the GPU link: ZeRO-2 reduce-scatters the gradients and all-gathers the updated
    parameters; ZeRO-3 and FSDP all-gather the parameters for forward and again for backward and
    reduce-scatter the gradients, for every micro-batch of an accumulating step. Each moves (N-1)/N of the data per
    rank."""
    if world_size <= 1 or not method.sharded:
        return 0.0
    link = gpu.link_bytes_per_s or gpu.host_bytes_per_s
    if not link:
        return 0.0
    grads = ops.attrs["trainable"] * 2  # 16-bit gradients
    micro = method.grad_accum
    if method.zero_stage == 2:
        moved = micro * grads + ops.attrs["trainable"] * 2
    else:
        moved = micro * (2 * ops.attrs["weight_bytes"] + grads)
    return moved * (world_size - 1) / world_size / link
