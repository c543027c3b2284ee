"""``profkit estimate`` against published measured peaks (``tests/data/published/peaks.csv``), written as a table
with each error to ``reports/estimate-vs-published/README.md``.

Usage: python analyses/estimate_vs_published.py
"""

from __future__ import annotations

from pathlib import Path

from profkit.published import compare

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "estimate-vs-published" / "README.md"


def main() -> None:
    table = compare(ROOT / "tests" / "data" / "published" / "peaks.csv")
    shown = table.assign(measured=(table.measured_bytes / 1e9).map("{:.2f} GB".format),
                         estimated=(table.estimated_bytes / 1e9).map("{:.2f} GB".format),
                         error=table.error.map("{:+.1%}".format))
    errors = table.error.abs()
    text = ["# profkit estimate against published measured peaks", "",
            "Every figure below was measured by others on real GPUs, with the settings given in "
            "`tests/data/published/peaks.csv` (source, model shape, method, precision, batch, sequence length, the "
            "counter and the unit). The estimate predicts allocated bytes (`max_memory_allocated`), the counter these "
            "sources report. Regenerate with `python analyses/estimate_vs_published.py`.", "",
            shown[["source", "model", "method", "batch_size", "seq_len", "measured", "estimated", "error"]]
            .to_markdown(index=False), "",
            f"Median absolute error {errors.median():.1%}; {(errors <= 0.2).mean():.0%} of the figures within 20%, "
            f"{(errors <= 0.1).mean():.0%} within 10%.", "",
            "Where they differ: the LoRA rows, whose setup the estimate models as run, are within 4%. The QLoRA "
            "rows are 12-14% high, and this is not explained: the estimate models peft's "
            "`prepare_model_for_kbit_training` (fp32 norms, embeddings and head, as Hugging Face users run QLoRA), "
            "which litgpt does not run; without it the estimate is about 19% low on the 7B nf4-dq row instead (11.16 "
            "against 13.84 GB), so litgpt's 4-bit layers hold about 2.7 GB that the estimate's model of a 4-bit "
            "layer does not. Finding which tensors needs a measurement on a GPU.", ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
