"""The GPUs people train on: dense peak FLOP/s per precision, memory bandwidth and links, each figure from the
sources named in ``data/gpus/gpus.csv`` (a ``src_`` column beside each figure; SOURCES.md beside it says what
each source is and which it was preferred to where they disagree). Dense peaks only.
No torch.

A trace names its device in ``deviceProperties`` (``torch.cuda.get_device_name``'s string, SM count, compute
capability); ``from_trace`` matches the name, and where a name is new to the table, the SM count and compute
capability (an H100 SXM and PCIe differ by 132 and 114 SMs).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field

from profkit.core.bundled import bundled

TABLE = bundled("gpus") / "gpus.csv"
# Peak columns by the precision a GEMM runs at (core.work.PRECISION): dense, fp16/bf16 with fp32 accumulation
# (what PyTorch runs). fp32 is the CUDA cores' rate: PyTorch runs float32 matmuls without TF32 unless told to,
# and a trace does not say whether it was told.
PRECISION_COLUMNS = {"fp32": "fp32_tflops", "tf32": "tf32_tflops", "bf16": "bf16_tflops", "fp16": "fp16_tflops",
                     "fp8": "fp8_tflops", "int8": "int8_tops"}
# A x16 host link's bandwidth per direction by PCIe generation, GB/s.
PCIE_GB_S = {"Gen3": 16, "Gen4": 32, "Gen5": 64, "Gen6": 128}


@dataclass(frozen=True)
class Gpu:
    key: str  # what --gpu takes: "H100-SXM"
    vendor: str  # NVIDIA, AMD: whose libraries (cuBLAS, rocBLAS) reach what share of the peak
    names: tuple[str, ...]  # as torch.cuda.get_device_name and deviceProperties write them
    sms: int | None
    compute_capability: str
    memory_bytes: int
    bytes_per_s: float  # memory bandwidth
    tflops: dict[str, float]  # precision -> dense peak TFLOP/s (TOPS for int8)
    link_bytes_per_s: float | None  # GPU-to-GPU (NVLink / Infinity Fabric), per direction
    host_bytes_per_s: float | None  # host link (PCIe), per direction
    sources: dict[str, str] = field(default_factory=dict)

    def peak_flop_per_s(self, precision: str) -> float | None:
        value = self.tflops.get(precision)
        return value * 1e12 if value else None


class UnknownGpu(ValueError):
    pass


def _float(text: str) -> float | None:
    text = (text or "").strip()
    return float(text) if text else None


def _load() -> dict[str, Gpu]:
    gpus = {}
    with TABLE.open(newline="", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            tflops = {p: v for p, col in PRECISION_COLUMNS.items() if (v := _float(r.get(col, ""))) is not None}
            link = _float(r["nvlink_gbps"]) if r["nvlink_gbps"].strip() not in ("", "none") else None
            host = next((v for gen, v in PCIE_GB_S.items() if r["pcie_gen_and_gbps"].startswith(gen)), None)
            major, minor = r["kineto_computeMajor"].strip(), r["kineto_computeMinor"].strip()
            gpus[r["key"]] = Gpu(
                key=r["key"], vendor=r["vendor"], names=tuple(n.strip() for n in r["names_in_traces"].split("|") if n.strip()),
                sms=int(r["sm_count"]) if r["sm_count"].strip() else None,
                compute_capability=f"{major}.{minor}" if major else "",
                memory_bytes=int(float(r["memory_gib"]) * 2**30), bytes_per_s=float(r["memory_bandwidth_gbps"]) * 1e9,
                tflops=tflops, link_bytes_per_s=link / 2 * 1e9 if link else None,  # the table's is both directions
                host_bytes_per_s=host * 1e9 if host else None,
                sources={k.removeprefix("src_"): v for k, v in r.items() if k.startswith("src_") and v})
    return gpus


GPUS: dict[str, Gpu] = _load()


def find(key: str) -> Gpu:
    """The GPU ``key`` names (case and punctuation aside), or UnknownGpu listing the valid keys."""
    wanted = _normal(key)
    for gpu in GPUS.values():
        if _normal(gpu.key) == wanted or any(_normal(n) == wanted for n in gpu.names):
            return gpu
    raise UnknownGpu(f"unknown GPU {key!r}; valid GPUs: {', '.join(GPUS)}")


def _normal(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def from_trace(metadata: dict) -> tuple[Gpu | None, str]:
    """The device a trace ran on, and its name as the trace gives it ("" where it gives none). Where several
    kinds of device are listed, None: the trace does not say which one the kernels ran on."""
    props = metadata.get("deviceProperties")
    if not isinstance(props, list):
        return None, ""
    devices = {(str(p.get("name", "")), p.get("numSms"), p.get("computeMajor"), p.get("computeMinor"))
               for p in props if isinstance(p, dict)}
    if len(devices) != 1:
        return None, " / ".join(sorted(d[0] for d in devices))
    name, sms, major, minor = devices.pop()
    for gpu in GPUS.values():
        if name in gpu.names:
            return gpu, name
    if isinstance(sms, int) and isinstance(major, int):
        matches = [g for g in GPUS.values() if g.sms == sms and g.compute_capability == f"{major}.{minor}"]
        if len(matches) == 1:
            return matches[0], name
    return None, name
