"""Predicted step time (predict/step_time.py): the work of a meta-device step is what each method must do, the
prediction moves the way the methods and GPUs differ, and the calibration is what its script derives from the
real traces."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from transformers import AutoConfig

from profkit.core import gpus
from profkit.core.methods import METHODS, get_method
from profkit.core.presets import get_preset
from profkit.core.settings import RunSettings
from profkit.model.build import model_config
from profkit.predict.estimate import estimate_run
from profkit.predict.fit import Device
from profkit.predict.step_time import CALIBRATION, predict, step_work
from typer.testing import CliRunner

from profkit.cli import app


def invoke(*args: str, env: dict | None = None):
    """The command in this process (a subprocess adds nothing here but its start-up)."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})})
    result.returncode = result.exit_code
    return result

ROOT = Path(__file__).resolve().parents[1]
CONFIG = AutoConfig.for_model(**get_preset("micro").config)


@pytest.fixture(scope="module")
def work():
    return {m: step_work(METHODS[m], CONFIG, 2, 64) for m in ("full", "lora", "lora_gc", "qlora", "qlora_gc")}


def _flops(ops, phase, kind=None):
    sel = ops[(ops.phase == phase) & ((ops.kind == kind) if kind else True)]
    return sel.flops.sum()


def test_full_fine_tuning_computes_both_gradients_of_every_weight(work):
    """Backward GEMMs: the input's gradient and the weight's, each as much as the forward GEMM."""
    ops = work["full"]
    assert _flops(ops, "backward", "gemm") == pytest.approx(2 * _flops(ops, "forward", "gemm"), rel=0.02)


def test_lora_skips_the_frozen_weights_gradient(work):
    ops = work["lora"]
    assert _flops(ops, "backward", "gemm") < 1.3 * _flops(ops, "forward", "gemm")
    assert _flops(ops, "forward", "gemm") == pytest.approx(_flops(work["full"], "forward", "gemm"), rel=0.1)


def test_checkpointing_recomputes_the_layers_forward(work):
    lora, gc = work["lora"], work["lora_gc"]
    assert _flops(lora, "recompute") == 0
    in_layers = lora[(lora.phase == "forward") & lora.in_layer].flops.sum()
    assert _flops(gc, "recompute") == pytest.approx(in_layers) and in_layers > 0
    assert gc[gc.phase == "recompute"].model_flops.sum() == 0


def test_nf4_dequantizes_each_weight_per_use(work):
    """Forward and the input gradient's GEMM; a third time in a recomputed layer."""
    q, qgc = work["qlora"], work["qlora_gc"]
    dq = q[q.kind == "dequantize"]
    assert len(dq) and set(dq.phase) == {"forward", "backward"}
    assert (dq.phase == "forward").sum() == (dq.phase == "backward").sum()
    assert (qgc.kind == "dequantize").sum() > len(dq)
    assert not (work["lora"].kind == "dequantize").any()


def test_predictions_move_as_methods_and_gpus_differ():
    big = AutoConfig.for_model(**get_preset("llama-3.2-3b").config)
    h100, rtx = gpus.find("H100-SXM"), gpus.find("RTX-3090")
    full = predict(METHODS["full"], big, 4, 512, h100)
    assert predict(METHODS["full"], big, 4, 512, rtx).seconds > 1.5 * full.seconds
    assert predict(METHODS["full_gc"], big, 4, 512, h100).seconds > full.seconds
    assert full.model_flop > predict(METHODS["lora"], big, 4, 512, h100).model_flop
    sharded = predict(METHODS["full_zero3"], big, 4, 512, h100, world_size=4)
    assert sharded.by_category["communication"] > 0 and "communication" not in full.by_category
    assert full.tokens_per_s == pytest.approx(4 * 512 / full.seconds)


@pytest.mark.parametrize("method", ["full_zero3", "full_fsdp"])
def test_offload_times_the_host_link_and_says_the_hosts_step_is_not_predicted(method):
    """The optimizer leaves the GPU; what crosses PCIe is timed at the GPU's host link; keeping the parameters on
    the host moves every weight's shard twice a step. The host's optimizer step is not predicted: a lower bound."""
    from profkit.core.methods import with_overrides
    from profkit.predict.step_time import offload_bytes

    config = AutoConfig.for_model(**get_preset("micro").config)
    h100 = gpus.find("H100-SXM")
    plain = predict(METHODS[method], config, 2, 64, h100, world_size=2)
    both = with_overrides(METHODS[method], offload="optimizer+params")
    offloaded = predict(both, config, 2, 64, h100, world_size=2)
    assert "optimizer" in plain.by_category and "optimizer" not in offloaded.by_category
    assert not plain.lower_bound and offloaded.lower_bound
    assert any("not predicted" in n and "lower bound" in n for n in offloaded.notes)
    ops = step_work(both, config, 2, 64)
    assert offloaded.by_category["offload"] == pytest.approx(offload_bytes(both, ops, 2) / h100.host_bytes_per_s)
    # Parameters on the host cross the link for forward and backward: more than the update alone would.
    assert offload_bytes(both, ops, 2) >= ops.attrs["weight_bytes"]
    if method == "full_zero3":
        optimizer_only = with_overrides(METHODS[method], offload="optimizer")
        assert offload_bytes(optimizer_only, ops, 2) < offload_bytes(both, ops, 2)


@pytest.mark.parametrize("method", ["full", "lora"])
def test_an_moe_step_counts_its_experts_products(method):
    """Each token runs its top-k experts' three products forward (fp32 experts, which the meta kernel refuses,
    and bf16 ones alike); a frozen expert's backward computes its input's gradient only, a trained one's also its
    weight's."""
    settings = RunSettings(preset="micro-moe", method=method).resolved()
    config = model_config(settings)
    ops = step_work(get_method(method), config, 2, 64)
    tokens, layers = 2 * 64, config.num_hidden_layers
    experts = 2 * tokens * config.num_experts_per_tok * 3 * config.hidden_size * config.intermediate_size * layers
    gemm = ops[ops.kind == "gemm"].groupby("phase").flops.sum()
    assert gemm["forward"] >= experts
    assert gemm["backward"] >= (2 if method == "full" else 1) * experts


def test_the_calibration_is_what_its_script_derives():
    sys.path.insert(0, str(ROOT / "analyses"))
    import fit_step_time

    ops = [fit_step_time.ops_of(name)[0] for name in fit_step_time.FIT]
    import pandas as pd

    cal = fit_step_time.calibrate(pd.concat(ops, ignore_index=True),
                                  fit_step_time.kernel_ops(fit_step_time.KERNELS, "used"), 0.0)
    saved = json.loads(CALIBRATION.read_text())
    assert saved["efficiency"] == cal.efficiency and saved["latency_s"] == pytest.approx(cal.latency_s)
    assert saved["attention"] == cal.attention
    # The benchmarks' held-out rows are never fitted on.
    kernels = pd.read_csv(fit_step_time.KERNELS, dtype=str, keep_default_na=False)
    assert set(kernels.split) == {"", "used", "held-out"} and (kernels.split == "held-out").sum() >= 10
    assert not set(saved["held_out"]) & {n.removesuffix(".json.gz") for n in fit_step_time.FIT}


def test_estimate_gpu_on_the_command_line():
    result = invoke("estimate", "lora", "qlora_gc", "--preset", "micro", "--gpu", "h100-sxm", "--format", "json")
    assert result.returncode == 0, result.output
    out = {e["method"]: e for e in json.loads(result.stdout)}
    for m in ("lora", "qlora_gc"):
        st = out[m]["step_time"]
        assert st["predicted"] is True and st["gpu"] == "H100-SXM" and st["step_time_s"] > 0
        assert st["tokens_per_s"] > 0 and st["seconds_by_category"]
    table = invoke("estimate", "lora", "--preset", "micro", "--gpu", "A100-SXM4-80GB", env={"COLUMNS": "80"})
    assert table.returncode == 0 and "Predicted step time on A100-SXM4-80GB (not measured)" in table.stdout
    # A method changed on the command line keeps its prediction (the estimate names it by its label), and an
    # offloaded step is a lower bound in the JSON and the table alike.
    offload = ("estimate", "full_zero3", "--offload", "optimizer", "--preset", "micro", "--gpu", "H100-SXM")
    [changed] = json.loads(invoke(*offload, "--format", "json").stdout)
    assert changed["method"] == "full_zero3-offload-optimizer" and changed["step_time"]["lower_bound"] is True
    assert "≥ " in invoke(*offload, env={"COLUMNS": "80"}).stdout
    bad = invoke("estimate", "lora", "--preset", "micro", "--gpu", "Voodoo 3")
    assert bad.returncode == 2 and "valid GPUs: " in bad.output and "H100-SXM" in bad.output


def test_recommend_ranks_each_method_at_the_largest_batch_it_fits_by_predicted_tokens_per_s():
    """With a GPU and no runs, recommend is fit's engine: each method at the largest batch that fits the budget
    (the full estimate there fits, one more does not), ranked by the tokens/s predicted at it; JSON and the table
    say the same, the table within 80 columns."""
    result = invoke("recommend", "--budget", "1GiB", "--preset", "micro", "--gpu", "H100-SXM", "-f", "json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["batch"] == "largest that fits" and out["gpu"] == "H100-SXM"
    ranked = [r for r in out["ranked"] if r["fits"]]
    assert len(ranked) >= 10 and {r["source"] for r in ranked} == {"predicted"}
    speeds = [r["tokens_per_s"] for r in ranked]
    assert speeds == sorted(speeds, reverse=True)
    assert all(r["peak_bytes"] <= out["budget_bytes"] for r in ranked)
    # The batch is the boundary: the next one does not fit (lora's, held to the full estimate).
    lora = next(r for r in ranked if r["method"] == "lora")
    settings = RunSettings(method="lora", preset="micro").resolved()
    room = Device(out["budget_bytes"], 0.0)
    assert room.check(estimate_run(get_method("lora"), replace(settings, batch_size=lora["batch_size"]), "cuda"))["fits"]
    assert not room.check(estimate_run(get_method("lora"), replace(settings, batch_size=lora["batch_size"] + 1),
                                       "cuda"))["fits"]
    table = invoke("recommend", "--budget", "1GiB", "--preset", "micro", "--gpu", "H100-SXM", env={"COLUMNS": "80"})
    assert table.returncode == 0 and all(len(line) <= 80 for line in table.stdout.splitlines())
    assert f"{lora['batch_size']:,}" in table.stdout and "largest batch it" in table.stdout
    assert "step time predicted from the step's work" in table.stdout and "not measured" in table.stdout


def test_a_gpu_run_carries_its_predicted_step_time_and_the_breakdown_sets_it_beside_the_measured():
    """The worker predicts the step time on the run's GPU before the run (on the meta device: this runs without
    one), and the analysis compares each category with the kernel time the trace measured."""
    from profkit.analyze.predicted import predicted_time
    from profkit.launch.worker import predict as worker_predict

    settings = RunSettings(method="lora", preset="micro", device="cuda")
    est = worker_predict(get_method("lora"), settings, "cuda", "NVIDIA H100 80GB HBM3")
    step = est["step_time"]
    assert step["predicted"] and step["gpu"] == "H100-SXM" and step["step_time_s"] > 0
    assert "instants" in est  # the memory estimate is still there
    unknown = worker_predict(get_method("lora"), settings, "cuda", "Imaginary GPU 9000")
    assert "'Imaginary GPU 9000' is not in profkit's GPU table" in unknown["step_time"]["error"]
    assert "step_time" not in worker_predict(get_method("lora"), replace(settings, device="cpu"), "cpu", "x86_64")

    by_category = step["seconds_by_category"]
    time = pd.DataFrame([{"resource": "gpu", "category": c, "seconds": 2 * s, "overlapped_seconds": 0.0}
                         for c, s in by_category.items()]
                        + [{"resource": "cpu", "category": "gemm", "seconds": 1.0, "overlapped_seconds": 0.0}])
    compared = predicted_time(est, time, clean_step_s=step["step_time_s"] / 2).set_index("category")
    assert "host_overhead" not in compared.index
    for category in set(by_category) - {"host_overhead"}:
        assert compared.loc[category, "error"] == pytest.approx(-0.5)  # predicted half of what was measured
    assert compared.loc["step", "error"] == pytest.approx(1.0)
    assert predicted_time({"instants": {}}, time, 1.0).empty  # no prediction: nothing compared


def test_a_short_attention_keeps_only_part_of_the_gpu_busy():
    """An attention kernel runs one (batch, head, 128-query block) per thread block: fewer blocks than the GPU
    has multiprocessors leave the rest idle, and a last partial wave runs part-empty."""
    from profkit.core import work
    from profkit.predict.step_time import Calibration, occupancy, op_seconds

    w = work.work("aten::_scaled_dot_product_flash_attention", [[2, 8, 300, 64]] * 3 + [[]] * 3,
                  ["c10::BFloat16"] * 3 + ["Scalar"] * 3, ["", "", "", "0.", "True", "False"])
    assert w.tiles == 2 * 8 * 3  # ceil(300 / 128) = 3 query blocks per head
    assert occupancy(16, 132) == pytest.approx(16 / 132) and occupancy(140, 132) == pytest.approx(140 / 264)
    assert occupancy(0, 132) == occupancy(float("nan"), 132) == occupancy(500, None) == 1.0
    h100, cal = gpus.find("H100-SXM"), Calibration.load()
    full = op_seconds("attention", 1e12, 0.0, "bf16", h100, cal, tiles=h100.sms * 4)
    short = op_seconds("attention", 1e12, 0.0, "bf16", h100, cal, tiles=h100.sms // 4)
    assert short == pytest.approx(cal.latency_s["attention"] + 4 * (full - cal.latency_s["attention"]), rel=0.05)
    # The GEMM's rate does not depend on the tiles (its grid is not modelled).
    assert op_seconds("gemm", 1e12, 0.0, "bf16", h100, cal, tiles=1) == op_seconds("gemm", 1e12, 0.0, "bf16", h100, cal)


def test_an_attention_tile_that_walks_more_keys_reaches_a_higher_rate():
    """A tile's fixed cost is spread over the keys it walks and its head dimension: a 512-token prefill at head
    dimension 64 runs far below the rate of an 8k-token training sequence at 128, and backward has its own share."""
    from profkit.core import work
    from profkit.predict.step_time import Calibration, attention_family

    def attention(length: int, dim: int, name: str = "aten::_scaled_dot_product_flash_attention"):
        return work.work(name, [[1, 16, length, dim]] * 3 + [[]] * 3, ["c10::BFloat16"] * 3 + ["Scalar"] * 3,
                         ["", "", "", "0.", "True", "False"])

    short, long = attention(512, 64), attention(8192, 128)
    # Causal: a tile walks on average half the keys; 4 FLOPs per query-key pair per head dimension.
    assert long.tile_flop == pytest.approx(4 * 128 * 8192 / 2 * 128, rel=0.02)
    assert short.tile_flop == pytest.approx(4 * 128 * 512 / 2 * 64, rel=0.15)
    h100, a100, cal = gpus.find("H100-SXM"), gpus.find("A100-SXM4-80GB"), Calibration.load()
    hopper = cal.attention[attention_family(h100)]
    best = hopper["forward"]
    assert cal.share(h100, "attention", short.tile_flop) < cal.share(h100, "attention", long.tile_flop) < best
    assert cal.share(h100, "attention", long.tile_flop) > 0.5 * best
    assert cal.share(h100, "attention", long.tile_flop, backward=True) == pytest.approx(
        cal.share(h100, "attention", long.tile_flop) * hopper["backward"] / best)
    # Unknown tile work (a foreign op with no shapes for it): the best share, not a guess below it.
    assert cal.share(h100, "attention") == best
    # FlashAttention-2 issues Ampere's instructions: on a Hopper GPU it reaches a smaller share of a peak quoted
    # for wgmma than on an A100 (or an RTX 4090, or consumer Blackwell) of theirs.
    assert [attention_family(gpus.find(k)) for k in ("A100-SXM4-80GB", "RTX-4090", "RTX-5090", "H100-SXM", "B200")] \
        == ["mma.sync", "mma.sync", "mma.sync", "sm90-sm100", "sm90-sm100"]
    assert cal.share(h100, "attention", long.tile_flop) < cal.share(a100, "attention", long.tile_flop)
