"""The estimator's meta-device stand-ins (autocast, CUDA's dropout) against PyTorch's own CUDA kernels, over every
causal-LM architecture the installed transformers knows: each default config shrunk to two layers, one training
forward (loss included) of full fine-tuning in bf16-mixed and of QLoRA without the fp32 upcast, what it saves for
backward (the weights apart) under the stand-in on meta and under real CUDA autocast on fake CUDA tensors
(``profkit.model.fake_cuda``). Eager attention in both: the fused kernels are the stand-in's other part, which this
cannot check without a GPU. Written to ``reports/estimate-vs-published/autocast-stand-in.md``.

Usage: python analyses/autocast_stand_in.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from profkit.core.methods import get_method, with_overrides
from profkit.core.quiet import library_output
from profkit.model.build import meta_model, shrunk_default_config
from profkit.model.fake_cuda import on_fake_device, real_autocast, saved_by, saved_bytes
from profkit.predict.stand_ins import TargetDevice, contiguous_batches

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "estimate-vs-published" / "autocast-stand-in.md"
METHODS = {"full": dict(precision="bf16-mixed", attention="eager"),
           "qlora": dict(precision="bf16-mixed", attention="eager", kbit_upcast=False)}


def forward_saves(model, device: str) -> int:
    batch = torch.zeros(1, 16, dtype=torch.long, device=device)
    with contiguous_batches():
        return saved_bytes(saved_by(lambda: model(input_ids=batch, labels=batch),
                                    [*model.parameters(), *model.buffers()]))


def compare(model_type: str, method: str) -> dict:
    row = {"model_type": model_type, "method": method}
    try:
        with library_output():
            config = shrunk_default_config(model_type)
            model, _, _ = meta_model(with_overrides(get_method(method), **METHODS[method]), config, "cuda",
                                     torch.bfloat16)
            with TargetDevice("cuda", torch.bfloat16):
                row["stand_in_bytes"] = forward_saves(model, "meta")
            with FakeTensorMode(allow_non_fake_inputs=True) as mode, real_autocast("cuda"):
                row["real_autocast_bytes"] = forward_saves(on_fake_device(model, mode), "cuda")
    except Exception as exc:  # a model the meta device, fake tensors or peft cannot run: named, not compared
        row["not_compared"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:90]}"
    return row


def main() -> None:
    # transformers asks a GPU's compute capability before a grouped matmul; the answer is an H100's
    torch.cuda.get_device_capability = lambda device=None: (9, 0)
    frame = pd.DataFrame([compare(t, m) for t in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) for m in METHODS])
    done = frame.dropna(subset=["stand_in_bytes"]).copy()
    done["difference"] = done.stand_in_bytes / done.real_autocast_bytes - 1
    off = done[done.difference.abs() > 0.001].sort_values("difference", key=abs, ascending=False)
    lines = [
        "# The estimator's stand-ins against PyTorch's CUDA kernels, every architecture",
        "",
        __doc__.split("Usage:")[0].strip().replace("\n", " "),
        "",
        f"- compared: {len(done)} of {len(frame)} (architecture, method) pairs; equal to the byte: "
        f"{(done.difference == 0).sum()}; within 0.1%: {(done.difference.abs() <= 0.001).sum()}; "
        f"within 1%: {(done.difference.abs() <= 0.01).sum()}",
        f"- median |difference| {done.difference.abs().median():.2%}, largest {done.difference.abs().max():.1%}",
        "",
        "## Pairs that differ by more than 0.1%",
        "",
        off.assign(difference=off.difference.map("{:+.1%}".format),
                   stand_in_MB=(off.stand_in_bytes / 1e6).map("{:,.1f}".format),
                   real_autocast_MB=(off.real_autocast_bytes / 1e6).map("{:,.1f}".format))[
            ["model_type", "method", "stand_in_MB", "real_autocast_MB", "difference"]].to_markdown(index=False)
        if len(off) else "none",
        "",
        "## Not compared, by reason",
        "",
        frame.not_compared.dropna().value_counts().rename_axis("reason").reset_index(name="pairs").to_markdown(
            index=False),
        "",
    ]
    OUT.write_text("\n".join(lines))
    print("\n".join(lines[:7]))


if __name__ == "__main__":
    main()
