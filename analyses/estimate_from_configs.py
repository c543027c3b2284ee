"""Published peaks estimated from the config file that produced them, beside the estimate from wide.csv's hand-set
columns: litgpt's config_hub tables (tests/data/configs/published-litgpt: each row's YAML at the commit that
published its peak). The estimate from the file is given only what a user has: the YAML (``--config``), the
checkpoint's config.json (``--model``: the model's configuration from models.json) and the library versions the
source states (``--stack``: bitsandbytes where its pyproject pinned it). Written to
reports/estimate-vs-published/from-configs.md and .csv, the used rows and the held-out rows apart.

Usage: python analyses/estimate_from_configs.py
"""

from __future__ import annotations

import csv
import json
import re
import tempfile
from pathlib import Path

import pandas as pd

from profkit.configs.plan import plan
from profkit.core.settings import RunSettings
from profkit.core.stack import Stack
from profkit.predict.estimate import EstimateError, estimate, estimate_methods
from profkit.predict.published import UNITS, config_of, read_figure

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "published"
CONFIGS = ROOT / "tests" / "data" / "configs" / "published-litgpt"
OUT = ROOT / "reports" / "estimate-vs-published"


def _from_file(row, entry: dict, config: Path, model_dir: Path) -> tuple[int, str]:
    """The allocated peak ``estimate --config FILE --model DIR --stack ...`` gives, and the method it read."""
    (model_dir / "config.json").write_text(json.dumps(entry["config"]))
    found = plan([config], [], {}, model_dir, None, None, None)
    bnb = re.match(r"\s*(\d+\.\d+(?:\.\d+)?)", row["bitsandbytes"])
    stack = Stack.installed().over(Stack.from_parts({"bitsandbytes": bnb.group(1)}, "source") if bnb else Stack())
    stack = stack.over(found.stack) if found.stack else stack
    settings = RunSettings(method=found.methods[0].name, model_path=str(model_dir), batch_size=found.batch_size,
                           seq_len=found.seq_len)
    [e] = estimate_methods(found.methods, settings, "cuda", found.world_size or 1, stack, found.given)
    return e.peak_bytes, found.methods[0].name


def main() -> None:
    models = json.loads((DATA / "models.json").read_text())
    wide = pd.read_csv(DATA / "wide.csv", dtype=str, keep_default_na=False)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for i, index in enumerate(csv.DictReader((CONFIGS / "INDEX.csv").open())):
            row = wide.iloc[int(index["row"])]
            figure = read_figure(row, models)
            entry = models[figure.model]
            measured = float(row.measured) * UNITS[row.unit]
            model_dir = Path(scratch) / f"model{i}"
            model_dir.mkdir()
            out = {"split": index["split"], "model": figure.model, "config": index["file"], "method": "",
                   "measured_gb": measured / 1e9, "from_config_gb": None, "hand_set_gb": None, "reason": ""}
            try:
                hand = estimate(figure.method, config_of(entry), figure.batch_size, figure.seq_len,
                                figure.world_size, "cuda", figure.model, figure.engine).peak_bytes
                from_file, out["method"] = _from_file(row, entry, CONFIGS / index["file"], model_dir)
            except EstimateError as exc:  # the same refusal both ways (a layer LoRA names that the model lacks)
                out["reason"] = f"refused: {exc}"
            else:
                out.update(from_config_gb=from_file / 1e9, hand_set_gb=hand / 1e9,
                           error_from_config=from_file / measured - 1, error_hand_set=hand / measured - 1,
                           agree=from_file / hand - 1)
            rows.append(out)
            print(f"{index['file']}: measured {measured / 1e9:.2f} GB, from the file {out['from_config_gb']}, "
                  f"hand-set {out['hand_set_gb']} {out['reason'][:80]}", flush=True)
    table = pd.DataFrame(rows)
    OUT.mkdir(parents=True, exist_ok=True)
    table.to_csv(OUT / "from-configs.csv", index=False)

    def summary(part: pd.DataFrame, column: str) -> str:
        e = part[column].dropna().abs()
        return f"median |error| {e.median():.1%}, p90 {e.quantile(0.9):.1%} ({len(e)} of {len(part)} figures estimated)"

    lines = ["# Published peaks estimated from the config files that produced them", "",
             "Written by `analyses/estimate_from_configs.py`: litgpt's config_hub YAMLs at the commits that published "
             "their peaks (`tests/data/configs/published-litgpt`), estimated with `--config FILE --model DIR` and "
             "the bitsandbytes version the source pinned (`--stack`), beside the estimate from wide.csv's hand-set "
             "columns. Counter: `max_memory_allocated`.", ""]
    for split in ("used", "holdout-finetune-readmes"):
        part = table[table.split == split]
        if part.empty:
            continue
        lines += [f"- {split}, from the file: {summary(part, 'error_from_config')}",
                  f"- {split}, hand-set: {summary(part, 'error_hand_set')}",
                  f"- {split}, from the file against hand-set: {summary(part, 'agree')}"]
    shown = table.assign(**{c: table[c].map(lambda v: "-" if pd.isna(v) else f"{v:.2f}")
                            for c in ("measured_gb", "from_config_gb", "hand_set_gb")},
                         **{c: table[c].map(lambda v: "-" if pd.isna(v) else f"{v:+.1%}")
                            for c in ("error_from_config", "error_hand_set", "agree")})
    lines += ["", shown.to_markdown(index=False), ""]
    (OUT / "from-configs.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
