from types import SimpleNamespace

import pandas as pd

from profkit.analyze.lifetimes import attribute
from profkit.analyze.memory import analyze_lifetimes, compare_sources, disagreements, load_timeline
from tests.conftest import GPU_TRACES


def test_reads_a_foreign_raw_memory_timeline():
    tl = load_timeline(GPU_TRACES / "memory_timeline.raw.json.gz")
    assert tl.total.max() > 0 and (tl.live >= 0).all()


def test_a_disagreement_between_the_sources_is_said_not_hidden():
    export = pd.DataFrame({"category": ["activations", "temporaries", "parameters_frozen"], "phase": "peak",
                           "bytes": [1_000, 3_000, 6_000]})
    own = export.assign(bytes=[1_050, 2_200, 6_000])
    sources = compare_sources(export, own)
    notes = disagreements(sources)
    assert len(notes) == 1 and notes[0].startswith("temporaries: the storage lifetimes say 2,200 bytes"), notes
    assert "-8.6% of the peak" in notes[0]  # (2,200 - 3,000) / 9,250
    assert disagreements(compare_sources(export, export)) == []


def test_what_the_cpu_allocator_counted_beyond_the_dispatcher_is_unattributed():
    """Without the export, a CPU run's peak is measured twice: the storage lifetimes', and what was live when
    following began plus the profiler's allocation counter. Bytes the allocator counted above the lifetimes' peak
    were allocated outside the dispatcher (Inductor's kernel buffers): unattributed, with a note; none are invented
    where the two agree."""
    events = [(0, "existing", 0, 1_000, "cpu", 16, "", "forward", ()),
              (1, "alloc", 1, 500, "cpu", 32, "aten::mm", "forward", (0,)),
              (2, "free", 1, 0, "cpu", 0, "", "forward", ())]
    lifetimes = attribute(events, {("cpu", 16): "parameters_trainable"})
    record = SimpleNamespace(inventory={}, kind="train", peaks={}, timings={})
    result = analyze_lifetimes(record, lifetimes, cpu_allocated=700)
    peak = result.rows[result.rows.phase == "peak"].set_index("category").bytes
    assert peak["unattributed"] == 200 and peak["parameters_trainable"] == 1_000 and peak["temporaries"] == 500
    assert int(result.measured.set_index("phase").measured_peak_bytes["peak"]) == 1_700 == peak.sum()
    assert any("peak 200 bytes above what the dispatcher saw" in n for n in result.notes), result.notes
    for counted in (500, None):
        agreed = analyze_lifetimes(record, lifetimes, cpu_allocated=counted)
        assert agreed.rows.set_index(["phase", "category"]).bytes[("peak", "unattributed")] == 0
        assert not any("dispatcher saw" in n for n in agreed.notes)
