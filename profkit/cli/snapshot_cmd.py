from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import pandas as pd
import typer
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from profkit.analyze.snapshot import SnapshotAnalysis, SnapshotError, analyse_snapshot
from profkit.cli.common import Format
from profkit.core.exitcodes import Exit
from profkit.core.units import human_bytes

EPILOG = ("Exit codes: 0 every snapshot analysed; 1 a file could not be read (each is named, the others are still "
          "shown); 2 bad arguments.")
TOP_SITES = 10


def snapshot(
    paths: list[Path] = typer.Argument(..., help="Allocator snapshots: torch.cuda.memory._dump_snapshot pickles, "
                                                 "or memory_viz's HTML export."),
    fmt: Format = typer.Option(Format.table, "--format", "-f", help="Output format."),
    plot: Optional[Path] = typer.Option(None, help="Also draw allocated and reserved over time, by owner, to this "
                                                   "PNG (one file per snapshot: NAME-<n>.png when several)."),
) -> None:
    """Why a run ran out of memory and how fragmented the allocator was: reserved against allocated,
    free blocks, OOM verdicts, and what was live by where it was allocated. Pickles are loaded with a
    restricted unpickler: one that asks for code is refused and nothing in it runs."""
    out, err = Console(), Console(stderr=True)
    results: list[SnapshotAnalysis] = []
    failed = False
    for path in paths:
        try:
            results.append(analyse_snapshot(path))
        except SnapshotError as exc:
            err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False)
            failed = True
        except Exception as exc:  # a layout this profkit does not know: named, the others still analysed
            err.print(f"[red]error:[/] {escape(str(path))}: could not be analysed ({type(exc).__name__}: "
                      f"{escape(str(exc))}); please report it with the file", highlight=False)
            failed = True
    if fmt is Format.json:
        typer.echo(json.dumps({str(r.path): to_json(r) for r in results}, indent=2, default=_plain))
    elif fmt is Format.csv:
        typer.echo(to_frame(results).to_csv(index=False), nl=False)
    elif fmt is Format.markdown:
        for r in results:
            typer.echo(f"## {r.path}\n\n{r.devices.T.to_markdown()}\n\n{r.oom.to_markdown(index=False)}\n\n"
                       f"{r.live.head(3 * TOP_SITES).to_markdown(index=False)}\n")
    else:
        for r in results:
            _print(out, r)
    if plot is not None:
        from profkit.report.plots import snapshot_timeline  # heavy: matplotlib, for --plot only

        for i, r in enumerate(results):
            target = plot if len(results) == 1 else plot.with_name(f"{plot.stem}-{i + 1}{plot.suffix}")
            if snapshot_timeline(r, target) is not None:
                err.print(f"plot: {target}", highlight=False)
    if failed:
        raise typer.Exit(Exit.FAILED)


def _plain(value):
    return value.item() if hasattr(value, "item") else str(value)


def to_json(r: SnapshotAnalysis) -> dict:
    def rows(frame: pd.DataFrame) -> list[dict]:
        return json.loads(frame.to_json(orient="records"))

    return {"devices": rows(r.devices), "segment_sizes": rows(r.segment_sizes), "oom": rows(r.oom),
            "live": rows(r.live), "allocator_settings": r.settings, "notes": r.notes}


def to_frame(results: list[SnapshotAnalysis]) -> pd.DataFrame:
    """One long table for CSV: each device's figures and each live group, tagged with its snapshot and kind."""
    parts = []
    for r in results:
        devices = r.devices.melt(id_vars="device", var_name="name", value_name="value").assign(table="device")
        live = r.live.assign(table="live", name=r.live.instant + ": " + r.live.owner + " | " + r.live.site,
                             value=r.live["bytes"])[["device", "name", "value", "table"]]
        ooms = r.oom.assign(table="oom", name=r.oom.verdict, value=r.oom.request_bytes)[["device", "name", "value", "table"]]
        parts.append(pd.concat([devices, ooms, live], ignore_index=True).assign(snapshot=str(r.path)))
    columns = ["snapshot", "table", "device", "name", "value"]
    return pd.concat(parts, ignore_index=True)[columns] if parts else pd.DataFrame(columns=columns)


def _print(out: Console, r: SnapshotAnalysis) -> None:
    for _, d in r.devices.iterrows():
        dev = int(d.device)
        t = Table(title=f"{r.path.name}, device {dev}", box=box.SIMPLE_HEAD, padding=(0, 1), show_header=False)
        t.add_column("", no_wrap=True)
        t.add_column("", justify="right", no_wrap=True)
        t.add_column("", overflow="fold")
        peak = lambda key: (f"{human_bytes(d[key + '_bytes'])}", f"at {d[key + '_s']:.3f} s of the history") \
            if pd.notna(d.get(key + "_bytes")) else ("-", "no history recorded")
        for label, value, note in (
            ("reserved", human_bytes(d.reserved_bytes), f"{int(d.segments)} segments ({int(d.small_segments)} small, "
                                                        f"{int(d.large_segments)} large)"),
            ("allocated", human_bytes(d.allocated_bytes), f"requested {human_bytes(d.requested_bytes)}; rounding "
                                                          f"{human_bytes(d.rounding_bytes)}"),
            ("free in reserved", human_bytes(d.free_in_reserved_bytes),
             f"{int(d.free_blocks)} free blocks; {human_bytes(d.empty_segment_bytes)} in wholly free segments"),
            ("largest free block", human_bytes(d.largest_free_block_bytes),
             f"fragmentation {d.fragmentation:.0%} (1 - largest / free)"),
            ("inactive split", human_bytes(d.inactive_split_bytes),
             f"{int(d.inactive_split_blocks)} free blocks inside segments still in use"),
            ("peak allocated", *peak("peak_allocated")),
            ("peak reserved", *peak("peak_reserved")),
            ("expandable segments", "on" if d.expandable_segments else "off", _settings(r.settings)),
        ):
            t.add_row(label, value, escape(note))
        out.print(t)
        sizes = r.segment_sizes[r.segment_sizes.device == dev]
        if len(sizes):
            out.print("segments by size: " + ", ".join(f"{b} x{int(n)} ({human_bytes(v)})" for b, n, v in
                                                       zip(sizes.bucket, sizes.segments, sizes["bytes"])),
                      highlight=False)
        for _, o in r.oom[r.oom.device == dev].iterrows():
            out.print(f"[red]OOM[/] at {o.t_s:.3f} s: [bold]{o.verdict}[/]: {escape(o.explanation)}", highlight=False)
        live = r.live[r.live.device == dev]
        for instant in live.instant.unique():
            g = live[live.instant == instant]
            what = {"snapshot": "at the dump", "peak": "at the allocated peak"}.get(instant, f"at {instant}")
            t = Table(title=f"live {what}: {human_bytes(g['bytes'].sum())}, top sites", box=box.SIMPLE_HEAD,
                      padding=(0, 1))
            t.add_column("bytes", justify="right", no_wrap=True)
            t.add_column("n", justify="right", no_wrap=True)
            t.add_column("owner", overflow="fold")
            t.add_column("allocated at (library: site; user code)", overflow="fold")
            for _, x in g.head(TOP_SITES).iterrows():
                user = "" if x.user_frame in ("-", x.site) else f"; {x.user_frame}"
                t.add_row(human_bytes(x["bytes"]), f"{int(x.allocations):,}", escape(x.owner),
                          escape(f"{x.library}: {x.site}{user}" if x.library != x.site else x.site))
            out.print(t)
    for note in r.notes:
        out.print(f"[dim]note: {escape(note)}[/]", highlight=False)


def _settings(settings: dict) -> str:
    if not settings:
        return "allocator settings not recorded (torch 2.0 or earlier)"
    conf = settings.get("PYTORCH_CUDA_ALLOC_CONF") or "(empty)"
    split = settings.get("max_split_size", -1)
    return f"PYTORCH_CUDA_ALLOC_CONF={conf}; max_split_size {'unlimited' if split in (-1, None) else human_bytes(split)}"
