"""The predicted step time beside published, measured training throughputs (tests/data/published/throughput.csv).

Each figure with every setting the prediction needs stated becomes tokens per second per GPU, measured and
predicted (`profkit.predict.published_throughput`); the others keep the reason they are not predicted. The split
was drawn before the step-time model existed (analyses/published_throughput/README.md); the held-out rows are
compared only with `--held-out`, once, at the end. Writes reports/step-time/vs-published-{used,held-out}.{md,csv}.

A third set, `holdout-peft-comparison` (tests/data/published/throughput_peft_comparison.csv), from projects the first
table does not hold, was held out from every change to the model and compared once: `--peft-comparison`.

Usage: python analyses/step_time_vs_published.py [--held-out | --peft-comparison]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from profkit.predict.published_throughput import compare_throughput

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "published" / "throughput.csv"
PEFT_COMPARISON = TABLE.with_name("throughput_peft_comparison.csv")
OUT = ROOT / "reports" / "step-time"


def main() -> None:
    parser = argparse.ArgumentParser()
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--held-out", action="store_true")
    which.add_argument("--peft-comparison", action="store_true")
    args = parser.parse_args()
    split = "held-out" if args.held_out else "holdout-peft-comparison" if args.peft_comparison else "used"
    table = compare_throughput(PEFT_COMPARISON if args.peft_comparison else TABLE, TABLE.with_name("models.json"), split=split)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / f"vs-published-{split}.csv", index=False)
    done = table[table.reason == ""]
    lines = [f"# Predicted step time against published throughputs ({split} split)", "",
             f"Written by `analyses/step_time_vs_published.py`. {len(table)} figures; {len(done)} predicted "
             f"(every setting the prediction needs stated); the others keep their reason.", ""]
    if len(done):
        err = done.error.abs()
        lines += [f"- |error| of tokens per second per GPU: median {err.median():.1%}, p90 {err.quantile(0.9):.1%}; "
                  f"signed median {done.error.median():+.1%}.",
                  "- by source: " + "; ".join(f"{s.split(':')[0]} {len(g)} figures, median |error| "
                                               f"{g.error.abs().median():.1%}"
                                               for s, g in done.groupby(done.source.str.split(':').str[0])), ""]
        cols = ["model", "gpu_key", "n_gpus", "profkit_method", "batch", "seq_len", "unit",
                "measured_tokens_per_gpu_s", "predicted_tokens_per_gpu_s", "error", "bound"]
        lines += ["## Predicted", "", done[cols].to_markdown(index=False, floatfmt=".3g"), ""]
    reasons = table[table.reason != ""].reason.str.replace(r"\d+", "N", regex=True).value_counts()
    lines += ["## Not predicted, by reason", "", reasons.to_frame("figures").to_markdown(), ""]
    (OUT / f"vs-published-{split}.md").write_text("\n".join(lines))
    print("\n".join(lines[:8]))


if __name__ == "__main__":
    main()
