"""The report: a self-contained Markdown file with PNG plots beside it, and an HTML version with the
images inline. Everything in it comes from one Breakdown, so its numbers are the breakdown's."""

from __future__ import annotations

import base64
import json
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import markdown
import pandas as pd

from profkit.analyze import Breakdown, breakdown, ranks, views
from profkit.core.settings import RunSettings
from profkit.core.units import human_bytes, human_seconds
from profkit.analyze.glance import at_a_glance
from profkit.report import findings, plots, tables
from profkit.report.answers import answers

PLOTS = {
    "memory_by_owner.png": ("Memory at the peak, by owner", plots.memory_bars),
    "time_by_category.png": ("Step time by operator category", plots.time_bars),
    "memory_timelines.png": ("Memory timeline of each run's memory cycle (phases shaded)", plots.memory_timelines),
    "peak_memory_vs_step_time.png": ("Peak memory against step time, with the Pareto front", plots.pareto),
    "trace_memory_over_time.png": ("Memory over time in traces profkit did not record ([memory] events)",
                                   plots.trace_memory_over_time),
    "ranks.png": ("Ranks of one job side by side", plots.ranks_chart),
}


@dataclass
class Report:
    markdown_path: Path
    html_path: Path
    images: list[Path]
    breakdown: Breakdown


def write_report(paths: list[Path], out_dir: Path, command: str | None = None,
                 budget_bytes: int | None = None) -> Report:
    bd = breakdown(paths)
    command = command or command_line(paths, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images = []
    for name, (_, plot) in PLOTS.items():
        if not bd.runs.empty and plot(bd, out_dir / name) is not None:
            images.append(out_dir / name)
    snapshot_images = {}
    for run, snap in bd.snapshots.items():
        target = out_dir / f"allocator_{re.sub(r'[^A-Za-z0-9_.-]', '_', run)}.png"
        if plots.snapshot_timeline(snap, target) is not None:
            snapshot_images[run] = target
            images.append(target)
    text = render_markdown(bd, [i for i in images if i not in snapshot_images.values()], command, snapshot_images,
                           budget_bytes)
    md_path = out_dir / "report.md"
    md_path.write_text(text)
    html_path = out_dir / "report.html"
    html_path.write_text(render_html(text, out_dir))
    return Report(md_path, html_path, images, bd)


def record_commands(bd: Breakdown) -> list[str]:
    """``profkit record`` command lines that record the runs again, each from its own settings (methods, method
    settings, sizes, engine, ranks, repetitions); runs that differ only in their method share one command."""
    repetitions: dict[str, set] = {}
    settings: dict[str, RunSettings] = {}
    for rec in bd.records.values():
        if not rec.run_settings:  # a user's own session has no command
            continue
        s = RunSettings.from_json(rec.run_settings)
        key = json.dumps({**s.to_json(), "repeats": 1}, sort_keys=True)
        settings.setdefault(key, s)
        repetitions.setdefault(key, set()).add(rec.repetition)
    commands: dict[str, list[str]] = {}
    for key, s in settings.items():
        argv = replace(s, repeats=max(len(repetitions[key]), s.repeats)).to_argv()
        commands.setdefault(shlex.join(argv[1:]), []).append(argv[0])
    return [f"profkit record {shlex.join(dict.fromkeys(methods))} {rest}" for rest, methods in commands.items()]


def _context(bd: Breakdown) -> list[str]:
    lines = []
    for m in bd.records.values():
        dev, rs = m.device, m.run_settings or {}
        versions = ", ".join(f"{k} {v}" for k, v in m.versions.items() if v)
        model = m.model.get("path") or (f"preset {m.model['preset']}" if m.model.get("preset") else m.model.get("class"))
        lines += [f"- Device: {dev.get('type')} ({dev.get('name')}, {dev.get('cpu_count')} CPUs, "
                  f"{dev.get('torch_threads')} torch threads)",
                  f"- Model: {model}" + (f"; batch {rs.get('batch_size')} x {rs.get('seq_len')} tokens; "
                                         f"{rs.get('timed_steps')} timed steps, {rs.get('profiled_steps')} profiled steps"
                                         if rs else ""),
                  f"- Versions: {versions}",
                  f"- Recorded at git commit {m.git_commit or 'unknown'}"]
        if rs:
            lines += ["", "Record (each method is run in a fresh process):", "", "```bash", *record_commands(bd), "```"]
        break
    return lines


def render_markdown(bd: Breakdown, images: list[Path], command: str | None,
                    snapshot_images: dict[str, Path] | None = None, budget_bytes: int | None = None) -> str:
    """The answers first (at a glance, the study's questions), then the evidence (findings ranked by size,
    per-family tables, plots), then each run's details and how it was all recorded."""
    parts = ["# profkit report", "", _summary_line(bd), ""]
    glance = at_a_glance(bd, budget_bytes)
    # The table and the answers side by side in the HTML (one line a run), so that both are on a laptop's first
    # screen; one after the other in the Markdown.
    parts += ['<div class="first" markdown="1">', '<div markdown="1">', ""]
    if not glance.empty:
        parts += ["## At a glance", "", tables.glance_cells(glance, ", ").to_markdown(index=False), ""]
        parts += [" ".join(tables.glance_notes(glance, budget_bytes, reasons=False)), ""]
    parts += ["</div>", '<div markdown="1">', "", "## Answers", ""]
    for a in answers(bd, budget_bytes):
        parts += [f"**{a.question}** {a.lead}", ""]
        if a.points:  # the runs behind each figure, one click away in the HTML
            parts += ['<details markdown="1"><summary>the runs behind it</summary>', ""]
            parts += [f"- {p}" for p in a.points] + ["", "</details>", ""]
    parts += ["</div>", "</div>", ""]
    flagged = findings.flags(bd)
    if flagged:
        parts += ["## Flagged runs", ""] + [f"- {s}" for s in flagged] + [""]
    parts += ["## Findings, the largest first", ""]
    parts += [f"- {f.text} *(Compared: {f.compared}; {f.instant}.)*" for f in findings.ranked(bd)] \
        or ["- No complete runs to compare."]
    parts += _family_tables(bd)
    titles = {name: title for name, (title, _) in PLOTS.items()}
    for img in images:
        parts += ["", f"## {titles[img.name]}", "", f"![{titles[img.name]}]({img.name})"]
        if img.name == "memory_timelines.png":
            parts += ["", "The profiler's own categories over time, before reconciliation with the inventory."]
        if img.name == "trace_memory_over_time.png":
            live = bd.trace_memory.assign(bytes=bd.trace_memory["bytes"].map(human_bytes))
            parts += ["", "Bytes live at each device's allocated peak, by the phase and operator category that "
                          "allocated them (parameters, gradients and optimizer state need profkit's inventory).", "",
                      live[["run", "device", "phase", "category", "bytes", "allocations"]].to_markdown(index=False)]
        if img.name == "ranks.png":
            parts += _rank_tables(bd)
    parts += ["", "## Runs", "", _runs_table(bd)]
    parts += _generation_section(bd) + _predicted_section(bd)
    parts += _allocator_sections(bd, snapshot_images or {})
    baseline = tables.default_baseline(bd)
    if baseline:
        parts += ["", f"## Against {baseline}", ""] + [f"- {s}" for s in findings.delta_sentences(bd, baseline)]
    notes = [f"- {run}: {n}" for run, ns in bd.notes.items() for n in ns]
    if notes:
        parts += ["", "## Notes", ""] + sorted(set(notes))
    parts += ["", "## How this was recorded", ""] + _context(bd)
    if command:
        parts += ["", "Then this report:", "", "```bash", command, "```"]
    return "\n".join(parts) + "\n"


def _summary_line(bd: Breakdown) -> str:
    if bd.runs.empty:
        return "No runs."
    ok = int(bd.runs.status.isin(["ok", "foreign"]).sum())
    rec = next(iter(bd.records.values()), None)
    where = ""
    if rec is not None:
        model = rec.model.get("path") or rec.model.get("preset") or rec.model.get("class") or "a model"
        device = rec.device.get("type") or "a device"
        where = f" of {model} on {device}" + (f" ({rec.device['name']})" if rec.device.get("name") else "")
    traces = int((bd.runs.status == "foreign").sum())
    what = f"{len(bd.runs)} runs{where}" + (f" ({traces} of them traces recorded by others)" if traces else "")
    return (f"{what}, {ok} measured. The answers come first; the evidence, each run's details and how they were "
            "recorded follow.")


TIME_NOTE = ("Per profiled step (GPU runs: kernel time and idle; CPU runs: op self time), as a share of the step and "
             "as profiled. The profiler's own cost inflates absolute times unevenly: a share times the clean step "
             "time is only an estimate of a category's unprofiled time.")
MEMORY_NOTE = ("Bytes at each run's peak (profkit's reconciliation: inventory first, then the profiler's timeline; "
               "`unattributed` is what is left of the measured peak).")


def _family_tables(bd: Breakdown) -> list[str]:
    """Memory at the peak and time per step, one pair of tables per family of runs, each no wider than 100
    characters (``tables.fit_markdown``)."""
    mem, tim = views.memory_at(bd), views.time_per_step(bd)
    families: dict[str, list[str]] = {}
    for run in bd.runs.run:
        if run in mem.index or run in tim.index:
            families.setdefault(tables.family(bd, run), []).append(run)
    if not families:
        return []
    out = ["", "## Memory and time by family", "", MEMORY_NOTE, "", TIME_NOTE]
    for family, runs in families.items():
        m = mem.reindex([r for r in runs if r in mem.index]).dropna(axis=1, how="all")
        if len(m):
            out += ["", f"### {family}: memory at the peak", ""]
            out += [x for t in tables.fit_markdown(m.map(human_bytes).T) for x in (t, "")]
        t = tim.reindex([r for r in runs if r in tim.index]).dropna(axis=1, how="all")
        if len(t):
            share = t.div(t.sum(axis=1), axis=0)
            cells = share.map(lambda v: "-" if v != v else f"{v:.0%}") + " " + t.map(human_seconds)
            out += ["", f"### {family}: time per profiled step", ""]
            out += [x for table in tables.fit_markdown(cells.T) for x in (table, "")]
    return out


def _generation_section(bd: Breakdown) -> list[str]:
    """Generation runs: latency from the unprofiled requests and the KV cache at the end of generation."""
    serving = bd.runs[bd.runs.ttft_median_s.notna()] if "ttft_median_s" in bd.runs else bd.runs.iloc[0:0]
    if serving.empty:
        return []
    table = pd.DataFrame({"TTFT": serving.ttft_median_s.map(human_seconds).values,
                          "TPOT": serving.tpot_median_s.map(human_seconds).values,
                          "TPOT p90": serving.tpot_p90_s.map(human_seconds).values,
                          "KV cache": serving.kv_cache_bytes.map(human_bytes).values,
                          "positions": serving.kv_cache_tokens.values}, index=serving.run.values)
    return ["", "## Generation", "", "Medians over the unprofiled requests: time to first token (the prefill) and time "
            "per output token (each decode pass); the KV cache as generation leaves it.", "", table.to_markdown()]


def _predicted_section(bd: Breakdown) -> list[str]:
    """The estimate each run recorded before it ran, beside what the run measured."""
    p = bd.predicted
    if p.empty:
        return []
    shown = p.assign(predicted=p.predicted_bytes.map(human_bytes), measured=p.measured_bytes.map(human_bytes),
                     error=p.error.map(tables.format_error))
    out = ["", "## Estimate against measurement", "",
           "`profkit estimate`'s prediction, recorded before each run, beside the measurement. Training: static "
           "categories and activations at the forward phase's peak, gradients at the optimizer step's; generation: "
           "weights and activations at the prefill's peak, the KV cache at the last decode pass's.", "",
           shown[["run", "category", "phase", "predicted", "measured", "error"]].to_markdown(index=False)]
    t = bd.predicted_time
    if len(t):
        out += ["", "Step time on the run's GPU as `profkit estimate --gpu` predicted it before the run, beside the "
                    "kernel time measured per profiled step in each category (the step: against the clean step).", "",
                t.assign(predicted=t.predicted_s.map(human_seconds), measured=t.measured_s.map(human_seconds),
                         error=t.error.map(tables.format_error))[["run", "category", "predicted", "measured", "error"]]
                .to_markdown(index=False)]
    return out


def _allocator_sections(bd: Breakdown, images: dict[str, Path]) -> list[str]:
    """CUDA runs: what the allocator snapshot says (reserved against allocated, fragmentation, OOM verdicts,
    what was live at the peak by where it was allocated)."""
    out = []
    for run, snap in bd.snapshots.items():
        out += ["", f"## Allocator: {run}", ""]
        for _, d in snap.devices.iterrows():
            out.append(f"- device {int(d.device)}: reserved {human_bytes(d.reserved_bytes)}, allocated "
                       f"{human_bytes(d.allocated_bytes)}; free inside reserved {human_bytes(d.free_in_reserved_bytes)} "
                       f"({human_bytes(d.empty_segment_bytes)} in wholly free segments, "
                       f"{human_bytes(d.inactive_split_bytes)} split inside segments in use; largest free block "
                       f"{human_bytes(d.largest_free_block_bytes)}); {int(d.segments)} segments; expandable segments "
                       f"{'on' if d.expandable_segments else 'off'}")
        out += [f"- OOM: {o.verdict}: {o.explanation}" for _, o in snap.oom.iterrows()]
        if run in images:
            out += ["", f"![Allocator history of {run}]({images[run].name})"]
        peak = snap.live[snap.live.instant == ("peak" if (snap.live.instant == "peak").any() else "snapshot")]
        if len(peak):
            top = peak.head(10).assign(bytes=peak["bytes"].head(10).map(human_bytes))
            out += ["", "Live at the allocated peak, by where it was allocated:", "",
                    top[["bytes", "allocations", "owner", "library", "site", "user_frame"]].to_markdown(index=False)]
    return out


def _rank_tables(bd: Breakdown) -> list[str]:
    per_rank = ranks.rank_summary(bd)
    memory = ranks.rank_memory(bd)
    out = []
    for group in per_rank.group.unique():
        g = per_rank[per_rank.group == group]
        out += ["", f"{group}: per profiled step; communication exposed is what compute did not hide.", "",
                pd.DataFrame({"rank": g["rank"], "step": g.step_s.map(human_seconds),
                              "start skew": g.start_skew_ms.map(lambda v: f"{v:.2f} ms"),
                              "communication exposed": g.communication_s.map(human_seconds),
                              "communication overlapped": g.communication_overlapped_s.map(human_seconds),
                              "run": g.run}).to_markdown(index=False)]
        m = memory[(memory.group == group) & memory.parameters_bytes.notna()]
        if len(m):
            out += ["", "Memory on each rank, from its inventory:", "",
                    pd.DataFrame({"rank": m["rank"], "parameters": m.parameters_bytes.map(human_bytes),
                                  "share of the model": m.parameters_fraction.map(lambda v: f"{v:.1%}"),
                                  "gradients": m.gradients_bytes.map(human_bytes),
                                  "optimizer state": m.optimizer_state_bytes.map(human_bytes),
                                  "measured peak": m.measured_peak_bytes.map(human_bytes)}).to_markdown(index=False)]
    return out


def _runs_table(bd: Breakdown) -> str:
    if bd.runs.empty:
        return "(no runs)"
    rows = []
    for _, r in bd.runs.iterrows():
        rows.append({
            "run": r["run"], "status": r.get("status"),
            "clean step": human_seconds(r.get("clean_step_time_s")),
            "tokens/s": f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") == r.get("tokens_per_s") and r.get("tokens_per_s") is not None else "-",
            "profiled step": human_seconds(r.get("profiled_step_time_s")),
            "measured peak": human_bytes(r.get("measured_peak_bytes")),
            "reason": r.get("reason") if isinstance(r.get("reason"), str) else "",
        })
    return pd.DataFrame(rows).to_markdown(index=False)


def render_html(text: str, image_dir: Path) -> str:
    body = markdown.markdown(text, extensions=["tables", "fenced_code", "md_in_html"])

    def inline(match: re.Match) -> str:
        path = image_dir / match.group(1)
        data = base64.b64encode(path.read_bytes()).decode() if path.exists() else ""
        return f'src="data:image/png;base64,{data}"'

    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    # Compact enough that the at-a-glance table and the answers share a laptop's first screen (1280x800).
    style = ("body{font-family:system-ui,sans-serif;max-width:1240px;margin:0.6em auto;padding:0 1em;line-height:1.35;"
             "font-size:14px}h1{font-size:20px;margin:0.2em 0}h2{font-size:16px;margin:0.8em 0 0.3em}"
             "p{margin:0.3em 0}summary{color:#555;cursor:pointer}"
             ".first{display:grid;grid-template-columns:auto minmax(330px,1fr);gap:0 1.5em;align-items:start}"
             ".first p,.first li{font-size:13px}.first td{white-space:nowrap}@media (max-width:1100px){.first{display:block}}"
             "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:1px 6px;text-align:right}"
             "td:first-child,th:first-child{text-align:left}img{max-width:100%}code,pre{background:#f4f4f4}")
    return f"<!doctype html><html><head><meta charset='utf-8'><title>profkit report</title><style>{style}</style></head><body>{body}</body></html>\n"


def command_line(paths: list[Path], out_dir: Path, budget: str | None = None) -> str:
    return ("profkit report " + " ".join(shlex.quote(str(p)) for p in paths) + f" -o {shlex.quote(str(out_dir))}"
            + (f" --budget {shlex.quote(budget)}" if budget else ""))
