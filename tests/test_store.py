import json

import pytest

from profkit import store
from profkit.store.manifest import RunRecord


def make_partial(root, run, status):
    partial = store.new_partial(root, run)
    partial.write_manifest(RunRecord(run=run, method=run, kind="train", settings={}, status=status).to_json())
    return partial


def test_complete_run_replaces_previous(tmp_path):
    store.commit(make_partial(tmp_path, "lora", "ok"), tmp_path, "lora")
    (tmp_path / "lora" / "old-file").write_text("x")
    store.commit(make_partial(tmp_path, "lora", "ok"), tmp_path, "lora")
    assert not (tmp_path / "lora" / "old-file").exists()
    assert [r.path.name for r in store.find_runs(tmp_path)] == ["lora"]


def test_failed_run_takes_empty_place_but_never_replaces_a_complete_one(tmp_path):
    store.commit(make_partial(tmp_path, "full", "oom"), tmp_path, "full")
    assert json.loads((tmp_path / "full" / "manifest.json").read_text())["status"] == "oom"
    store.commit(make_partial(tmp_path, "full", "ok"), tmp_path, "full")
    kept = store.commit(make_partial(tmp_path, "full", "failed"), tmp_path, "full")
    assert store.is_complete(tmp_path / "full")
    assert kept.path.parent.name == store.ATTEMPTS_DIR


def test_partial_directories_are_not_runs(tmp_path):
    partial = make_partial(tmp_path, "lora", "ok")
    assert store.find_runs(tmp_path) == []
    assert not store.is_run_dir(partial.path)


def test_a_users_directory_is_never_replaced(tmp_path):
    mine = tmp_path / "lora"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    try:
        store.commit(make_partial(tmp_path, "lora", "ok"), tmp_path, "lora")
    except store.NotARunError as exc:
        assert "not a profkit run directory" in str(exc)
    else:
        raise AssertionError("a directory that is not a run was replaced")
    assert (mine / "notes.txt").read_text() == "mine"


def _rank(status, reason=None):
    from profkit.store.manifest import RunRecord
    return RunRecord(run="r", method="lora_zero2", kind="train", settings={}, status=status, reason=reason)


@pytest.mark.parametrize("ranks, cause, status, named", [
    ({0: "ok", 1: "ok"}, None, "ok", None),
    ({0: "failed", 1: None}, None, "failed", 1),  # the rank that died without a record caused the other's error
    ({0: "failed", 1: "oom"}, None, "oom", 1),
    ({0: "interrupted", 1: "failed"}, None, "failed", 1),
    ({0: "failed", 1: "failed"}, 1, "failed", 1),  # the launcher's first observed failure wins
    ({0: "ok", 1: "incomplete"}, None, "incomplete", 1),
])
def test_a_run_of_ranks_is_ok_only_if_every_rank_is_and_names_the_cause(ranks, cause, status, named):
    from profkit.store.manifest import combine
    records = {k: (_rank(s, f"reason {k}") if s else None) for k, s in ranks.items()}
    run = combine(_rank("interrupted"), len(ranks), records, "no manifest", cause=cause)
    assert run.status == status and run.world_size == len(ranks)
    assert [r["status"] for r in run.ranks] == [s or "failed" for s in ranks.values()]
    if named is None:
        assert run.reason is None and run.complete
    else:
        assert run.reason.startswith(f"rank {named} of {len(ranks)}:") and not run.complete


@pytest.mark.parametrize("exc, status", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 4294967296 bytes. Error code 12 (Cannot allocate memory)"), "oom"),
    (RuntimeError("DefaultCPUAllocator: not enough memory: you tried to allocate 8 bytes."), "oom"),
    (MemoryError(), "oom"),
    (RuntimeError("shape mismatch"), "failed"),
    (KeyboardInterrupt(), "interrupted"),
])
def test_a_run_that_ran_out_of_host_memory_is_oom_not_failed(exc, status):
    from profkit.core.methods import UnsupportedError
    from profkit.record.outcome import classify

    assert classify(exc) == status
    assert classify(UnsupportedError("no GPU")) == "unsupported"
