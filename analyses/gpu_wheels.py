"""Download what the GPU machine lacks into ``.gpu/wheels`` (``make gpu-wheels``; run where the registry is reached).

The GPU machine reaches no registry, and what it needs travels with the working tree (64 MiB in all). Its
image holds torch 2.11 (CUDA 13) and most of profkit's libraries; what it lacks, or holds at a version outside
profkit's declared range, is resolved here for its Python (3.12, x86-64 manylinux): profkit's requirements and,
recursively, their own, each skipped where the machine's copy will do. ``gpu_check.py`` then installs only
those the machine really lacks (it checks there).

bitsandbytes' wheel (43 MB) carries one native library per CUDA, ROCm and XPU release; only the CPU library and
those for the machine's CUDA major release are kept (about 3 MB), which is what lets it travel beside the project.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / ".gpu" / "wheels"
PYTHON = "3.12"
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "any"]
CUDA_MAJOR = "13"  # the machine's torch is a CUDA 13.0 build
# The machine's image (the device tool's KINDS.md, package list read 2026-11-17; versions where it gives them).
MACHINE = {name: None for name in """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13
nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless
optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core
scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson
six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl
tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision
tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug
wheel wrapt xarray xxhash yarl zipp""".split()}
MACHINE.update({"torch": "2.11.0", "transformers": "5.17.0", "accelerate": "1.15.0", "tokenizers": "0.23.2",
                "huggingface-hub": "1.33.0", "safetensors": "0.8.0", "numpy": "2.5.2"})
# Needed only by commands the GPU check does not run.
# On the machine at a version its list does not give, and used by every command: carried all the same, so that
# gpu_check.py can install them there if the machine's turn out to be out of profkit's range.
CARRIED_UNLESS_KNOWN = {"pandas", "typer", "rich"}
NOT_CARRIED = {"viztracer": "profkit view only", "torch-tb-profiler": "profkit view --tensorboard only",
               "traceinsight": "the benchmarks against HTA only"}
SOURCE_ONLY = {"deepspeed"}  # published as source: built on the machine against its torch


def _target_environment() -> dict:
    env = default_environment()
    env.update(python_version=PYTHON, python_full_version=f"{PYTHON}.3", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", implementation_name="cpython")
    return env


def _download(req: Requirement, into: Path) -> Path:
    before = set(into.iterdir())
    if canonicalize_name(req.name) in SOURCE_ONLY:
        cmd = ["download", "--no-deps", "--no-binary", ":all:"]
    else:
        cmd = ["download", "--no-deps", "--only-binary", ":all:", "--python-version", PYTHON, "--implementation", "cp",
               *[arg for p in PLATFORMS for arg in ("--platform", p)]]
    subprocess.run([sys.executable, "-m", "pip", *cmd, "--quiet", "-d", str(into), str(req)], check=True)
    new = sorted(set(into.iterdir()) - before)
    if not new:  # already there from an earlier call
        name = canonicalize_name(req.name)
        new = [p for p in into.iterdir() if canonicalize_name(re.split(r"-\d", p.name, maxsplit=1)[0]) == name]
    return new[0]


def _requires(path: Path) -> list[Requirement]:
    if not path.name.endswith(".whl"):
        return []  # an sdist's needs are read from its own requirements when it is built; named by hand below
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    env = _target_environment()
    out = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                out.append(req)
    return out


# DeepSpeed's runtime needs (its requirements/requirements.txt), as its sdist does not list them in metadata.
DEEPSPEED_NEEDS = ["einops", "hjson", "msgpack", "ninja", "numpy", "packaging>=20.0", "psutil", "py-cpuinfo",
                   "pydantic>=2.0.0", "tqdm"]


def resolve(into: Path) -> list[str]:
    """Download every requirement the machine lacks, recursively; returns what was decided, one line each."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    queue = [Requirement(d) for d in deps]
    done: dict[str, Path] = {}
    log = []
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in done:
            continue
        have = MACHINE[name] if name in MACHINE else "absent"
        if name in NOT_CARRIED:
            log.append(f"not carried: {name} ({NOT_CARRIED[name]})")
            continue
        if name in CARRIED_UNLESS_KNOWN and have is None:
            have = "unknown"
        elif have != "absent" and (have is None or req.specifier.contains(have, prereleases=True)):
            continue  # the machine's copy will do (gpu_check checks the version there)
        if name == "torch":
            log.append(f"not carried: torch (the machine's {have} is used; profkit declares {req.specifier})")
            continue
        path = _download(req, into)
        done[name] = path
        why = {"absent": "absent on the machine", "unknown": "the machine's version is not known here"}.get(
            have, f"the machine has {have}")
        log.append(f"carried: {path.name} ({why})")
        queue += _requires(path) + ([Requirement(r) for r in DEEPSPEED_NEEDS] if name == "deepspeed" else [])
    return log


# What each carried wheel can leave behind: the working tree and the wheels travel together, 64 MiB in all.
# bitsandbytes: the native libraries of other CUDA majors, ROCm and XPU (43 MB -> 7 MB); pandas: its own test
# suite (12 MB -> about 8 MB), which nothing imports.
PRUNED = {
    "bitsandbytes": lambda n: bool(re.search(r"libbitsandbytes_\w+\.so$", n))
    and not re.search(rf"libbitsandbytes_(cpu|cuda{CUDA_MAJOR}\d*)\.so$", n),
    "pandas": lambda n: n.startswith("pandas/tests/"),
}
TRAVEL_LIMIT_BYTES = 64 << 20


def prune_wheel(wheel: Path, drop) -> Path:
    """The wheel without the members ``drop`` selects; RECORD rewritten to match."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / wheel.name
        with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
            names = [n for n in src.namelist() if not drop(n)]
            record = next(n for n in names if n.endswith(".dist-info/RECORD"))
            lines = []
            for name in names:
                if name == record:
                    continue
                data = src.read(name)
                dst.writestr(src.getinfo(name), data)
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
                lines.append(f"{name},sha256={digest},{len(data)}")
            dst.writestr(record, "\n".join(lines + [f"{record},,"]) + "\n")
        before = wheel.stat().st_size
        out.replace(wheel)
    print(f"{wheel.name.split('-')[0]}: {before / 1e6:.1f} MB -> {wheel.stat().st_size / 1e6:.1f} MB (pruned)")
    return wheel


def travelling_bytes() -> int:
    """What travels beside the wheels: the working tree's tracked and untracked, not ignored, files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / n.decode()).stat().st_size for n in listed if n and (ROOT / n.decode()).is_file())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, default=TARGET)
    args = parser.parse_args()
    args.target.mkdir(parents=True, exist_ok=True)
    for line in resolve(args.target):
        print(line)
    for name, drop in PRUNED.items():
        for wheel in args.target.glob(f"{name}-*.whl"):
            prune_wheel(wheel, drop)
    total = sum(p.stat().st_size for p in args.target.iterdir())
    tree = travelling_bytes()
    print(f"{args.target}: {len(list(args.target.iterdir()))} files, {total / 2**20:.1f} MiB; with the working "
          f"tree ({tree / 2**20:.1f} MiB) {(total + tree) / 2**20:.1f} MiB of the {TRAVEL_LIMIT_BYTES >> 20} MiB "
          "that travel")
    if total + tree > TRAVEL_LIMIT_BYTES:
        print("too large to travel: carry fewer wheels or make the working tree smaller", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
