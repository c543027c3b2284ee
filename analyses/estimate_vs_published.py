"""``profkit estimate`` against published measured peaks (``tests/data/published/peaks.csv``), written as a table
with each error to ``reports/estimate-vs-published/README.md``.

Usage: python analyses/estimate_vs_published.py
"""

from __future__ import annotations

from pathlib import Path

from profkit.predict.published import compare

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "reports" / "estimate-vs-published" / "README.md"


def main() -> None:
    table = compare(ROOT / "tests" / "data" / "published" / "peaks.csv")
    shown = table.assign(measured=(table.measured_bytes / 1e9).map("{:.2f} GB".format),
                         estimated=(table.estimated_bytes / 1e9).map("{:.2f} GB".format),
                         error=table.error.map("{:+.1%}".format))

    def summary(rows) -> str:
        e = rows.error.abs()
        return (f"median absolute error {e.median():.1%}; {(e <= 0.2).mean():.0%} within 20%, "
                f"{(e <= 0.1).mean():.0%} within 10% ({len(rows)} figures)")

    text = ["# profkit estimate against published measured peaks", "",
            "Every figure below was measured by others on real GPUs, with the settings given in "
            "`tests/data/published/peaks.csv` (source, method, precision, batch, sequence length, new tokens, the "
            "counter and the unit) and the model configurations in `tests/data/published/models.json`. The "
            "estimate's peak is allocated bytes (`max_memory_allocated`), the counter these sources report. "
            "`split`: `used`, the figures the estimator was built against; `holdout`, figures checked only after it "
            "was built, never tuned to. Regenerate with `python analyses/estimate_vs_published.py`.", "",
            shown[["split", "model", "kind", "method", "batch_size", "seq_len", "measured", "estimated", "error"]]
            .to_markdown(index=False), "",
            f"- all: {summary(table)}",
            f"- used: {summary(table[table.split == 'used'])}",
            f"- holdout: {summary(table[table.split == 'holdout'])}", "",
            "Where they differ:", "",
            "- LoRA training (Llama 2 and phi-1.5): within 4%, low.",
            "- QLoRA training is 11-14% high on both architectures, and this is not explained: the estimate models "
            "peft's `prepare_model_for_kbit_training` (fp32 norms, embeddings and head, as Hugging Face users run "
            "QLoRA), which litgpt does not run; without it the estimate is about 19% low on the Llama 2 7B nf4-dq "
            "row instead (11.16 against 13.84 GB), so litgpt's 4-bit layers hold about 2.7 GB that the estimate's "
            "model of a 4-bit layer does not. Finding which tensors needs a measurement on a GPU.",
            "- Generation in 16 bits: within 0.5% (weights dominate at a 8-token prompt and 50 new tokens).",
            "- Generation in 4 bits: 1-7% low on the Llama models, 18-19% low on phi-1.5. The shortfall is close to "
            "the output layer's size in bf16 each time (7B 0.31 GB against 0.26 GB; 13B 0.37 against 0.33; 34B and "
            "70B 0.37-0.42 against 0.52; phi-1.5 0.25 against 0.21); if litgpt quantizes that layer too, as its "
            "bitsandbytes plugin does by default with every Linear layer, the gap is larger still. `max_memory_allocated` covers the whole process, loading "
            "included, so a weight held in 16 bits while the checkpoint is quantized on load would show as this; "
            "not verified without a GPU.",
            "- phi-1.5's activation is configured as the fused tanh GELU (`gelu_pytorch_tanh`), which is what litgpt "
            "computes. This was set after the first comparison showed the training rows 22-40% high with "
            "transformers' `gelu_new` (composed of elementwise ops that each save a tensor for backward): a "
            "difference between the two implementations of the same model, which the estimate reproduces (2.5-4% "
            "low with the fused form), not a parameter fitted to the figures.", ""]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(text))
    print("\n".join(text))


if __name__ == "__main__":
    main()
