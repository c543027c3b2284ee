import json

import pandas as pd
import pytest

from profkit.analyze import breakdown
from profkit.analyze.memory import MEMORY_CATEGORIES, compare_sources, disagreements, load_timeline
from profkit.core.methods import METHODS
from tests.conftest import GPU_TRACES


@pytest.fixture(scope="module")
def bd(matrix):
    return breakdown([matrix])


def mem(bd, run, phase="peak"):
    m = bd.memory[(bd.memory.run == run) & (bd.memory.phase == phase)]
    return dict(zip(m.category, m.bytes))


def measured(bd, run, phase="peak"):
    m = bd.measured[(bd.measured.run == run) & (bd.measured.phase == phase)]
    return int(m.measured_peak_bytes.iloc[0])


def inventory(matrix, run):
    manifest = json.loads((matrix / run / "manifest.json").read_text())
    out = {}
    for r in manifest["inventory"]["rows"]:
        out[r["owner"]] = out.get(r["owner"], 0) + r["bytes"]
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_categories_sum_to_the_measured_peak(bd, name):
    for phase in set(bd.memory[bd.memory.run == name].phase):
        cats = mem(bd, name, phase)
        assert list(cats) == list(MEMORY_CATEGORIES)
        assert sum(cats.values()) == pytest.approx(measured(bd, name, phase), rel=0.01)


@pytest.mark.parametrize("name", [n for n, m in METHODS.items() if m.kind == "train" and not m.zero_stage])
def test_static_categories_equal_the_inventory(bd, matrix, name):
    inv = inventory(matrix, name)
    at_step = mem(bd, name, "optimizer")  # gradients are all live during the optimizer step
    assert at_step["parameters_trainable"] == inv["parameters_trainable"]
    assert at_step["gradients"] == inv["gradients"]
    assert at_step["optimizer_state"] == inv["optimizer_state"]
    # And the profiler saw everything the inventory holds: nothing left unexplained at the run's peak.
    peak = mem(bd, name)
    assert abs(peak["unattributed"]) <= 0.01 * measured(bd, name)


@pytest.mark.parametrize("base", ["lora", "qlora", "full"])
def test_gradient_checkpointing_cuts_activations(bd, base):
    assert mem(bd, f"{base}_gc")["activations"] < mem(bd, base)["activations"]


def test_qlora_holds_fewer_parameter_bytes_than_lora(bd, matrix):
    params = lambda run: sum(v for k, v in mem(bd, run).items() if k.startswith("parameters_"))
    assert params("qlora") < params("lora")
    manifest = json.loads((matrix / "qlora" / "manifest.json").read_text())
    rows = {r["detail"]: r for r in manifest["inventory"]["rows"] if r["owner"] == "parameters_quantized"}
    n, layers = manifest["inventory"]["quantized_params"], rows["nf4 weight"]["tensors"]
    # NF4 storage, exactly: 4 bits a weight, one uint8 absmax per 64-weight block (double quantization),
    # and per layer a 16-entry NF4 code, an offset, fp32 absmax per 256 blocks and a 256-entry code.
    assert rows["nf4 weight"]["bytes"] == n // 2
    assert rows["quant_state.absmax"]["bytes"] == n // 64
    assert rows["quant_state.code"]["bytes"] == layers * 16 * 4
    assert rows["quant_state.state2.code"]["bytes"] == layers * 256 * 4
    assert mem(bd, "qlora")["parameters_quantized"] == sum(r["bytes"] for r in rows.values())
    # Per weight that is 3.9x smaller than bf16; the per-layer constants only matter for tiny layers.
    assert 2 * n / (rows["nf4 weight"]["bytes"] + rows["quant_state.absmax"]["bytes"]) == pytest.approx(2 / (0.5 + 1 / 64))


def test_zero_on_one_process_shows_its_buffers(bd):
    """No sharding benefit on one process: ZeRO holds more, not less, than plain LoRA."""
    for name in ("lora_zero2", "lora_zero3"):
        assert measured(bd, name) > measured(bd, "lora")
        assert mem(bd, name)["optimizer_state"] > mem(bd, "lora")["optimizer_state"]  # + fp32 master copy


def test_failed_runs_appear_with_status_not_zeros(tmp_path, matrix):
    import shutil
    shutil.copytree(matrix / "lora", tmp_path / "lora")
    bad = tmp_path / "full"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"method": "full", "status": "oom", "reason": "OutOfMemoryError"}))
    bd = breakdown([tmp_path])
    row = bd.runs.set_index("run").loc["full"]
    assert row.status == "oom"
    assert "full" not in set(bd.memory.run) and "full" not in set(bd.time.run)
    assert not bd.failed


def test_reads_a_foreign_raw_memory_timeline():
    tl = load_timeline(GPU_TRACES / "memory_timeline.raw.json.gz")
    assert tl.total.max() > 0 and (tl.live >= 0).all()


STATIC = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "optimizer_state")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_storage_lifetimes_and_the_export_agree_where_both_exist(bd, name):
    """Every method of the matrix has both attributions: static owners equal to the byte, and every other
    category within 1% of the peak, by one set of definitions (what backward computes and drops, activation
    gradients and ZeRO-2's reduce bucket, is a temporary in both; tests/test_storage_lifetimes.py checks the
    lifetimes' definitions)."""
    s = bd.memory_sources[bd.memory_sources.run == name].set_index("category")
    assert len(s), "no comparison of the two sources"
    for category in STATIC:
        if category in s.index:
            assert s.loc[category, "lifetimes_bytes"] == s.loc[category, "export_bytes"], category
    apart = s[s.difference_of_peak.abs() > 0.01]
    assert apart.empty, (name, apart[["lifetimes_bytes", "export_bytes", "difference_of_peak"]].to_dict("index"))


def test_a_disagreement_between_the_sources_is_said_not_hidden():
    export = pd.DataFrame({"category": ["activations", "temporaries", "parameters_frozen"], "phase": "peak",
                           "bytes": [1_000, 3_000, 6_000]})
    own = export.assign(bytes=[1_050, 2_200, 6_000])
    sources = compare_sources(export, own)
    notes = disagreements(sources)
    assert len(notes) == 1 and notes[0].startswith("temporaries: the storage lifetimes say 2,200 bytes"), notes
    assert "-8.6% of the peak" in notes[0]  # (2,200 - 3,000) / 9,250
    assert disagreements(compare_sources(export, export)) == []
