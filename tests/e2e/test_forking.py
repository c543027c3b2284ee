"""A worker forked from the preloaded server runs as a fresh one would: in the working directory and with the
environment of the command that asked for it, each method in a process of its own."""

from __future__ import annotations

import json

from profkit import store
from tests.conftest import FAST, invoke


def test_a_forked_worker_runs_where_and_as_the_command_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # Read by the worker at run time: the preset's checkpoint cache moves with the environment of each command.
    monkeypatch.setenv("PROFKIT_CACHE", str(tmp_path / "cache"))
    result = invoke("record", "lora", "full", *FAST, "-o", "relative-traces")
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("lora", "full"):
        run = tmp_path / "relative-traces" / name
        assert store.is_complete(run), (run / store.LOG).read_text()[-2000:]
        assert json.loads((run / "manifest.json").read_text())["status"] == "ok"
    assert any((tmp_path / "cache").iterdir())  # the micro checkpoint was materialized where this command said
