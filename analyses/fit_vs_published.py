"""``profkit fit``'s boundary against published ones (``tests/data/published/boundaries.csv``): the setting a
source ran and, where it says so, the next one that ran out of memory, from 14 sources split ``used``/``held-out``
by source before any was estimated (``boundaries_SOURCES.md``). Each side is estimated in full against the GPU it
ran on, with no margin; the estimate agrees where it fits at the first and not at the second, i.e. the boundary
``fit`` finds lies within the source's own step. Written to ``reports/fit-vs-published/boundaries-<split>.md`` and
``.csv``.

Usage: python analyses/fit_vs_published.py <split>   (used or held-out)
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from profkit.configs.models import find_config
from profkit.predict.published_boundaries import VERDICTS, compare_boundaries

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests" / "data" / "published" / "boundaries.csv"
OUT = ROOT / "reports" / "fit-vs-published"


def _sides(row) -> str:
    return ("both" if pd.notna(row.fits_value) and pd.notna(row.oom_value)
            else "ran only" if pd.notna(row.fits_value) else "ran out only")


def main(split: str) -> None:
    table = compare_boundaries(TABLE, split=split, find_model=find_config,
                               progress=lambda text: print(text, file=sys.stderr, flush=True))
    table["sides"] = table.apply(_sides, axis=1)
    decided = table[table.verdict.isin(VERDICTS[:3])]
    counts = decided.groupby("sides").verdict.value_counts().unstack(fill_value=0)
    agree = (decided.verdict == VERDICTS[0])
    text = [f"# profkit fit against published boundaries: `{split}`", "",
            f"{len(table)} boundaries; {len(decided)} estimated on both of their stated sides; "
            f"{(table.verdict == VERDICTS[3]).sum()} undecided (the verdict turns on a setting the source does not "
            f"state); {(table.verdict == VERDICTS[4]).sum()} not estimated, each with its reason. Each side is "
            "estimated in full against the GPU it ran on with no margin: the step replayed through the caching "
            "allocator with the room the device has. Regenerate with "
            f"`python analyses/fit_vs_published.py {split}`.", "",
            f"- agrees (fits where the source ran, not where it ran out): {agree.sum()} of {len(decided)}"
            + (f" ({agree.mean():.0%})" if len(decided) else ""),
            f"- of those with both sides stated (the boundary within the source's step): "
            f"{agree[decided.sides == 'both'].sum()} of {(decided.sides == 'both').sum()}", "",
            "## Verdicts by the sides a row states", "",
            counts.to_markdown() if len(counts) else "none", "",
            "## Each boundary", "",
            table[["project", "model", "profkit_method", "varied", "fits_value", "oom_value", "gpu", "world_size",
                   "peak_at_fits_gb", "peak_at_oom_gb", "verdict"]].to_markdown(index=False), ""]
    reasons = table[table.verdict == VERDICTS[4]].reason.str.replace(r"\(.*", "", regex=True).str.strip()
    if len(reasons):
        text += ["## Not estimated, by reason", "", reasons.value_counts().rename("boundaries").to_markdown(), ""]
    assumed = table[table.assumed != ""].assumed.value_counts()
    if len(assumed):
        text += ["## Assumptions taken", "", assumed.rename("boundaries").to_markdown(), ""]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"boundaries-{split}.md").write_text("\n".join(text))
    table.to_csv(OUT / f"boundaries-{split}.csv", index=False)
    print("\n".join(text[:8]))


if __name__ == "__main__":
    wanted = sys.argv[1] if len(sys.argv) > 1 else "used"
    splits = sorted(set(pd.read_csv(TABLE, usecols=["split"], dtype=str).split))
    if wanted not in splits:
        sys.exit(f"unknown split {wanted!r}: valid values are {', '.join(splits)}")
    main(wanted)
