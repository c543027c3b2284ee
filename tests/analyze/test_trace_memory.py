"""Memory in traces recorded by others, from their [memory] events: figures checked against an independent
replay of the raw JSON."""

import gzip
import json

import pytest

from profkit.analyze import breakdown
from profkit.analyze.trace_memory import BEFORE
from tests.conftest import invoke, GPU_TRACES

WITH_TOTALS = ["v100_2rank_rank1_memory_events.json.gz", "h100_qwen1.5-0.5b_hf_memory.json.gz",
               "mi300x_qwen1.5-0.5b_hf_memory.json.gz"]


def raw_memory_events(path):
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("ph") == "i"]
    return sorted(mem, key=lambda e: e["ts"])  # stable: file order among equal times


@pytest.mark.parametrize("trace", WITH_TOTALS)
def test_peak_and_live_bytes_equal_an_independent_replay(trace):
    path = GPU_TRACES / trace
    bd = breakdown([path])
    run = trace.removesuffix(".json.gz")
    events = [e for e in raw_memory_events(path) if e["args"].get("Device Type", 0) != 0]  # the accelerator
    peak_event = max(range(len(events)), key=lambda i: (events[i]["args"]["Total Allocated"], -i))
    peaks = bd.trace_memory_peaks[(bd.trace_memory_peaks.run == run) & (bd.trace_memory_peaks.device != "cpu")]
    assert int(peaks.peak_allocated_bytes.iloc[0]) == events[peak_event]["args"]["Total Allocated"]
    assert int(peaks.peak_reserved_bytes.iloc[0]) == max(e["args"]["Total Reserved"] for e in events)
    live = {}
    for e in events[: peak_event + 1]:
        a = e["args"]
        if a["Bytes"] > 0:
            live[a["Addr"]] = a["Bytes"]
        else:
            live.pop(a["Addr"], None)
    ours = bd.trace_memory[(bd.trace_memory.run == run) & (bd.trace_memory.device != "cpu")]
    assert int(ours[ours.category != BEFORE].bytes.sum()) == sum(live.values())
    assert int(ours[ours.category != BEFORE].allocations.sum()) == len(live)
    assert any("need profkit's inventory" in n for n in bd.notes[run])


def test_training_memory_is_attributed_to_forward_and_backward():
    bd = breakdown([GPU_TRACES / "v100_2rank_rank1_memory_events.json.gz"])
    live = bd.trace_memory[bd.trace_memory.device == "cuda:1"].groupby("phase").bytes.sum()
    assert live["forward"] > 0 and live["backward"] > 0
    assert bd.runs.iloc[0].measured_peak_bytes == bd.trace_memory_peaks.peak_reserved_bytes.max()


def test_an_older_schema_without_addresses_says_what_it_cannot_know():
    bd = breakdown([GPU_TRACES / "v100_resnet50_kineto2021_memory.json.gz"])
    run = "v100_resnet50_kineto2021_memory"
    assert bd.trace_memory.empty and len(bd.trace_memory_peaks) == 2
    assert any("no addresses" in n for n in bd.notes[run]) and any("running sum" in n for n in bd.notes[run])


def test_cli_shows_the_live_table_and_no_empty_tables():
    out = invoke("breakdown", str(GPU_TRACES / "v100_2rank_rank1_memory_events.json.gz"),
                  str(GPU_TRACES / "a100_distributed_rank0.json.gz"), env={"COLUMNS": "80"})
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())  # lines wrap at 80 columns
    assert "live at the allocated peak" in text and "[memory] events" in text
    assert "Memory at the run's peak" not in text  # no empty inventory table for foreign traces
    assert text.count("has no [memory] events") == 1  # said once, for the trace that has none
