"""CUDA allocator snapshots recorded by others: figures checked against sums computed here, independently, from the
pickles (and, where the history starts from an empty allocator, against a forward replay of it).

The tests that record, train or start a process; those on stored fixtures are in ``tests/analyze/test_snapshot.py``."""

from __future__ import annotations

import shutil

from tests.analyze.test_snapshot import ACTIVE, SNAPSHOTS, raw


def test_breakdown_and_report_of_a_run_with_an_allocator_snapshot(matrix, tmp_path):
    """A CUDA run keeps the allocator snapshot profkit dumped; here a real one is put in a recorded run (this
    machine has no GPU): breakdown splits reserved - allocated with it, the report shows it."""
    from profkit.analyze import breakdown
    from profkit.report.document import write_report

    run = tmp_path / "traces" / "lora"
    shutil.copytree(matrix / "lora", run)
    source = SNAPSHOTS / "cs336_gpt_medium_ctx128_training.pickle.gz"
    shutil.copy(source, run / "memory_snapshot.pickle")
    bd = breakdown([run])
    data = raw(source)
    in_use = [s for s in data["segments"] if any(b["state"] in ACTIVE for b in s["blocks"])]
    row = bd.runs.iloc[0]
    assert row.allocator_cached_free_bytes == sum(s["total_size"] for s in data["segments"] if s not in in_use)
    assert row.allocator_fragmentation_bytes == sum(b["size"] for s in in_use for b in s["blocks"]
                                                   if b["state"] == "inactive")
    assert any("allocator snapshot" in n for n in bd.notes["lora"])
    rep = write_report([run], tmp_path / "report")
    text = rep.markdown_path.read_text()
    assert "## Allocator: lora" in text and "allocator_lora.png" in text
    assert (tmp_path / "report" / "allocator_lora.png").is_file()
