"""FSDP2 (``fully_shard``): every FSDP method recorded at two ranks under torchrun (gloo) on micro and held, rank by
rank, to the estimate the run made before it started; a user's own FSDP2 script under ``profkit.Session``; the
settings and the refusals; FSDP beside ZeRO-3.

The tests that record, train or start a process; those on stored fixtures are in ``tests/test_fsdp.py``."""

from __future__ import annotations

import json

import pytest

from profkit import store
from profkit.analyze import breakdown, ranks
from profkit.report import findings
from tests.conftest import (
    FSDP_METHODS,
    FSDP_ON_TWO_RANKS,
    torchrun,
    users_distributed_script,
)

STATIC = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "optimizer_state", "gradients")


@pytest.fixture(scope="session")
def fsdp_bd(fsdp_ranks):
    return breakdown([fsdp_ranks])


@pytest.fixture(scope="session")
def matrix_bd(matrix):
    return breakdown([matrix / name for name in FSDP_METHODS])


@pytest.mark.parametrize("method", FSDP_ON_TWO_RANKS)
def test_each_rank_holds_the_estimate(fsdp_bd, method):
    """Static categories to the byte on each rank, activations within 15%, the peak with what FSDP gathers."""
    _holds(fsdp_bd, [f"{method}-nproc2/rank{k}" for k in range(2)])


@pytest.mark.parametrize("method", FSDP_METHODS)
def test_one_rank_holds_the_estimate(matrix_bd, method):
    """Every FSDP method as the micro matrix records it, on one rank (FSDP gathers and reduces all the same)."""
    _holds(matrix_bd, [method])


def _holds(bd, runs: list[str]) -> None:
    for run in runs:
        assert bd.runs.set_index("run").loc[run, "status"] == "ok"
        p = bd.predicted[bd.predicted.run == run].set_index("category")
        for category in STATIC:
            assert p.loc[category, "predicted_bytes"] == p.loc[category, "measured_bytes"], (run, category)
        assert p.loc["activations", "measured_bytes"] > 0 and abs(p.loc["activations", "error"]) <= 0.15
        assert abs(p.loc["peak", "error"]) <= 0.05, (run, p.loc["peak"].to_dict())
        # The root unit (embeddings, norm, LM head) is gathered at the forward's peak: measured, and predicted.
        memory = bd.memory[(bd.memory.run == run) & (bd.memory.phase == "forward")].set_index("category").bytes
        estimate = bd.records[run].estimate
        assert memory["parameters_unsharded"] == estimate["instants"]["forward"]["parameters_unsharded"] > 0


@pytest.mark.parametrize("method", ["full_fsdp", "qlora_fsdp_gc"])
def test_each_rank_holds_half_of_every_parameter(fsdp_ranks, matrix, method):
    """Against the same method on one process (the micro matrix): each rank's parameter bytes are half, up to
    the padding of an odd first dimension; the quantization state is not sharded."""
    whole = json.loads((matrix / method / store.MANIFEST).read_text())["inventory"]
    for k in range(2):
        half = json.loads((fsdp_ranks / f"{method}-nproc2" / f"rank{k}" / store.MANIFEST).read_text())["inventory"]
        for owner in ("parameters_trainable", "parameters_frozen"):
            held = sum(r["bytes"] for r in half["rows"] if r["owner"] == owner)
            all_of_it = sum(r["bytes"] for r in whole["rows"] if r["owner"] == owner)
            assert held < all_of_it or all_of_it == 0
            assert 0 <= 2 * held - all_of_it <= 2 * 64 * 4 + 64 * 4  # buffers (rotary) are not sharded
        packed = [r for r in half["rows"] if r["owner"] == "parameters_quantized" and r["detail"] == "nf4 weight"]
        packed_whole = [r for r in whole["rows"] if r["owner"] == "parameters_quantized" and r["detail"] == "nf4 weight"]
        assert sum(r["bytes"] for r in packed) * 2 == sum(r["bytes"] for r in packed_whole)
        assert half["quantized_params"] == whole["quantized_params"]  # logical counts: the whole model's


def test_ranks_show_their_collectives_and_share(fsdp_bd):
    bd = fsdp_bd
    for k in range(2):
        assert bd.time[(bd.time.run == f"lora_fsdp-nproc2/rank{k}") & (bd.time.category == "communication")] \
            .seconds.sum() > 0
        found = bd.records[f"lora_fsdp-nproc2/rank{k}"].model["found"]
        assert found["fsdp"] is True and found["reshard_after_forward"] is True and found["zero_stage"] == 0
    memory = ranks.rank_memory(bd).set_index("run")
    assert 0.45 <= memory.loc["full_fsdp-nproc2/rank0", "parameters_fraction"] <= 0.55
    text = " ".join(findings.rank_sentences(bd))
    assert "FSDP splits each parameter's first dimension 2 ways" in text


USER_SCRIPT = users_distributed_script("my_fsdp", "from torch.distributed.fsdp import fully_shard",
                                       "for layer in model.model.layers:\n    fully_shard(layer)\nfully_shard(model)")


@pytest.mark.long
def test_a_users_fsdp2_script_under_torchrun(tmp_path):
    torchrun(USER_SCRIPT, tmp_path)
    bd = breakdown([tmp_path / "traces" / "my_fsdp"])
    assert set(bd.runs.status) == {"ok"} and list(bd.runs["rank"]) == [0, 1]
    for k in range(2):
        run = f"my_fsdp/rank{k}"
        record = bd.records[run]
        assert record.method == "full_fsdp" and record.settings["fsdp"] is True
        assert record.estimate["settings"]["world_size"] == 2
        p = bd.predicted[bd.predicted.run == run].set_index("category")
        for category in STATIC:
            assert p.loc[category, "predicted_bytes"] == p.loc[category, "measured_bytes"], (run, category)
        memory = bd.memory[(bd.memory.run == run) & (bd.memory.phase == "peak")].set_index("category").bytes
        assert memory["parameters_unsharded"] > 0
