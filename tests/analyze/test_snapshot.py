"""CUDA allocator snapshots recorded by others: figures checked against sums computed here, independently, from
the pickles (and, where the history starts from an empty allocator, against a forward replay of it)."""

from __future__ import annotations

import copy
import gzip
import json
import os
import pickle

import pytest

from profkit.analyze.snapshot import SnapshotError, analyse_snapshot, load_snapshot
from tests.conftest import invoke, DATA

SNAPSHOTS = DATA / "cuda-snapshots"
ALL = sorted(SNAPSHOTS.glob("*.pickle*"))
ACTIVE = ("active_allocated", "active_awaiting_free")


class _PlainData(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"{module}.{name}")


def raw(path):
    with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as fh:
        return _PlainData(fh).load()


@pytest.mark.parametrize("path", ALL, ids=lambda p: p.stem)
def test_state_at_the_dump_equals_sums_over_segments_and_blocks(path):
    data = raw(path)
    a = analyse_snapshot(path)
    for _, d in a.devices.iterrows():
        segs = [s for s in data["segments"] if s.get("device", 0) == d.device]
        blocks = [b for s in segs for b in s["blocks"]]
        assert d.reserved_bytes == sum(s["total_size"] for s in segs)
        assert d.allocated_bytes == sum(b["size"] for b in blocks if b["state"] in ACTIVE)
        assert d.segments == len(segs)
        free = [b["size"] for b in blocks if b["state"] == "inactive"]
        assert d.largest_free_block_bytes == max(free, default=0)
        used = [s for s in segs if any(b["state"] in ACTIVE for b in s["blocks"])]
        assert d.inactive_split_bytes == sum(b["size"] for s in used for b in s["blocks"] if b["state"] == "inactive")
        assert d.segments == a.segment_sizes[a.segment_sizes.device == d.device].segments.sum()
    snapshot_live = a.live[a.live.instant == "snapshot"]
    assert snapshot_live["bytes"].sum() == a.devices.allocated_bytes.sum()


def test_history_from_an_empty_allocator_matches_a_forward_replay():
    """This snapshot's history starts before the first segment was allocated: replaying it forward from zero
    must reach the backward reconstruction's peaks and the segments at the dump."""
    path = SNAPSHOTS / "cs336_small_segment_alloc.pickle"
    data = raw(path)
    allocated = reserved = peak_alloc = peak_res = 0
    for e in data["device_traces"][0]:
        allocated += {"alloc": e["size"], "free_completed": -e["size"]}.get(e["action"], 0)
        reserved += {"segment_alloc": e["size"], "segment_free": -e["size"]}.get(e["action"], 0)
        peak_alloc, peak_res = max(peak_alloc, allocated), max(peak_res, reserved)
    d = analyse_snapshot(path).devices.iloc[0]
    # The history records requested sizes; the blocks hold them rounded up.
    assert reserved == d.reserved_bytes and allocated == d.requested_bytes < d.allocated_bytes
    assert d.peak_allocated_bytes == peak_alloc and d.peak_reserved_bytes == peak_res


def test_live_at_the_peak_adds_up_to_the_peak():
    for path in ALL:
        a = analyse_snapshot(path)
        peak = a.live[a.live.instant == "peak"]
        if len(peak) and "synthetic" not in " ".join(a.notes) and "mosaic" not in path.name:
            assert peak["bytes"].sum() == a.devices.peak_allocated_bytes.iloc[0], path.name


def test_owners_from_frames_and_annotations():
    a = analyse_snapshot(SNAPSHOTS / "cs336_gpt_medium_ctx128_training.pickle.gz")
    peak = a.live[a.live.instant == "peak"].groupby("owner")["bytes"].sum()
    assert peak["gradients (AccumulateGrad)"] > 1 << 30  # the gradients of a ~400M-parameter model
    assert peak["optimizer step"] > 0
    sites = set(a.live.site)
    assert any(s.startswith("cs336_basics/optimizer.py:") for s in sites)
    assert not any(".c:" in s for s in sites)  # CPython's own C frames are never a site


def test_legacy_torch20_layout_and_windows_paths():
    legacy = analyse_snapshot(SNAPSHOTS / "flexgen_opt_inference_OOM_torch20_legacy.pickle")
    top = legacy.live[legacy.live.instant == "snapshot"].iloc[0]
    assert top.site == "flexgen/pytorch_backend.py:190 allocate" and top.library == "user code"
    assert any("torch 2.0" in n for n in legacy.notes) and any("request is unknown" in n for n in legacy.notes)
    windows = analyse_snapshot(SNAPSHOTS / "opt_finetune_zo_fedlearn_windows.pickle.gz")
    assert "transformers" in set(windows.live.library)  # C:\...\site-packages\transformers\ frames


def _with_oom(tmp_path, request, device_free, expandable=False):
    """A real snapshot with an OOM event appended as the allocator would record it (the fixtures hold none)."""
    data = raw(SNAPSHOTS / "cs336_fullstep_fragmented_999seg.pickle.gz")
    data = copy.deepcopy(data)
    data["allocator_settings"]["expandable_segments"] = expandable
    last = data["device_traces"][0][-1]
    data["device_traces"][0].append({"action": "oom", "addr": 0, "size": request, "stream": 0, "frames": [],
                                     "device_free": device_free, "time_us": last["time_us"] + 10})
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(data))
    return path, data


def test_oom_that_fragmentation_caused(tmp_path):
    d0 = analyse_snapshot(SNAPSHOTS / "cs336_fullstep_fragmented_999seg.pickle.gz").devices.iloc[0]
    # Larger than any free block, smaller than the free bytes in reserved segments plus the device's free memory.
    request = int(d0.largest_free_block_bytes) + (64 << 20)
    path, data = _with_oom(tmp_path, request, device_free=32 << 20)
    o = analyse_snapshot(path).oom.iloc[0]
    free_blocks = [b["size"] for s in data["segments"] if s["segment_type"] == "large" for b in s["blocks"]
                   if b["state"] == "inactive"]
    assert o.verdict == "fragmentation" and o.request_bytes == request and o.device_free_bytes == 32 << 20
    assert o.largest_free_block_bytes == max(free_blocks)
    assert o.cached_free_bytes == sum(s["total_size"] for s in data["segments"]) - sum(
        b["size"] for s in data["segments"] for b in s["blocks"] if b["state"] in ACTIVE)
    assert "expandable_segments:True" in o.explanation


def test_oom_that_no_allocator_setting_would_have_avoided(tmp_path):
    d0 = analyse_snapshot(SNAPSHOTS / "cs336_fullstep_fragmented_999seg.pickle.gz").devices.iloc[0]
    request = int(d0.free_in_reserved_bytes) + (3 << 30)
    path, _ = _with_oom(tmp_path, request, device_free=1 << 30, expandable=True)
    a = analyse_snapshot(path)
    o = a.oom.iloc[0]
    assert o.verdict == "true shortage" and "2.0 GiB short" in o.explanation
    at_oom = a.live[a.live.instant == "oom"]
    assert at_oom["bytes"].sum() == o.allocated_bytes  # what was live at the OOM, by owner and site


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [Evil()]}))
    with pytest.raises(SnapshotError, match="refused to load posix.system|refused to load os.system"):
        load_snapshot(path)
    assert not marker.exists()
    out = invoke("snapshot", str(path), str(SNAPSHOTS / "cs336_small_segment_alloc.pickle"))
    assert out.returncode == 1 and "evil.pickle" in out.stderr and "refused" in out.stderr
    assert "cs336_small_segment_alloc.pickle" in out.stdout and not marker.exists()
    assert "Traceback" not in out.stderr


def test_memory_viz_html_export_is_read(tmp_path):
    from torch.cuda import _memory_viz

    data = raw(SNAPSHOTS / "cs336_fullstep_adamw_annot.pickle.gz")
    html = tmp_path / "viz.html"
    html.write_text(_memory_viz.trace_plot(data))
    a, b = analyse_snapshot(html), analyse_snapshot(SNAPSHOTS / "cs336_fullstep_adamw_annot.pickle.gz")
    assert a.devices.to_dict() == b.devices.to_dict()


def test_cli_every_fixture_every_format(tmp_path):
    out = invoke("snapshot", *map(str, ALL), "--plot", str(tmp_path / "t.png"), env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    assert all(len(line) <= 80 for line in out.stdout.splitlines())
    assert "largest free block" in out.stdout and "live at the allocated peak" in out.stdout
    assert len(list(tmp_path.glob("t-*.png"))) >= 5
    js = json.loads(invoke("snapshot", str(ALL[0]), "--format", "json").stdout)
    assert js[str(ALL[0])]["devices"][0]["reserved_bytes"] == sum(s["total_size"] for s in raw(ALL[0])["segments"])
    csv = invoke("snapshot", str(ALL[0]), "--format", "csv").stdout
    assert csv.startswith("snapshot,table,device,name,value")
    md = invoke("snapshot", str(ALL[0]), "--format", "markdown")
    assert md.returncode == 0 and "reserved_bytes" in md.stdout


def test_truncated_and_foreign_files_are_named(tmp_path):
    cut = tmp_path / "cut.pickle"
    cut.write_bytes((SNAPSHOTS / "cs336_small_segment_alloc.pickle").read_bytes()[:5000])
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    for path in (cut, text, tmp_path / "missing.pickle"):
        with pytest.raises(SnapshotError) as info:
            load_snapshot(path)
        assert str(path) in str(info.value)
