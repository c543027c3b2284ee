"""``profkit estimate`` against the wide published set (``tests/data/published/wide.csv``): 437 measured GPU peaks from
13 projects, split by project into ``used`` and ``holdout``, and further held-out splits, each from sources none of
the other splits cite. The split column holds each figure's split; what each held out from, its size and the
disclosures are in ``reports/estimate-vs-published/wide.md``, the sources in ``wide-sources.md``. Written to
``reports/estimate-vs-published/wide-<split>.md`` and ``.csv``.

Usage: python analyses/estimate_vs_published_wide.py <split>   (a value of wide.csv's split column)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from profkit.predict.published import compare_wide

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "published" / "wide.csv"
OUT = ROOT / "reports" / "estimate-vs-published"


def summary(rows: pd.DataFrame) -> str:
    if rows.empty:
        return "none"
    e = rows.error.abs()
    return (f"median |error| {e.median():.1%}, p90 {e.quantile(0.9):.1%}; {(e <= 0.1).mean():.0%} within 10%, "
            f"{(e <= 0.2).mean():.0%} within 20% ({len(rows)} figures)")


def main(split: str) -> None:
    table = compare_wide(TABLE, split=split)
    estimated = table[table.error.notna()]
    consistent = estimated[estimated.measured_bytes >= estimated.static_bytes]
    below = estimated[estimated.measured_bytes < estimated.static_bytes]
    shown = estimated.assign(measured=(estimated.measured_bytes / 1e9).map("{:.2f}".format),
                             estimated=(estimated.estimated_bytes / 1e9).map("{:.2f}".format),
                             static=(estimated.static_bytes / 1e9).map("{:.2f}".format),
                             error=estimated.error.map("{:+.1%}".format))
    reasons = table[table.error.isna()].reason.str.replace(r"\(.*", "", regex=True).str.strip().value_counts()
    text = [f"# profkit estimate against the wide published set: `{split}` figures", "",
            f"{len(table)} figures; {len(estimated)} estimated; {len(table) - len(estimated)} not, each with its "
            "reason. Bytes in GB (1e9). The estimate is compared with the counter each source reports: allocated "
            "(`max_memory_allocated`, torchtune's `active_bytes.all.peak`, and `unknown`, which these projects' "
            "printing code most often reads), reserved (`max_memory_reserved`: the allocated peak plus what the "
            "caching allocator's policy reserves when the step is replayed through it, or a measured ratio where "
            "the step is not replayed) or nvidia-smi (reserved plus the CUDA context and NCCL's buffers). `static`: the least any run with the stated settings holds "
            "(weights, gradients, optimizer state, counted exactly); a figure under it contradicts its own "
            "settings and is reported apart. Regenerate with "
            f"`python analyses/estimate_vs_published_wide.py {split}`.", "",
            f"- every estimated figure: {summary(estimated)}",
            f"- figures consistent with their stated settings: {summary(consistent)}",
            f"- figures below the static memory of their stated settings: {len(below)}", ""]
    for counter, rows in consistent.groupby("counter"):
        text.append(f"- counter `{counter}`: {summary(rows)}")
    text += ["", "## Estimated", "",
             shown[["project", "model", "method", "batch_size", "seq_len", "world_size", "counter", "measured",
                    "estimated", "static", "error"]].to_markdown(index=False), "",
             "## Not estimated, by reason", "", reasons.rename("figures").to_markdown(), ""]
    assumed = estimated[estimated.assumed != ""].assumed.value_counts()
    if len(assumed):
        text += ["## Assumptions taken (settings the source did not state exactly)", "",
                 assumed.rename("figures").to_markdown(), ""]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"wide-{split}.md").write_text("\n".join(text))
    table.to_csv(OUT / f"wide-{split}.csv", index=False)
    print("\n".join(text[:12]))


if __name__ == "__main__":
    wanted = sys.argv[1] if len(sys.argv) > 1 else "used"
    splits = sorted(set(pd.read_csv(TABLE, usecols=["split"], dtype=str).split))
    if wanted not in splits:
        sys.exit(f"unknown split {wanted!r}: valid values are {', '.join(splits)}")
    main(wanted)
