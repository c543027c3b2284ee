import json
import re
import shutil

import pytest

from profkit.analyze import views
from profkit.core.units import human_bytes, human_seconds
from profkit.report.document import PLOTS, write_report
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def report(matrix, tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    for run in ("full", "full_gc", "lora", "lora_gc", "qlora", "lora_zero2", "infer_fp16", "infer_int4"):
        shutil.copytree(matrix / run, runs / run)
    failed = runs / "qlora_zero3"
    failed.mkdir()
    (failed / "manifest.json").write_text(json.dumps(
        {"method": "qlora_zero3", "status": "oom", "reason": "OutOfMemoryError: CUDA out of memory"}))
    return write_report([runs], tmp_path_factory.mktemp("report") / "matrix")


def test_every_plot_is_written(report):
    # Not drawn for these runs: foreign traces' memory, and ranks (one process each here).
    profkit_runs_only = sorted(n for n in PLOTS if n not in ("trace_memory_over_time.png", "ranks.png"))
    assert sorted(p.name for p in report.images) == profkit_runs_only
    for png in report.images:
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    html = report.html_path.read_text()
    assert html.count("data:image/png;base64,") == len(profkit_runs_only)


def markdown_table(text: str, heading: str) -> dict[str, dict[str, str]]:
    """Parse the first Markdown table after ``heading`` into {row label: {column: cell}}."""
    block = text[text.index(heading):].splitlines()
    first = next(i for i, line in enumerate(block) if line.startswith("|"))
    end = next((i for i in range(first, len(block)) if not block[i].startswith("|")), len(block))
    lines = block[first:end]  # the table ends at its first line that is not a row
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    out = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break
        out[cells[0]] = dict(zip(header[1:], cells[1:]))
    return out


def family_tables(text: str, kind: str) -> dict[str, dict[str, str]]:
    """Every per-family table of ``kind`` ("memory at the peak", "time per profiled step"), split or not, merged
    into {category: {run: cell}}."""
    out: dict[str, dict[str, str]] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("### ") and line.endswith(f": {kind}"):
            block = lines[i + 1:]
            end = next((k for k, l in enumerate(block) if l.startswith("#")), len(block))
            tables = "\n".join(block[:end]).split("\n\n")
            for table in (t.strip() for t in tables if t.strip().startswith("|")):
                parsed = markdown_table(table, table.splitlines()[0])
                for category, cells in parsed.items():
                    out.setdefault(category, {}).update(cells)
    return out


def test_table_numbers_equal_the_breakdown(report):
    text = report.markdown_path.read_text()
    bd = report.breakdown
    mem = family_tables(text, "memory at the peak")
    expected = views.memory_at(bd)
    for run in expected.index:
        for cat, value in expected.loc[run].items():
            if value == value:  # a category no run of the family has is left out of its table
                assert mem[cat][run] == human_bytes(value), (run, cat)
    tim = family_tables(text, "time per profiled step")
    for run, row in views.time_per_step(bd).iterrows():
        for cat, value in row.items():
            if value == value:
                assert tim[cat][run] == f"{value / row.sum():.0%} {human_seconds(value)}", (run, cat)


def test_evidence_tables_fit_100_columns(report):
    """Per family, split by columns where they must: no line of the evidence is wider than 100 characters."""
    text = report.markdown_path.read_text()
    section = text[text.index("## Memory and time by family"):]
    section = section[:section.index("\n## ", 1)]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows and max(map(len, rows)) <= 100
    headings = [line for line in section.splitlines() if line.startswith("### ")]
    assert "### generation: memory at the peak" in headings and "### full fine-tuning: memory at the peak" in headings


def test_generation_and_estimate_sections(report):
    """The serving runs' latency and KV cache, and each run's recorded estimate beside its measurement."""
    text = report.markdown_path.read_text()
    bd = report.breakdown
    generation = markdown_table(text, "## Generation")
    runs = bd.runs.set_index("run")
    for run in ("infer_fp16", "infer_int4"):  # both record on CPU (the matrix fixture asserts it)
        assert runs.loc[run, "status"] == "ok"
        assert generation[run]["KV cache"] == human_bytes(runs.loc[run, "kv_cache_bytes"])
        assert generation[run]["TTFT"] == human_seconds(runs.loc[run, "ttft_median_s"])
    section = text[text.index("## Estimate against measurement"):]
    p = bd.predicted
    kv = p[(p.run == "infer_fp16") & (p.category == "kv_cache")].iloc[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("|")]
    assert ["infer_fp16", "kv_cache", "decode", human_bytes(kv.predicted_bytes), human_bytes(kv.measured_bytes),
            "+0.0%"] in rows


def test_failed_runs_appear_with_their_status(report):
    text = report.markdown_path.read_text()
    runs = markdown_table(text, "## Runs")
    assert runs["qlora_zero3"]["status"] == "oom"
    assert "OutOfMemoryError" in runs["qlora_zero3"]["reason"]
    assert "qlora_zero3 was not measured: status oom" in text


def test_findings_quote_numbers(report):
    text = report.markdown_path.read_text()
    section = text[text.index("## Findings"):text.index("## Memory and time by family")]
    sentences = [l for l in section.splitlines() if l.startswith("- ")]
    assert any(s.startswith("- Gradient checkpointing (lora_gc vs lora) cut the activation peak") for s in sentences)
    assert any(s.startswith("- QLoRA (qlora) holds") for s in sentences)
    assert any("ZeRO-2 on one process" in s for s in sentences)
    assert all(re.search(r"\d", s) for s in sentences)


def test_report_states_context_and_reproduction(report):
    text = report.markdown_path.read_text()
    assert "- Device: cpu" in text and "- Versions: python" in text
    assert "profkit report " in text


def test_report_cli(matrix, tmp_path):
    result = run_cli("report", str(matrix / "lora"), str(matrix / "lora_gc"), "-o", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "r" / "report.md").read_text()
    html = (tmp_path / "r" / "report.html").read_text()
    for run in ("lora", "lora_gc"):  # both runs in both documents
        assert f"| {run} " in text and run in html
    assert "Gradient checkpointing (lora_gc vs lora)" in text and "<img" in html


def test_findings_pair_runs_by_their_manifest_not_their_names(matrix, tmp_path):
    """A user's run names say nothing about the method: findings read what each run is from its manifest."""
    from profkit.analyze import breakdown
    from profkit.report.findings import findings

    shutil.copytree(matrix / "lora", tmp_path / "baseline")
    shutil.copytree(matrix / "lora_gc", tmp_path / "with_checkpointing")
    shutil.copytree(matrix / "qlora", tmp_path / "small")
    sentences = findings(breakdown([tmp_path]))
    assert any(s.startswith("Gradient checkpointing (with_checkpointing vs baseline)") for s in sentences)
    assert any(s.startswith("QLoRA (small) holds") for s in sentences)
    assert not any("(small vs" in s or "ZeRO" in s for s in sentences)


def test_report_of_traces_recorded_by_others(tmp_path):
    """Foreign GPU traces: no inventory tables, but memory over time from [memory] events, idle reasons and
    exposed communication among the findings."""
    from tests.conftest import GPU_TRACES

    rep = write_report([GPU_TRACES / "v100_2rank_rank1_memory_events.json.gz",
                        GPU_TRACES / "a100_distributed_rank0.json.gz"], tmp_path / "foreign")
    names = {p.name for p in rep.images}
    assert "trace_memory_over_time.png" in names and "memory_by_owner.png" not in names
    text = rep.markdown_path.read_text()
    assert "GPU idle" in text and "of which" in text and "exposed" in text
    assert "allocated before the trace" in text
