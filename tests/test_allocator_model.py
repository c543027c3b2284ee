"""The caching allocator's policy (``predict.allocator``) against real allocator snapshots, and the training step
replayed through it (``predict.step_replay``)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from profkit.analyze.snapshot import load_snapshot
from profkit.core.methods import get_method, with_overrides
from profkit.core.settings import RunSettings
from profkit.model.build import shrunk_default_config
from profkit.predict.allocator import CachingAllocator, OutOfMemory, rounded, segment_size
from profkit.predict.estimate import EstimateError, estimate, estimate_run
from profkit.predict.step_replay import growing_lengths, interpolated
from tests.conftest import invoke

SNAPSHOTS = Path(__file__).parent / "data" / "cuda-snapshots"
MiB = 1 << 20


def _replayed(events: list[dict]) -> tuple[CachingAllocator, list[int]]:
    allocator, recorded = CachingAllocator(), []
    for e in events:
        if e["action"] == "alloc":
            allocator.malloc(e["addr"], e["size"], e.get("stream", 0))
        elif e["action"] == "free_completed":
            allocator.free(e["addr"])
        elif e["action"] == "segment_alloc":
            recorded.append(e["size"])
    return allocator, recorded


@pytest.mark.parametrize("name", ["cs336_small_segment_alloc.pickle", "opt_finetune_zo_fedlearn_windows.pickle.gz"])
def test_replaying_a_real_history_opens_the_segments_the_allocator_opened(name):
    """The two snapshots whose history starts with an empty allocator and records every cudaMalloc
    (``segment_alloc``): replaying their allocations and frees opens the same segments, in order, as the real
    allocator did (a 2 MiB or 20 MiB segment, a 512 MiB one, a 148 MiB one...), so the reserved total matches the
    snapshot's to the byte."""
    snapshot = load_snapshot(SNAPSHOTS / name)
    events = snapshot["device_traces"][0]
    allocator, recorded = _replayed(events)
    assert len(recorded) > 5
    assert allocator.segments == recorded
    assert allocator.reserved == sum(s["total_size"] for s in snapshot["segments"])


def test_block_policy():
    assert rounded(1) == 512 and rounded(513) == 1024
    assert segment_size(rounded(100)) == 2 * MiB  # small pool
    assert segment_size(rounded(3 * MiB)) == 20 * MiB  # large pool, under 10 MiB
    assert segment_size(rounded(15 * MiB + 1)) == 16 * MiB  # rounded to 2 MiB
    a = CachingAllocator()
    a.malloc("x", 3 * MiB)
    a.malloc("y", 3 * MiB)  # split from x's 20 MiB segment
    assert a.segments == [20 * MiB]
    a.free("x")
    a.malloc("z", 4 * MiB)  # x's 3 MiB block does not fit: the best fit is the 14 MiB tail
    assert a.segments == [20 * MiB]
    a.malloc("w", 1 * MiB + 512, stream=1)  # another stream never takes this stream's blocks
    assert len(a.segments) == 2
    a.free("y")
    a.free("z")  # y, z and the tail merge back with x's free block: one 20 MiB block again
    a.malloc("big", 20 * MiB)
    assert a.segments == [20 * MiB, 20 * MiB]
    assert a.peak_reserved == a.reserved == 40 * MiB
    with pytest.raises(ValueError):
        a.malloc("big", 1)


@pytest.mark.parametrize("method, ranks, overrides", [
    ("full", 1, {}), ("full_gc", 1, {}), ("lora", 1, {}), ("lora_gc", 1, {}), ("qlora", 1, {}), ("qlora_gc", 1, {}),
    ("full_fsdp", 2, {}), ("lora_fsdp_gc", 2, {}), ("qlora_fsdp", 2, {}), ("full_fsdp_gc", 4, {}),
    ("lora_fsdp", 2, {"offload": "optimizer+params"})])
def test_the_replayed_step_allocates_what_the_estimate_counts(method, ranks, overrides):
    """The replayed step sees the allocations the estimate counts (under FSDP, its shards, gathers and
    reduce-scatters; under its CPU offload, the shards staged for each all-gather): its own allocated peak (blocks
    rounded to 512 bytes) lies within 1% of the estimate's allocated peak, and the reserved prediction is at least
    that peak."""
    e = estimate_run(with_overrides(get_method(method), **overrides), RunSettings(method=method, preset="micro"),
                     "cuda", ranks)
    assert e.replay is not None, e.notes
    assert abs(e.replay.peak_allocated / e.peak_bytes - 1) <= 0.01, (e.replay, e.peak_bytes)
    reserved = e.reserved()
    assert reserved["basis"] == "replay"
    assert reserved["bytes"] == e.peak_bytes + e.replay.overhead >= e.peak_bytes
    assert e.replay.peak_reserved >= e.replay.peak_allocated
    growing = e.reserved_if_lengths_grow()
    assert growing["lengths"] == [16, 32, 48, 64] and growing["bytes"] >= e.peak_bytes
    device = e.device_used()
    assert device["bytes"] > reserved["bytes"] and "cuda_context" in device["outside_allocator"]
    assert ("nccl" in device["outside_allocator"]) == (ranks > 1)


@pytest.mark.parametrize("method, ranks, overrides", [
    ("full", 1, {}), ("lora_gc", 1, {}), ("qlora", 1, {}), ("full_fsdp", 2, {}), ("qlora_fsdp_gc", 2, {}),
    ("lora_fsdp", 2, {"offload": "optimizer+params"}), ("lora", 1, {"grad_accum": 4}),
    ("lora", 1, {"optimizer": "sgd"})])
def test_the_second_step_is_the_first_again_less_the_state_it_made(method, ranks, overrides):
    """The steady step is not run on meta twice: the second step's calls are the first's less what it made to keep.
    Held to a second step really run (lengths 64, 64, then 72 so that it is not skipped), call by call."""
    e = estimate_run(with_overrides(get_method(method), **overrides), RunSettings(method=method, preset="micro"),
                     "cuda", ranks)
    ran = e.tracer((64, 64, 72))
    repeated = e.tracer((64,)).repeated()
    assert repeated.steps == ran.steps[:2]
    assert repeated.canonical() == replace(ran, events=ran.events[:ran.steps[2]]).canonical()
    kept = len(ran.events[ran.steps[0]:ran.steps[1]]) - len(ran.events[ran.steps[1]:ran.steps[2]])
    # AdamW's state, made at the first step, on the device unless offloaded; SGD without momentum keeps none
    assert (kept > 0) == ("offload" not in overrides and overrides.get("optimizer") != "sgd")


@pytest.mark.parametrize("method, ranks, overrides", [
    ("full", 1, {}), ("lora_gc", 1, {}), ("qlora", 1, {}), ("full_fsdp", 2, {}), ("qlora_fsdp_gc", 2, {}),
    ("lora", 1, {"grad_accum": 4}), ("lora", 1, {"loss": "chunked"})])
def test_steps_of_growing_lengths_are_each_lengths_first_step_less_the_state_and_three_make_a_fourth(method, ranks,
                                                                                                     overrides):
    """The growing-length run is not traced whole: each later step is its length's first step less the state the
    first made, and a length's step is interpolated from three others where their calls agree. Held to the run
    really traced at those lengths, call by call, and its replay byte for byte."""
    e = estimate_run(with_overrides(get_method(method), **overrides), RunSettings(method=method, preset="micro"),
                     "cuda", ranks)
    lengths = growing_lengths(e.settings["seq_len"])
    ran = e.tracer(lengths)
    composed = e.tracer((lengths[0],))
    for n in lengths[1:]:
        composed = composed.then(e.tracer((n,)))
    assert composed.steps == ran.steps and composed.canonical() == ran.canonical()
    samples = {n: e.tracer((n,)) for n in lengths if n != lengths[2]}
    guessed = interpolated(samples, lengths[2])
    if guessed is not None:  # the chunked loss' chunks follow the length in steps, not as a polynomial
        assert guessed.canonical() == e.tracer((lengths[2],)).canonical()
    assert e.growing_replay == ran.through()


ARCHITECTURES = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)[::12]  # a spread sample: a replay runs two whole steps


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_step_replays_on_any_architecture_or_says_why_not(model_type):
    """The replay runs two training steps of the model on meta; an architecture whose backward has no meta kernel
    falls back to the measured ratio, with the reason among the notes, never an exception."""
    try:
        config = shrunk_default_config(model_type)
    except Exception:  # transformers' own default config fails its own validation (as in test_every_architecture)
        pytest.skip(f"transformers cannot build {model_type}'s default config")
    try:
        e = estimate(get_method("lora"), config, 1, 32, 1, "cuda", model_type)
    except EstimateError:
        return  # refused before any replay, with its reason (test_every_architecture checks the reasons)
    reserved = e.reserved()
    assert reserved["bytes"] >= e.peak_bytes
    if e.replay is None:
        assert reserved["basis"] == "ratio"
        assert any("could not be replayed" in n for n in e.notes), e.notes
    else:
        assert reserved["basis"] == "replay"


def test_the_estimate_says_which_basis_each_reserved_figure_has():
    """On CUDA the table shows reserved and nvidia-smi rows; with a replayed method beside one that is not (ZeRO), each
    note names its methods; JSON carries the replay and what lies outside the allocator."""
    result = invoke("estimate", "lora_gc", "lora_zero2", "--preset", "micro", "--device", "cuda")
    assert result.returncode == 0, result.stderr
    out = " ".join(result.stdout.split())
    assert "reserved (est.)" in out and "nvidia-smi (est.)" in out and "reserved, lengths grow" in out
    assert "steps of 16, 32, 48, 64 tokens replayed" in out
    assert "reserved (lora_gc): the allocated peak plus" in out
    assert "reserved (lora_zero2): the predicted allocated peak x" in out
    result = invoke("estimate", "lora_fsdp", "--preset", "micro", "--device", "cuda", "--world-size", "2",
                    "--format", "json")
    assert result.returncode == 0, result.stderr
    [e] = json.loads(result.stdout)
    assert e["reserved"]["basis"] == "replay" and e["reserved_if_lengths_grow"]["lengths"] == [16, 32, 48, 64]
    assert e["reserved"]["bytes"] == e["peak_bytes"] + e["allocator_replay"]["overhead"]
    assert set(e["device_used"]["outside_allocator"]) == {"cuda_context", "nccl"}
    assert e["device_used"]["bytes"] == e["reserved"]["bytes"] + sum(e["device_used"]["outside_allocator"].values())


def test_a_full_device_releases_the_cache_then_fails():
    """When cudaMalloc fails the allocator gives every wholly free segment back and tries again; if that is not
    enough, the allocation fails."""
    a = CachingAllocator(capacity=60 * MiB)
    a.malloc("x", 30 * MiB)
    a.malloc("y", 20 * MiB)
    a.free("x")  # cached: a free 30 MiB segment
    a.malloc("z", 32 * MiB)  # no cached block fits and 50 + 32 > 60: x's segment goes back, then z fits
    assert a.released == 30 * MiB and a.reserved == 52 * MiB
    with pytest.raises(OutOfMemory) as failed:
        a.malloc("w", 10 * MiB)  # a 20 MiB segment: 72 > 60 with nothing left to release
    assert failed.value.requested == 10 * MiB and a.reserved == 52 * MiB


def test_whether_a_step_fits_a_gpu_is_the_replay_with_the_room_it_has():
    e = estimate_run(get_method("lora_gc"), RunSettings(method="lora_gc", preset="micro"), "cuda")
    outside = sum(e.device_used()["outside_allocator"].values())
    roomy = e.on_device(outside + 10 * e.reserved()["bytes"])
    assert roomy["fits"] and roomy["failed_request_bytes"] is None
    assert roomy["reserved_bytes"] == e.reserved()["bytes"]  # room to spare: the replay as without a capacity
    tight = e.on_device(outside + e.peak_bytes // 2)
    assert not tight["fits"] and tight["failed_request_bytes"] > 0
    assert tight["capacity_bytes"] == e.peak_bytes // 2
    result = invoke("estimate", "lora_gc", "--preset", "micro", "--device", "cuda", "--gpu", "A100-SXM4-40GB",
                    "--format", "json")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)
    assert row["on_gpu"]["gpu"] == "A100-SXM4-40GB" and row["on_gpu"]["fits"]
