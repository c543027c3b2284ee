"""Profiling a user's own training: ``profkit.Session`` in a hand-written loop, ``profkit.TrainerCallback``
in a Hugging Face Trainer (with and without DeepSpeed), and ``profkit record --engine trainer``; then the
same analysis as for profkit's own runs. Figures are checked against counts taken from the models."""

from __future__ import annotations


import pytest
import torch


@pytest.mark.parametrize("frozen, trainable, autocast, expected", [
    (torch.float32, torch.float32, torch.bfloat16, "bf16-amp"),  # a model loaded without a dtype, under autocast
    (torch.bfloat16, torch.float32, torch.bfloat16, "bf16-mixed"),  # the frozen base in bf16 (the registry's)
    (None, torch.float32, torch.float16, "fp16-mixed"),  # full fine-tuning: nothing frozen
    (torch.float32, torch.float32, None, "fp32"),
    (torch.bfloat16, torch.bfloat16, None, "bf16-pure"),
    (torch.bfloat16, torch.float32, None, None),  # half weights, fp32 adapters, no autocast: no registry name
])
def test_the_precision_is_read_from_the_weights_and_the_autocast_the_forward_ran_under(frozen, trainable, autocast,
                                                                                        expected):
    model = torch.nn.Sequential(torch.nn.Linear(2, 2).to(trainable), torch.nn.Linear(2, 2))
    if frozen is None:
        model[1].to(trainable)
    else:
        model[1].to(frozen).requires_grad_(False)
    from profkit.record.describe import precision_of
    assert precision_of(model, autocast) == expected


def test_the_profilers_export_is_not_run_past_its_event_limit(tmp_path):
    """torch's memory-timeline export grows faster than its events (an H100 inference cycle ran it for over 6
    minutes): past the limit it is not run, and the reason names the count; under it, the timeline is written."""
    from torch.profiler import profile as Profile

    from profkit.record.session import export_memory_timeline

    with Profile(profile_memory=True, record_shapes=True, with_stack=True) as p:
        x = torch.ones(64, 64, requires_grad=True)
        (x @ x).sum().backward()
    events = len(p.profiler.kineto_results.events())
    skipped, written = tmp_path / "skipped.raw.json.gz", tmp_path / "written.raw.json.gz"
    reason = export_memory_timeline(p, skipped, "cpu", max_events=events - 1)
    assert reason is not None and f"{events:,} profiler events" in reason and not skipped.exists()
    assert export_memory_timeline(p, written, "cpu", max_events=events) is None and written.stat().st_size > 0
