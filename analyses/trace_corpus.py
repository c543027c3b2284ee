"""Category coverage on a corpus of other people's traces, with a held-out part.

The traces are gathered from public repositories (each directory has a MANIFEST.csv: file, repo, path, commit,
licence, gpu_or_vendor, workload, year, notes) and are not committed here; ``reports/corpus/traces.csv`` says
where each came from, so anyone can fetch them again.

    python analyses/trace_corpus.py split DIR [DIR ...]      # once, before any rule changes
    python analyses/trace_corpus.py coverage DIR [DIR ...] --label before|after [--held-out]

``split`` drops duplicate files (same bytes), puts traces of one run (or one model at different phases) in one
group, and holds out half of the groups, drawn with a fixed seed. ``coverage`` writes each trace's CPU and GPU
coverage (the share of the step's time not in ``other``) to ``reports/corpus/coverage-<label>.csv``; for the
tuning part it also lists the largest names left in ``other``. Held-out traces are analysed only with
``--held-out`` (and then only they are, and only their coverage is printed, never their names).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import random
import re
import sys
from pathlib import Path

from profkit.analyze import breakdown, views

OUT = Path(__file__).resolve().parent.parent / "reports" / "corpus"
SEED = 2026
# Traces of one run, or of one setup at different phases or on two vendors, go to the same side of the split.
SAME_RUN = [(re.compile(p), g) for p, g in [
    (r"mi300x.vllm.gptoss", "tracelens vLLM gpt-oss on MI300X"),
    (r"sglang.qwen3-8b", "tracelens SGLang Qwen3-8B on MI300X"),
    (r"sp-qwen3-30b", "tracelens SGLang Qwen3-30B-A3B decode"),
    (r"sp-deepseek-r1", "tracelens SGLang DeepSeek-R1 decode"),
    (r"nano-vllm", "nano-vllm Qwen3")]]
COLUMNS = ["file", "sha256", "group", "split", "repo", "path", "commit", "licence", "gpu_or_vendor", "workload",
           "year", "notes"]


def _manifest(dirs: list[Path]) -> list[dict]:
    rows, seen = [], set()
    for d in dirs:
        with open(d / "MANIFEST.csv", newline="") as fh:
            for row in csv.DictReader(fh):
                path = d / row["file"]
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                if digest in seen:
                    continue
                seen.add(digest)
                group = next((g for rx, g in SAME_RUN if rx.search(row["file"])), row["file"])
                rows.append({**row, "sha256": digest, "group": group, "where": path})
    return rows


def split(dirs: list[Path]) -> None:
    rows = _manifest(dirs)
    groups = sorted({r["group"] for r in rows})
    random.Random(SEED).shuffle(groups)
    held_out = set(groups[: len(groups) // 2])
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "traces.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, COLUMNS, extrasaction="ignore")
        w.writeheader()
        for r in sorted(rows, key=lambda r: r["file"]):
            w.writerow({**r, "split": "held-out" if r["group"] in held_out else "tuning"})
    n = sum(r["group"] in held_out for r in rows)
    print(f"{len(rows)} distinct traces in {len(groups)} groups: {len(rows) - n} tuning, {n} held out")


def coverage(dirs: list[Path], label: str, held_out: bool) -> None:
    splits = {r["sha256"]: r for r in csv.DictReader(open(OUT / "traces.csv", newline=""))}
    out = []
    for r in _manifest(dirs):
        known = splits.get(r["sha256"])
        if known is None:
            sys.exit(f"{r['file']} is not in {OUT / 'traces.csv'}: run split first")
        part = known["split"]
        if (part == "held-out") != held_out:
            continue
        bd = breakdown([r["where"]])
        row = {"file": r["file"], "split": part}
        if bd.runs.empty or bd.problems and any(p.fatal for p in bd.problems):
            row["problem"] = "; ".join(str(p) for p in bd.problems)[:200]
        else:
            run = bd.runs.iloc[0]
            row.update(coverage_cpu=run.coverage_cpu, coverage_gpu=run.coverage_gpu)
        out.append(row)
        shown = {k: (f"{v:.1%}" if isinstance(v, float) and v == v else v) for k, v in row.items()}
        print(shown)
        if part == "tuning" and "problem" not in row:
            other = views.explain(bd, "other")
            for _, o in other[other.share_of_step > 0.002].head(8).iterrows():
                print(f"    {o.resource} {o.share_of_step:6.1%}  {o['name'][:110]}")
    OUT.mkdir(parents=True, exist_ok=True)
    name = f"coverage-{label}{'-held-out' if held_out else ''}.csv"
    with open(OUT / name, "w", newline="") as fh:
        w = csv.DictWriter(fh, ["file", "split", "coverage_cpu", "coverage_gpu", "problem"])
        w.writeheader()
        w.writerows(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split")
    s.add_argument("dirs", nargs="+", type=Path)
    c = sub.add_parser("coverage")
    c.add_argument("dirs", nargs="+", type=Path)
    c.add_argument("--label", required=True)
    c.add_argument("--held-out", action="store_true")
    args = parser.parse_args()
    if args.command == "split":
        split(args.dirs)
    else:
        coverage(args.dirs, args.label, args.held_out)


if __name__ == "__main__":
    main()
