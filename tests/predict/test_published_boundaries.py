"""Published fit boundaries set beside the estimate: a row is read as the wide set's figures are, at the value that
ran and the one that ran out of memory; the verdict is the estimate's at both against the GPU it ran on, a setting
the row leaves out is either estimated both ways or the row keeps its reason."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from profkit.configs.models import find_config
from profkit.predict.published import read_figure
from profkit.predict.published_throughput import NotPredicted
from profkit.predict.published_boundaries import (
    VERDICTS,
    loss_of_kernels,
    _model_entry,
    _precision,
    _words_double_quant,
    compare_boundaries,
    figure_row,
    verdict,
)

DATA = Path(__file__).parents[1] / "data" / "published"
COLUMNS = pd.read_csv(DATA / "boundaries.csv", nrows=0).columns
# A 0.5B model from profkit's catalogue, so that each estimate is seconds.
BASE = dict(split="used", project="p", url="u", model="Qwen2.5 0.5B", hf_model_id="Qwen/Qwen2.5-0.5B-Instruct",
            method="lora", lora_r="8", lora_targets="q_proj,v_proj", quant="", precision="bf16-mixed",
            optimizer="AdamW", gradient_checkpointing="True", seq_len="512", batch_size="", varied="batch_size",
            fits_value="2", oom_value="4096", gpu="RTX 4090", gpu_memory_gib="24", gpu_count="1", sharding="none",
            offload="none", loop="own script", transformers_version="", notes="")


def _table(tmp_path: Path, *rows: dict) -> Path:
    path = tmp_path / "boundaries.csv"
    pd.DataFrame([{c: {**BASE, **r}.get(c, "") for c in COLUMNS} for r in rows]).to_csv(path, index=False)
    (tmp_path / "models.json").write_text((DATA / "models.json").read_text())
    return path


@pytest.mark.parametrize("fits_at_fits, fits_at_oom, expected", [
    (True, False, VERDICTS[0]), (False, False, VERDICTS[1]), (True, True, VERDICTS[2]),
    (True, None, VERDICTS[0]), (False, None, VERDICTS[1]), (None, False, VERDICTS[0]), (None, True, VERDICTS[2]),
])
def test_the_verdict_is_the_estimate_at_each_stated_side(fits_at_fits, fits_at_oom, expected):
    assert verdict(fits_at_fits, fits_at_oom) == expected


@pytest.mark.parametrize("text, stated", [
    ("nf4 (bnb)", ""), ("nf4 + double quant", "True"), ("nf4, bnb_4bit_use_double_quant=True", "True"),
    ("nf4 (no double quant)", "False"), ("nf4, double_quant: False", "False"), ("4-bit bnb (type not stated)", ""),
])
def test_double_quantization_is_read_from_the_words_or_left_unstated(text, stated):
    assert _words_double_quant(text) == stated


@pytest.mark.parametrize("method, text, expected", [
    ("full", "bf16 (--bf16 True on bf16 weights)", "bf16-pure"),
    ("lora", "bf16 (--bf16 True on bf16 weights)", "bf16-mixed"),
    ("qlora", "bf16 (--bf16 True on bf16 weights)", "bf16-mixed"),
    ("full", "bf16 (stated 'Data Type = bf16')", "bf16 (stated 'Data Type = bf16')"),  # left for the reader to refuse
    ("lora", "bf16-pure", "bf16-pure"),
])
def test_bf16_on_bf16_weights_is_autocast_over_a_half_precision_base(method, text, expected):
    assert _precision(SimpleNamespace(method=method, precision=text))[0] == expected


def test_a_loop_that_names_kernels_replacing_the_loss_computes_that_loss_or_is_not_estimated():
    assert loss_of_kernels("transformers Trainer + Liger kernels")[0] == "liger-fused-linear-cross-entropy"
    assert loss_of_kernels("own script (fsdp_qlora train.py)") == ("", "")
    with pytest.raises(NotPredicted, match="fused cross-entropy over the whole logits"):
        loss_of_kernels("transformers Trainer + fms-acceleration foak-fast-kernels kernels")
    liger = figure_row(SimpleNamespace(**{**BASE, "loop": "Trainer + fms-acceleration foak-fast-kernels-liger"}), 2)
    assert liger.loss == "liger-fused-linear-cross-entropy"


def test_the_varied_dimension_takes_each_value_and_the_other_stays_as_stated():
    r = SimpleNamespace(**BASE)
    assert (figure_row(r, 6).batch_size, figure_row(r, 6).seq_len) == ("6", "512")
    r = SimpleNamespace(**{**BASE, "varied": "seq_len", "seq_len": "", "batch_size": "1"})
    assert (figure_row(r, 4096).batch_size, figure_row(r, 4096).seq_len) == ("1", "4096")


def test_every_published_row_reads_as_an_estimate_or_keeps_a_reason():
    """The whole table through the reader (no estimate): nothing raises, and a row the estimate cannot take says
    why, the way the wide set's rows do."""
    configs = __import__("json").loads((DATA / "models.json").read_text())
    table = pd.read_csv(DATA / "boundaries.csv", dtype=str, keep_default_na=False)
    read = 0
    for r in table.itertuples():
        value = int(r.fits_value or r.oom_value or 1)
        try:
            key, entry = _model_entry(r, configs, find_config)
        except Exception as exc:  # the reader's NotPredicted: a model with no configuration anywhere
            assert str(exc)
            continue
        try:
            row = figure_row(r, value, "True", model=key)
        except NotPredicted as exc:
            assert str(exc)
            continue
        figure = read_figure(row, {key: entry})
        assert figure.reason != "no configuration in models.json"
        assert figure.method is not None or figure.reason
        read += figure.method is not None
    assert read >= 10  # the table holds boundaries the estimate takes, not only reasons


def test_a_small_model_fits_at_two_and_not_at_thousands_and_unstated_rows_keep_their_reason(tmp_path):
    table = _table(tmp_path, {},
                   {"gpu": "not stated"},
                   {"fits_value": "", "oom_value": ""},
                   {"method": "qlora", "quant": "nf4 (bnb)", "fits_value": "2", "oom_value": ""},
                   {"fits_value": "ten"})
    rows = compare_boundaries(table, find_model=find_config)
    assert rows.iloc[4].verdict == VERDICTS[4] and "not a whole number (ten)" in rows.iloc[4].reason
    rows = rows.iloc[:4]
    assert list(rows.verdict) == [VERDICTS[0], VERDICTS[4], VERDICTS[4], VERDICTS[0]]
    first = rows.iloc[0]
    assert (first.fits_at_fits, first.fits_at_oom) == (True, False) and first.profkit_method.startswith("lora_gc")
    assert "GPU" in rows.iloc[1].reason and "neither" in rows.iloc[2].reason
    assert "double quantization not stated" in rows.iloc[3].assumed  # estimated both ways, and both fit
    assert " / " in rows.iloc[3].peak_at_fits_gb
