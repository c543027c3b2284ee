"""``profkit fit`` held to measurement on the CPU: the largest batch it finds for a budget, and one more, recorded;
the recorded peak at its answer is within the budget and the one past it is not."""

from __future__ import annotations

import json

from profkit.analyze import breakdown
from profkit.core.units import parse_bytes
from tests.conftest import invoke

BUDGET = "18MiB"  # lora on micro at its sequence length: a boundary of a few samples, two short recordings


def test_fits_answer_and_one_step_past_it_against_recordings_of_both(tmp_path):
    found = invoke("fit", "lora", "--preset", "micro", "--device", "cpu", "--budget", BUDGET, "--margin", "0",
                   "-f", "json")
    assert found.returncode == 0, found.stderr
    batch = json.loads(found.stdout)["methods"][0]["largest_batch"]
    largest = batch["largest"]
    assert largest >= 2 and batch["one_step_past"] is not None
    measured = {}
    for b in (largest, largest + 1):
        recorded = invoke("record", "lora", "--preset", "micro", "--device", "cpu", "--batch-size", str(b),
                          "--output", str(tmp_path / f"b{b}"))
        assert recorded.returncode == 0, recorded.stdout + recorded.stderr
        [run] = breakdown([tmp_path / f"b{b}"]).runs.itertuples()
        assert run.status == "ok", run.reason
        measured[b] = run.measured_peak_bytes
    budget = parse_bytes(BUDGET)
    assert measured[largest] <= budget < measured[largest + 1], (measured, budget)
    # The checks fit made are the recordings' peaks, to within what the allocator's rounding moves (0.1%).
    for b, check in ((largest, batch["at"]), (largest + 1, batch["one_step_past"])):
        assert abs(check["peak_bytes"] - measured[b]) <= 0.001 * measured[b], (b, check["peak_bytes"], measured[b])
