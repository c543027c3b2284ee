"""The GPU table (core/gpus.py): every figure sourced, the GPUs people train on present, names and keys found."""

from __future__ import annotations

import csv

import pytest

from profkit.core import gpus


def test_gpu_keys_and_names_are_found_and_unknown_ones_listed():
    assert gpus.find("h100 sxm").key == "H100-SXM"
    assert gpus.find("NVIDIA H100 80GB HBM3").key == "H100-SXM"
    with pytest.raises(gpus.UnknownGpu, match="valid GPUs: .*A100"):
        gpus.find("Voodoo 3")


def test_every_figure_has_a_source():
    with gpus.TABLE.open(newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            for column in [*gpus.PRECISION_COLUMNS.values(), "memory_bandwidth_gbps", "memory_gib", "nvlink_gbps"]:
                if row[column].strip() not in ("", "none"):
                    assert row[f"src_{column}"].strip(), (row["key"], column)
    assert {"A100-SXM4-80GB", "H100-SXM", "H100-PCIe", "H200-SXM", "L4", "L40S", "RTX-3090", "RTX-4090", "RTX-5090",
            "MI250X", "MI300X"} <= set(gpus.GPUS)
