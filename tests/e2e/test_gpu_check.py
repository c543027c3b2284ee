"""The GPU check (``make gpu-check``) on CPU, end to end, so that it cannot rot before a GPU comes; its install
over a machine's preinstalled torch in a fresh venv; which carried wheels it installs."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "analyses" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gpu_check = _load()
DECLARED = {"torch": Requirement("torch>=2.11,<2.14"), "transformers": Requirement("transformers>=5.23,<6"),
            "bitsandbytes": Requirement("bitsandbytes>=0.50,<0.51")}


@pytest.mark.parametrize("file, installed, action, reason", [
    ("torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl", {}, "skip", "machine's own torch"),
    ("torch-2.13.0-cp312-cp312-manylinux_2_28_x86_64.whl", {"torch": "2.9.0"}, "skip", "machine's own torch"),
    ("transformers-5.23.0-py3-none-any.whl", {"transformers": "5.17.0"}, "install", "the machine has 5.17.0"),
    ("transformers-5.23.0-py3-none-any.whl", {"transformers": "5.24.1"}, "skip", "the machine has 5.24.1"),
    ("bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl", {}, "install", "missing"),
    ("hjson-3.1.0-py3-none-any.whl", {"hjson": "3.0.0"}, "skip", "the machine has 3.0.0"),
    ("deepspeed-0.19.8.tar.gz", {}, "install", "missing"),
])
def test_install_plan_installs_only_what_the_machine_lacks_and_never_torch(file, installed, action, reason):
    (row,) = gpu_check.install_plan([Path(file)], DECLARED, installed)
    assert row["action"] == action and reason in row["reason"]


def _wheel(tmp_path: Path, name: str, version: str, body: str, out: Path, python: Path) -> None:
    src = tmp_path / f"src-{name}"
    (src / name).mkdir(parents=True)
    (src / name / "__init__.py").write_text(body)
    (src / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "{version}"\n[build-system]\n'
                                        'requires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n')
    subprocess.run([str(python), "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
                    "-w", str(out), str(src)], check=True, capture_output=True)


@pytest.mark.long
def test_install_over_a_preinstalled_torch_in_a_fresh_venv(tmp_path):
    """A fresh venv stands in for the GPU machine: its packages, torch among them, preinstalled (this project's
    environment on its path). The check installs a missing carried wheel and profkit into its own folder, with
    --no-deps and no index; a carried torch is refused; the machine's torch stays what it was."""
    site_packages = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "torch").is_dir())
    machine = tmp_path / "machine"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(machine)], check=True)
    python = machine / "bin" / "python"
    own = Path(subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip())
    (own / "preinstalled.pth").write_text(f"{site_packages}\n")
    wheels = tmp_path / "wheels"
    _wheel(tmp_path, "probe_dep", "0.1", "VALUE = 1\n", wheels, python)
    _wheel(tmp_path, "torch", "99.0", "raise ImportError('a carried torch was installed')\n", wheels, python)

    site = tmp_path / "site"
    done = subprocess.run([str(python), str(ROOT / "analyses" / "gpu_check.py"), "install", "--wheels", str(wheels),
                           "--site", str(site)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "install probe_dep-0.1" in done.stdout and "skip    torch-99.0" in done.stdout
    probe = subprocess.run([str(python), "-c", "import json, torch, profkit, probe_dep; print(json.dumps("
                            "[torch.__version__, torch.__file__, profkit.__file__, probe_dep.__file__]))"],
                           capture_output=True, text=True, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
                           cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    version, torch_file, profkit_file, probe_file = json.loads(probe.stdout)
    import torch
    assert version == torch.__version__ and Path(torch_file).parent == Path(torch.__file__).parent
    assert Path(profkit_file).is_relative_to(site) and Path(probe_file).is_relative_to(site)
    # The installed copy works as a command, with its bundled data (the estimate's allocator table, the corpus).
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200"}
    methods = subprocess.run([str(python), "-m", "profkit", "methods"], capture_output=True, text=True, cwd=tmp_path,
                             env=env)
    assert methods.returncode == 0 and "qlora_zero3_gc" in methods.stdout, methods.stderr
    data = site / "profkit" / "data"
    assert (data / "allocator" / "reserved_over_allocated.csv").is_file() and (data / "tokenizer.json").is_file()


def test_trim_keeps_only_the_last_profiled_step(tmp_path):
    source = DATA / "gpu-traces" / "h100_qwen1.5-0.5b_hf_memory.json.gz"
    with gzip.open(source, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    steps = sorted((e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"])
    assert len(steps) >= 2
    out = gpu_check.trim_trace(source, tmp_path / "trimmed.json.gz")
    with gzip.open(out, "rt") as fh:
        kept = json.load(fh)["traceEvents"]
    last = steps[-1]
    timed = [e for e in kept if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    assert timed and all(last["ts"] <= e["ts"] <= last["ts"] + last["dur"] for e in timed)
    assert len(kept) < len(events)
    assert [e["name"] for e in kept if str(e.get("name", "")).startswith("ProfilerStep#")] == [last["name"]]


@pytest.mark.long
def test_gpu_check_end_to_end_on_cpu(matrix, engines, tmp_path):
    """The whole check as `make gpu-check` runs it, on CPU and micro, on a subset of its runs: runs already recorded
    are kept (resumable: LoRA, and the Trainer under DeepSpeed), a user loop under Session and a batch that cannot
    fit, which must end as oom, are recorded; then the checks, the overhead against a plain loop, the summary and
    the tarballs."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    shutil.copytree(matrix / "lora", runs / "lora")  # runs the suite recorded already are kept, not recorded again
    shutil.copytree(engines / "lora_zero2-trainer", runs / "lora_zero2-trainer")
    code = gpu_check.main(["--device", "cpu", "--preset", "micro", "--part", "all", "--only", "lora",
                           "lora_zero2-trainer", "user-loop", "oom/lora", "--overhead-rounds", "1", "--no-install",
                           "--runs", str(runs), "--out", str(out)])
    summary = json.loads((out / "summary-all.json").read_text())
    failed = [(r["run"], c) for r in summary["runs"] for c in r["checks"] if not c["ok"]]
    assert code == 0 and not failed, failed
    by_run = {r["run"]: r for r in summary["runs"]}
    assert set(by_run) == {"lora", "lora_zero2-trainer", "user-loop", "oom/lora"}
    assert by_run["lora"]["record_wall_s"] == 0 and by_run["lora_zero2-trainer"]["record_wall_s"] == 0
    assert by_run["oom/lora"]["status"] == "oom" and "can't allocate memory" in by_run["oom/lora"]["reason"]
    for name in ("lora", "lora_zero2-trainer", "user-loop"):
        r = by_run[name]
        assert r["status"] == "ok"
        assert 0 <= r["memory"]["unattributed_share_of_peak"] < 0.05
        assert r["memory"]["by_category_at_peak"]["parameters_trainable"] > 0
        assert {p["category"] for p in r["predicted"]} >= {"parameters_trainable", "optimizer_state", "peak"}
        assert r["time"]["clean_step_s"] > 0 and r["time"]["coverage_cpu"] > 0.5
    assert summary["environment"]["torch"] and summary["environment"]["gpu"] is None
    assert all(row["in_range"] for row in summary["environment"]["requirements"] if row["name"] == "torch")
    (overhead,) = summary["overhead"]
    # a figure, not a timed test: its size is the benchmark's business (one round on a shared machine is noise)
    assert overhead["method"] == "lora" and overhead["ratio"] > 0 and overhead["plain_step_s"] > 0, overhead
    tarballs = sorted(out.glob("runs-all-*.tar.gz"))
    assert tarballs and all(t.stat().st_size <= gpu_check.PACK_LIMIT_BYTES for t in tarballs)
    members = {m for t in tarballs for m in tarfile.open(t).getnames()}
    assert {f"{r}/manifest.json" for r in by_run} <= members
    assert "| oom/lora | oom |" in (out / "summary-all.md").read_text()

    reports = tmp_path / "reports"
    assert gpu_check.collect([out], reports) == 0
    assert json.loads((reports / "summary.json").read_text())[0]["part"] == "all"


def test_a_deadline_keeps_what_was_recorded(matrix, tmp_path):
    """On the first GPU each part ran past its time limit and wrote nothing. With --deadline-s no run starts past
    it: a run recorded earlier is still kept and checked, one not started is listed as such, the summary and the
    tarball are written, and the exit code says the check is incomplete."""
    runs, out = tmp_path / "runs", tmp_path / "out"
    shutil.copytree(matrix / "lora", runs / "lora")
    code = gpu_check.main(["--device", "cpu", "--preset", "micro", "--part", "train", "--only", "lora", "full",
                           "--overhead-rounds", "1", "--no-install", "--deadline-s", "0", "--pack-files", "1",
                           "--runs", str(runs), "--out", str(out)])
    assert code == 1
    summary = json.loads((out / "summary-train.json").read_text())
    by_run = {r["run"]: r for r in summary["runs"]}
    assert by_run["lora"]["status"] == "ok" and all(c["ok"] for c in by_run["lora"]["checks"])
    assert by_run["full"]["status"] is None and by_run["full"]["record_wall_s"] is None
    assert by_run["full"]["checks"][0] == {"check": "recorded before the deadline", "ok": False,
                                           "detail": "not started: --deadline-s 0 came first"}
    assert [o["method"] for o in summary["overhead"]] == ["full", "lora"]
    assert all("deadline" in o["error"][0] for o in summary["overhead"])
    assert [t.name for t in out.glob("runs-*.tar.gz")] == ["runs-train-1.tar.gz"]


@pytest.mark.long
def test_a_run_in_flight_at_the_deadline_is_stopped_and_kept_as_interrupted(tmp_path):
    """On the H100 an inference run sat in torch's memory-timeline export past the device call's limit, and the
    call brought nothing back. A run still recording at --deadline-s is stopped as Ctrl-C would stop it: committed
    as interrupted with the phases it finished, then checked and packed. (Half a second: no worker has imported
    torch by then, so the run is always in flight.)"""
    runs, out = tmp_path / "runs", tmp_path / "out"
    t0 = time.perf_counter()
    code = gpu_check.main(["--device", "cpu", "--preset", "micro", "--part", "train", "--only", "full",
                           "--overhead-rounds", "0", "--no-install", "--deadline-s", "0.5", "--pack-files", "1",
                           "--runs", str(runs), "--out", str(out)])
    assert code == 1 and time.perf_counter() - t0 < 120
    (run,) = json.loads((out / "summary-train.json").read_text())["runs"]
    assert run["status"] == "interrupted" and run["phases_done"] is not None
    assert "phases done" in run["checks"][0]["detail"] and not run["checks"][0]["ok"]
    assert (runs / "full" / "manifest.json").is_file()


def test_the_fit_part_holds_fits_answer_to_recordings_at_it_and_past_it(tmp_path):
    """The fit part on CPU and micro, for one method: fit's largest batch for the CPU's budget, recorded at it and one
    past it with the recorded peak standing in for the device; its summary merges with the others'."""
    out = tmp_path / "out"
    code = gpu_check.main(["--device", "cpu", "--preset", "micro", "--part", "fit", "--only", "lora", "--no-install",
                           "--runs", str(tmp_path / "runs"), "--out", str(out)])
    summary = json.loads((out / "summary-fit.json").read_text())
    [row] = summary["fit"]
    assert code == 0 and row["verdict"] == "agrees", row
    at, past = row["recorded"]
    assert (at["batch"], past["batch"]) == (row["largest"], row["largest"] + 1)
    assert at["measured_peak_bytes"] <= row["room_bytes"] < past["measured_peak_bytes"]
    assert "| lora | 18 |" in (out / "summary-fit.md").read_text()
    assert gpu_check.collect([out], tmp_path / "reports") == 0
    assert "part fit" in (tmp_path / "reports" / "summary.md").read_text()
    # On the CPU no limit is set: the run runs, and its peak against the room says it does not fit.
    small = gpu_check.fit_recording("lora", "micro", "cpu", 2, 1 << 20, tmp_path / "small")
    assert small["status"] == "ok" and not small["fits"]
