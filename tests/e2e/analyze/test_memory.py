"""

The tests that record, train or start a process; those on stored fixtures are in ``tests/analyze/test_memory.py``."""

import gzip
import json
import pickle
import shutil
from pathlib import Path

import pytest

from profkit import store
from profkit.analyze import breakdown
from profkit.analyze.lifetimes import load_lifetimes
from profkit.analyze.memory import MEMORY_CATEGORIES
from profkit.core.methods import METHODS


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
    shutil.copytree(matrix / "lora", tmp_path / "lora")
    bad = tmp_path / "full"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"method": "full", "status": "oom", "reason": "OutOfMemoryError"}))
    bd = breakdown([tmp_path])
    row = bd.runs.set_index("run").loc["full"]
    assert row.status == "oom"
    assert "full" not in set(bd.memory.run) and "full" not in set(bd.time.run)
    assert not bd.failed


STATIC = ("parameters_trainable", "parameters_frozen", "parameters_quantized", "optimizer_state")


@pytest.mark.parametrize("name", sorted(METHODS))
def test_the_storage_lifetimes_and_the_export_agree_where_both_exist(bd, name):
    """Every method of the matrix has both attributions: static owners equal to the byte, and every other
    category within 1% of the peak, by one set of definitions (what backward computes and drops, activation
    gradients and ZeRO-2's reduce bucket, is a temporary in both; tests/test_storage_lifetimes.py checks the
    lifetimes' definitions)."""
    s = bd.memory_sources[bd.memory_sources.run == name].set_index("category")
    if not len(s):
        # torch's export failed in this recording (see test_every_method_records): the run's own attribution must
        # still stand, its static owners measured
        reason = bd.runs.set_index("run").loc[name]
        own = bd.memory[(bd.memory.run == name) & bd.memory.category.isin(STATIC)]
        assert reason.status == "ok" and own.bytes.sum() > 0, "no comparison of the two sources, and no attribution"
        return
    for category in STATIC:
        if category in s.index:
            assert s.loc[category, "lifetimes_bytes"] == s.loc[category, "export_bytes"], category
    if METHODS[name].fsdp:
        # The export cannot tell FSDP's gathered parameters and files them elsewhere (activations, UNKNOWN): the
        # two differ by those bytes and by nothing else.
        gathered = s.loc["parameters_unsharded", "difference_of_peak"]
        assert gathered > 0.01
        others = s.drop(index="parameters_unsharded").difference_of_peak
        assert abs(others.sum() + gathered) <= 0.01 and (others.abs() <= gathered + 0.01).all()
        return
    apart = s[s.difference_of_peak.abs() > 0.01]
    assert apart.empty, (name, apart[["lifetimes_bytes", "export_bytes", "difference_of_peak"]].to_dict("index"))


def as_cuda_run(source: Path, target: Path) -> dict:
    """A CPU run of the matrix dressed as a CUDA one: its storages on ``cuda:0``, the allocator counters in its
    record, and an allocator history written from its storage lifetimes (as the caching allocator records each
    storage the dispatcher allocates)."""
    shutil.copytree(source, target)
    path = target / store.STORAGE_LIFETIMES
    with gzip.open(path, "rt") as fh:
        data = json.load(fh)
    start = 1_700_000_000_000_000
    data["followed_unix_us"] = [start, start + len(data["events"]) + 10]
    entries, address_of, live, existing = [], {}, {}, {}
    for k, e in enumerate(data["events"]):
        e[4] = e[4].replace("cpu", "cuda:0")
        _t, action, number, nbytes, _device, address = e[:6]
        if action == "alloc":
            address_of[number] = address
            live[number] = nbytes
            entries.append({"action": "alloc", "addr": address, "size": nbytes, "time_us": start + k + 1})
        elif action == "existing":
            existing.setdefault(number, (address, nbytes))
        elif action == "free" and number in address_of:
            entries.append({"action": "free_completed", "addr": address_of[number], "size": live.pop(number),
                            "time_us": start + k + 1})
        elif action == "free" and number in existing:
            entries.append({"action": "free_completed", "addr": existing[number][0], "size": existing.pop(number)[1],
                            "time_us": start + k + 1})
    data["owners"] = [[d.replace("cpu", "cuda:0"), a, o] for d, a, o in data["owners"]]
    with gzip.open(path, "wt") as fh:
        json.dump(data, fh)
    still = [(address_of[n], b) for n, b in live.items()] + list(existing.values())
    segments = [{"device": 0, "address": a, "total_size": max(b, 512),
                 "blocks": [{"size": max(b, 512), "requested_size": b, "state": "active_allocated"}]}
                for a, b in still if b]
    with open(target / store.CUDA_SNAPSHOT, "wb") as fh:
        pickle.dump({"segments": segments, "device_traces": [entries]}, fh)
    manifest = json.loads((target / "manifest.json").read_text())
    peak = load_lifetimes(path).peak.bytes  # the caching allocator would have counted the same bytes at its peak
    manifest["peaks"].update(cuda_max_allocated=peak, cuda_max_reserved=peak)
    (target / "manifest.json").write_text(json.dumps(manifest))
    return data


@pytest.mark.parametrize("name", ["lora", "qlora_gc", "lora_zero2"])
def test_the_allocators_history_takes_the_lifetimes_owners(tmp_path, matrix, name):
    """What the breakdown does with a CUDA run's allocator history (``memory_snapshot.pickle``) and its storage
    lifetimes: every block the dispatcher allocated is matched to its storage, so the history's breakdown at its
    peak is the lifetimes' within 1% of the peak, and nothing is said to be unseen. (A GPU's own history is
    checked by ``analyses/gpu_check.py``.)"""
    as_cuda_run(matrix / name, tmp_path / name)
    bd = breakdown([tmp_path / name], jobs=1)
    sources = bd.memory_sources.set_index("category")
    assert sources.allocator_bytes.notna().all(), sources
    assert (sources.allocator_difference_of_peak.astype(float).abs() <= 0.01).all(), sources
    assert not any("outside the dispatcher" in n or "allocator's history" in n for n in bd.notes[name]), bd.notes
