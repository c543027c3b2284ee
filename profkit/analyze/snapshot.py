"""CUDA caching-allocator snapshots (``torch.cuda.memory._dump_snapshot``, what pytorch.org/memory_viz opens):
reserved against allocated, fragmentation, why an allocation failed, and what was live, by where it was
allocated. Pure functions of the loaded snapshot; no torch (a snapshot is plain dicts and lists).

A snapshot holds the allocator's state when it was dumped (``segments``: each cudaMalloc'd segment and the
blocks it is split into) and, if history was recorded, each device's recent actions (``device_traces``).
History is a ring buffer, so its beginning is lost on long runs; allocated and reserved over time are
therefore rebuilt backwards from the state at the dump, which is exact whatever was dropped. Older torch
(2.0) wrote ``history`` lists on blocks instead of ``frames``; both are read.
"""

from __future__ import annotations

import base64
import builtins
import gzip
import io
import json
import operator
import pickle
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd

from profkit.core.units import human_bytes as h

# Everything a snapshot contains; anything else in a pickle (a class, a function such as os.system) is refused.
SAFE_BUILTINS = frozenset({"dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray", "int", "float",
                           "bool", "complex"})
ACTIVE = ("active_allocated", "active_awaiting_free")
LIBRARIES = ("peft", "bitsandbytes", "deepspeed", "transformers", "accelerate", "trl", "torch/optim", "torch/nn",
             "torch/autograd", "torch/utils/checkpoint")
# Frames that are the allocator's or Python's own plumbing, never where a tensor was asked for.
PLUMBING = re.compile(r"(^|/)(torch/(_tensor|functional|overrides|_ops|utils/_contextlib|nn/modules/module|"
                      r"_compile|_dynamo|autograd/graph)\.py|runpy\.py|threading\.py|<frozen )")
SIZE_BUCKETS = [(0, "< 1 MiB"), (1 << 20, "1-2 MiB"), (2 << 20, "2-20 MiB"), (20 << 20, "20-200 MiB"),
                (200 << 20, "200 MiB-2 GiB"), (2 << 30, ">= 2 GiB")]
TIMELINE_POINTS = 2000
BEFORE = "allocated before the recorded history"
# The allocator serves requests below 1 MiB from small (2 MiB) segments, larger ones from large segments.
SMALL_REQUEST = 1 << 20


class SnapshotError(ValueError):
    def __init__(self, path: Path, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"{path}: {reason}")


class EmptySnapshotError(SnapshotError):
    """A well-formed snapshot with nothing in it: no segment and no history, so no figure to show."""

    def __init__(self, path: Path):
        super().__init__(path, "the snapshot holds no segments and no allocation history: nothing was allocated "
                               "when it was taken, or it was taken on another device or process")


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "builtins" and name in SAFE_BUILTINS:
            return getattr(builtins, name)
        raise pickle.UnpicklingError(f"refused to load {module}.{name}: an allocator snapshot holds only plain "
                                     "data, and this pickle asks for code (nothing was executed)")


def load_snapshot(path: Path) -> dict:
    """A snapshot pickle (gzip-compressed or not), or the HTML memory_viz exports with one embedded. Never runs code
    from the file."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SnapshotError(path, f"unreadable ({exc.strerror or exc})") from None
    if raw[:2] == b"\x1f\x8b":  # gzip-compressed (snapshots compress 20-fold; users and profkit's fixtures do so)
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise SnapshotError(path, f"a damaged gzip file ({exc})") from None
    if raw.lstrip()[:1] == b"<":  # memory_viz's HTML: const local_files = [{"name": ..., "base64": ...}]
        found = re.search(rb"local_files\s*=\s*(\[.*?\])\s*\n", raw, re.S)
        if not found:
            raise SnapshotError(path, "an HTML file without an embedded snapshot (memory_viz's export has one)")
        try:
            raw = base64.b64decode(json.loads(found[1])[0]["base64"])
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise SnapshotError(path, f"the embedded snapshot cannot be decoded ({exc})") from None
    try:
        data = _RestrictedUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as exc:
        if str(exc).startswith("refused to load"):
            raise SnapshotError(path, str(exc)) from None
        raise SnapshotError(path, f"not an allocator snapshot pickle ({exc})") from None
    except Exception as exc:  # truncated or not a pickle at all
        raise SnapshotError(path, f"not an allocator snapshot pickle ({type(exc).__name__}: {exc})") from None
    if isinstance(data, list):  # the oldest layout: the list of segments alone
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise SnapshotError(path, "not an allocator snapshot (no 'segments' list)")
    try:  # checked, not converted: the analysis reads the plain data; unknown fields are every version's own
        msgspec.convert(data, _Snapshot)
    except msgspec.ValidationError as exc:
        raise SnapshotError(path, f"a damaged allocator snapshot: {exc}") from None
    return data


# What the analysis reads of a snapshot, with the types it computes with: torch's layouts since 2.0 agree on
# these (frames on blocks, or a legacy ``history``; fields added later are optional).
class _Frame(msgspec.Struct):
    filename: str = ""
    line: int | None = None
    name: str = ""


class _Block(msgspec.Struct):
    size: int
    state: str = ""
    requested_size: int | None = None
    frames: list[_Frame] | None = None
    history: list[dict] | None = None


class _Segment(msgspec.Struct):
    address: int
    total_size: int
    blocks: list[_Block] = []
    device: int = 0
    segment_type: str = "large"


class _TraceEntry(msgspec.Struct):
    action: str
    addr: int = 0
    size: int = 0
    time_us: float | None = None
    frames: list[_Frame] | None = None


class _Annotation(msgspec.Struct):
    time_us: float = 0
    name: str | None = None


class _Snapshot(msgspec.Struct):
    segments: list[_Segment]
    device_traces: list[list[_TraceEntry] | None] | None = None
    allocator_settings: dict | None = None
    external_annotations: list[_Annotation] | None = None


# --------------------------------------------------------------------------- where an allocation came from

def _python_frames(frames: list) -> list:
    """Python's frames; C++ frames have line 0, and CPython's own C frames (Objects/methodobject.c) a .c file."""
    return [f for f in frames or () if f.get("line", 0) > 0 and str(f.get("filename", "")).endswith(".py")]


def _library(filename: str) -> str | None:
    norm = filename.replace("\\", "/")
    for lib in LIBRARIES:
        if f"/{lib}/" in norm or norm.startswith(f"{lib}/"):
            return lib.replace("/", ".")
    return None


def _is_user(filename: str) -> bool:
    norm = filename.replace("\\", "/")
    return not ("site-packages/" in norm or "dist-packages/" in norm or "/lib/python3" in norm
                or norm.startswith("<") or "/torch/" in norm)


def origin(frames: list) -> tuple[str, str, str]:
    """(library, site, user frame) of an allocation. site: the innermost frame that is not torch's plumbing
    (file:line function); library: the package that frame is in (peft, transformers, torch.optim...), or
    "user code"; user frame: the innermost frame in the user's own code (outside every installed package)."""
    py = _python_frames(frames)
    if not py:
        cpp = " ".join(f.get("name", "") for f in frames or ())
        where = "autograd engine (backward)" if "autograd" in cpp and "Engine" in cpp else \
            ("no Python frames" if frames else "no frames recorded")
        return where, where, where
    site = next((f for f in py if not PLUMBING.search(f["filename"].replace("\\", "/"))), py[0])
    user = next((f for f in py if _is_user(f["filename"])), None)
    lib = _library(site["filename"]) or ("user code" if _is_user(site["filename"]) else "other library")
    return lib, _fmt(site), _fmt(user) if user else "-"


def _fmt(frame: dict) -> str:
    name = frame["filename"].replace("\\", "/")
    short = "/".join(name.split("/")[-2:])
    return f"{short}:{frame['line']} {frame.get('name', '')}"


_LINES, _NAMES = operator.itemgetter("line"), operator.itemgetter("name")
_OWNER_CACHE: dict = {}


def owner(frames: list, annotation: str | None) -> str:
    """profkit's owner of an allocation where its frames or the annotation around it say so. Called for every
    allocation in a history of up to a million events, so stacks are keyed by their lines and names (built in C)
    and classified once per distinct stack: measured 8 s -> 2 s on a million events."""
    try:
        key = (annotation, tuple(map(_LINES, frames or ())), tuple(map(_NAMES, frames or ())))
    except (KeyError, TypeError):
        return _owner(frames, annotation)
    found = _OWNER_CACHE.get(key)
    if found is None:
        if len(_OWNER_CACHE) > 100_000:
            _OWNER_CACHE.clear()
        found = _OWNER_CACHE[key] = _owner(frames, annotation)
    return found


def _owner(frames: list, annotation: str | None) -> str:
    if annotation:
        if "Optimizer.step" in annotation:
            return "optimizer step"
        if "zero_grad" in annotation:
            return "optimizer zero_grad"
    accumulate = engine = backward = forward = False
    for f in frames or ():
        name = f.get("name", "")
        file = f.get("filename", "")
        if file.endswith(".py"):
            if "optim" in file and (name == "step" or "/optim/" in file.replace("\\", "/")):
                return "optimizer step"
            if name == "backward":
                backward = True
            elif name == "forward":
                forward = True
        elif "AccumulateGrad" in name:
            accumulate = True
        elif "Engine" in name and "autograd" in name:
            engine = True
    if accumulate:
        return "gradients (AccumulateGrad)"
    if engine or backward:
        return "backward"
    if forward:
        return "forward"
    return "other" if frames else "unknown (no frames)"


# --------------------------------------------------------------------------- analysis

@dataclass
class SnapshotAnalysis:
    path: Path
    devices: pd.DataFrame  # one row per device: reserved, allocated, fragmentation, peaks...
    segment_sizes: pd.DataFrame  # device, bucket, segments, bytes
    oom: pd.DataFrame  # one row per OOM event: request, device free, largest block, verdict
    live: pd.DataFrame  # device, instant (snapshot|peak|oom), library, site, user_frame, owner, bytes, allocations
    timeline: pd.DataFrame  # device, t_s, allocated_bytes, reserved_bytes, plus allocated by owner
    settings: dict
    notes: list[str] = field(default_factory=list)


def analyse_snapshot(path: Path) -> SnapshotAnalysis:
    data = load_snapshot(path)
    segments = data["segments"]
    traces = data.get("device_traces") or []
    settings = data.get("allocator_settings") or {}
    if not segments and not any(traces):
        raise EmptySnapshotError(Path(path))
    notes: list[str] = []
    devices = sorted({s.get("device", 0) for s in segments} | set(range(len(traces)) if any(traces) else set()))
    annotations = _annotation_windows(data.get("external_annotations") or [])
    rows, sizes, ooms, live, timeline = [], [], [], [], []
    for dev in devices:
        segs = [s for s in segments if s.get("device", 0) == dev]
        events = traces[dev] if dev < len(traces) and traces[dev] else []
        state = _state(segs, settings)
        hist = _history(events, state, segs, annotations.get(dev, []))
        rows.append({"device": dev, **state, **hist.peaks, "history_events": len(events)})
        sizes += [{"device": dev, **r} for r in _segment_sizes(segs)]
        ooms += [{"device": dev, **_verdict(o, state, hist, segs)} for o in hist.ooms]
        live += [{"device": dev, "instant": "snapshot", **r} for r in _group(_live_at_dump(segs, annotations.get(dev, [])))]
        if hist.live_at_peak is not None:
            live += [{"device": dev, "instant": "peak", **r} for r in _group(hist.live_at_peak)]
        for k, items in enumerate(hist.live_at_oom):
            live += [{"device": dev, "instant": f"oom{'' if k == 0 else k + 1}", **r} for r in _group(items)]
        if len(hist.timeline):
            timeline.append(hist.timeline.assign(device=dev))
            if (hist.timeline.allocated_bytes > hist.timeline.reserved_bytes).any() or \
                    (hist.timeline[["allocated_bytes", "reserved_bytes"]] < 0).any().any():
                notes.append(f"device {dev}: the history does not agree with the segments (allocated above reserved, "
                             "or below zero, at some point): a synthetic or edited snapshot? Figures over time are "
                             "not trustworthy")
        if not events:
            notes.append(f"device {dev}: no allocation history in this snapshot (record it with "
                         "torch.cuda.memory._record_memory_history() before the dump); the state at the dump only")
        elif hist.legacy:
            notes.append(f"device {dev}: a torch 2.0 snapshot: its history holds only a 'snapshot' action")
    if not ooms and _looks_oom(path):
        notes.append("the file name says OOM but its history has no 'oom' event (an OOM observer dumped it, or the "
                     "history was not recorded): the state at the dump is shown; the request is unknown")
    return SnapshotAnalysis(Path(path), pd.DataFrame(rows), pd.DataFrame(sizes), pd.DataFrame(ooms, columns=OOM_COLUMNS),
                            pd.DataFrame(live, columns=LIVE_COLUMNS),
                            pd.concat(timeline, ignore_index=True) if timeline else pd.DataFrame(), settings, notes)


OOM_COLUMNS = ["device", "t_s", "request_bytes", "device_free_bytes", "cached_free_bytes", "largest_free_block_bytes",
               "allocated_bytes", "reserved_bytes", "verdict", "explanation"]
LIVE_COLUMNS = ["device", "instant", "owner", "library", "site", "user_frame", "bytes", "allocations"]


def _looks_oom(path: Path) -> bool:
    return "oom" in Path(path).name.lower()


def _state(segs: list, settings: dict) -> dict:
    """The allocator's state at the dump, from the segments and their blocks."""
    reserved = sum(s["total_size"] for s in segs)
    blocks = [b for s in segs for b in s.get("blocks", [])]
    active = sum(b["size"] for b in blocks if b.get("state") in ACTIVE)
    allocated = sum(b["size"] for b in blocks if b.get("state") == "active_allocated")
    requested = sum(b.get("requested_size", b["size"]) for b in blocks if b.get("state") in ACTIVE)
    free_blocks = [b["size"] for b in blocks if b.get("state") == "inactive"]
    # A split block: free space inside a segment that still holds live blocks (it cannot be returned to the device).
    split = [b["size"] for s in segs if any(x.get("state") in ACTIVE for x in s.get("blocks", []))
             for b in s.get("blocks", []) if b.get("state") == "inactive"]
    largest = max(free_blocks, default=0)
    free = reserved - active
    expandable = bool(settings.get("expandable_segments")) or any(s.get("is_expandable") for s in segs)
    return {"reserved_bytes": reserved, "allocated_bytes": active, "active_allocated_bytes": allocated,
            "requested_bytes": requested, "rounding_bytes": active - requested, "free_in_reserved_bytes": free,
            "largest_free_block_bytes": largest, "free_blocks": len(free_blocks),
            "inactive_split_blocks": len(split), "inactive_split_bytes": sum(split),
            "empty_segment_bytes": sum(s["total_size"] for s in segs
                                       if not any(b.get("state") in ACTIVE for b in s.get("blocks", []))),
            "fragmentation": (1 - largest / free) if free > 0 else 0.0,
            "segments": len(segs), "small_segments": sum(s.get("segment_type") == "small" for s in segs),
            "large_segments": sum(s.get("segment_type") == "large" for s in segs),
            "expandable_segments": expandable,
            "max_split_size_bytes": settings.get("max_split_size") if settings.get("max_split_size", -1) > 0 else None}


def _segment_sizes(segs: list) -> list[dict]:
    out = []
    bounds = [b for b, _ in SIZE_BUCKETS] + [float("inf")]
    for (low, name), high in zip(SIZE_BUCKETS, bounds[1:]):
        inside = [s["total_size"] for s in segs if low <= s["total_size"] < high]
        if inside:
            out.append({"bucket": name, "segments": len(inside), "bytes": sum(inside)})
    return out


def _annotation_windows(annotations: list) -> dict[int, list[tuple[float, float, str]]]:
    """External annotations (record_function ranges the allocator saw, e.g. Optimizer.step) as time windows."""
    open_: dict[tuple, float] = {}
    out: dict[int, list] = defaultdict(list)
    for a in sorted(annotations, key=lambda a: a.get("time_us", 0)):
        key = (a.get("device", 0), a.get("name"))
        if a.get("stage") == "START":
            open_[key] = a.get("time_us", 0)
        elif a.get("stage") == "END" and key in open_:
            out[key[0]].append((open_.pop(key), a.get("time_us", 0), a.get("name") or ""))
    return out


def _annotation_at(windows: list, t: float | None) -> str | None:
    if t is None:
        return None
    for start, end, name in windows:
        if start <= t <= end:
            return name
    return None


@dataclass
class _History:
    peaks: dict
    timeline: pd.DataFrame
    live_at_peak: list | None
    ooms: list
    live_at_oom: list
    legacy: bool = False


def _history(events: list, state: dict, segs: list, windows: list) -> _History:
    if not events or all(e.get("action") == "snapshot" for e in events):
        return _History({}, pd.DataFrame(), None, [], [], legacy=bool(events))
    n = len(events)
    d_alloc = np.zeros(n)
    d_reserved = np.zeros(n)
    owners_of: list = [None] * n
    t0 = next((e["time_us"] for e in events if "time_us" in e), None)
    times = np.array([(e.get("time_us", t0) - t0) / 1e6 if t0 is not None else i for i, e in enumerate(events)], float)
    owner_at: dict[int, str] = {}
    for i, e in enumerate(events):
        action, size = e.get("action"), e.get("size", 0)
        if action == "alloc":
            d_alloc[i] = size
            owners_of[i] = owner_at[e.get("addr")] = owner(
                e.get("frames"), _annotation_at(windows, e.get("time_us")) if windows else None)
        elif action == "free_completed":
            d_alloc[i] = -size
            owners_of[i] = owner_at.pop(e.get("addr"), BEFORE)
        elif action in ("segment_alloc", "segment_map"):
            d_reserved[i] = size
        elif action in ("segment_free", "segment_unmap"):
            d_reserved[i] = -size
    # Backwards from the dump: the value after event i is the end value minus every later change. The history
    # records requested sizes (before the allocator's rounding), so allocated over time is anchored on the
    # requested bytes of the blocks live at the dump.
    allocated = state["requested_bytes"] - (np.cumsum(d_alloc[::-1])[::-1] - d_alloc)
    reserved = state["reserved_bytes"] - (np.cumsum(d_reserved[::-1])[::-1] - d_reserved)
    p_alloc, p_res = int(np.argmax(allocated)), int(np.argmax(reserved))
    peaks = {"peak_allocated_bytes": int(allocated[p_alloc]), "peak_allocated_s": float(times[p_alloc]),
             "peak_reserved_bytes": int(reserved[p_res]), "peak_reserved_s": float(times[p_res]),
             "history_s": float(times[-1] - times[0])}
    oom_idx = [i for i, e in enumerate(events) if e.get("action") == "oom"]
    live_at_peak, live_at_oom = _replay_live(events, segs, [p_alloc] + oom_idx,
                                             [o if events[i].get("action") == "alloc" else None
                                              for i, o in enumerate(owners_of)])
    ooms = [{"t_s": float(times[i]), "request_bytes": events[i].get("size"),
             "device_free_bytes": events[i].get("device_free"), "allocated_bytes": int(allocated[i]),
             "reserved_bytes": int(reserved[i]), "last": not any(e.get("action") in ("alloc", "free_completed",
                                                                                      "segment_alloc", "segment_free")
                                                                  for e in events[i + 1:])}
            for i in oom_idx]
    return _History(peaks, _timeline(times, allocated, reserved, d_alloc, owners_of), live_at_peak, ooms,
                    live_at_oom)


def _replay_live(events: list, segs: list, instants: list[int], owners_of: list) -> tuple[list, list]:
    """What was allocated at each of ``instants`` (event indices): (bytes, frames, owner) per allocation. An
    allocation made before the history began is known only by its free (or by its block at the dump)."""
    wanted = sorted(set(instants))
    live: dict[int, tuple] = {}
    seen: set[int] = set()
    snapshots: dict[int, dict] = {}
    freed_later: dict[int, list] = defaultdict(list)  # instant -> pre-history allocations freed after it
    k = 0
    for i, e in enumerate(events):
        action = e.get("action")
        if action == "alloc":
            live[e["addr"]] = (e.get("size", 0), e.get("frames"), owners_of[i])
            seen.add(e["addr"])
        elif action == "free_completed":
            if e.get("addr") in live:
                del live[e["addr"]]
            elif e.get("addr") not in seen:
                for w in wanted:
                    if w < i:  # allocated before the history and still live at instant w
                        freed_later[w].append((e.get("size", 0), [], BEFORE))
        while k < len(wanted) and wanted[k] == i:
            snapshots[i] = dict(live)
            k += 1
    # Still live at the dump, allocated before the history: the block's own frames say where, if recorded.
    never_seen = [(b.get("requested_size", b["size"]), frames, owner(frames, None) if frames else BEFORE)
                  for s in segs for b in s.get("blocks", []) if b.get("state") in ACTIVE
                  and b.get("address") is not None and b["address"] not in seen
                  for frames in [b.get("frames") or _legacy_frames(b)]]
    out = [list(snapshots.get(w, {}).values()) + freed_later.get(w, []) + never_seen for w in instants]
    return out[0], out[1:]


def _legacy_frames(block: dict) -> list:
    history = block.get("history") or []
    return history[-1].get("frames", []) if history else []


def _live_at_dump(segs: list, windows: list) -> list:
    return [(b["size"], b.get("frames") or _legacy_frames(b), owner(b.get("frames") or _legacy_frames(b), None))
            for s in segs for b in s.get("blocks", []) if b.get("state") in ACTIVE]


def _group(items: list) -> list[dict]:
    """Live allocations grouped by owner and origin, the largest first."""
    groups: dict[tuple, list] = defaultdict(lambda: [0, 0])
    for size, frames, own in items:
        key = (own, *origin(frames))
        groups[key][0] += size
        groups[key][1] += 1
    rows = [{"owner": o, "library": lib, "site": site, "user_frame": user, "bytes": b, "allocations": n}
            for (o, lib, site, user), (b, n) in groups.items()]
    return sorted(rows, key=lambda r: -r["bytes"])


def _timeline(times, allocated, reserved, d_alloc, owners_of) -> pd.DataFrame:
    """Allocated and reserved over time, at most TIMELINE_POINTS samples (the peaks always among them), with
    allocated split by owner: each free is charged to the owner of what it frees, and what was allocated before
    the history began is the rest."""
    n = len(times)
    keep = np.unique(np.concatenate([np.linspace(0, n - 1, min(n, TIMELINE_POINTS)).astype(int),
                                     [int(np.argmax(allocated)), int(np.argmax(reserved))]]))
    names = sorted({o for o in owners_of if o is not None and o != BEFORE})
    index = {o: j for j, o in enumerate(names)}
    by_owner = np.zeros((n, len(names)))
    for i, o in enumerate(owners_of):
        if o in index:
            by_owner[i, index[o]] = d_alloc[i]
    cumulative = np.cumsum(by_owner, axis=0)[keep]
    frame = pd.DataFrame({"t_s": times[keep], "allocated_bytes": allocated[keep], "reserved_bytes": reserved[keep]})
    for j, o in enumerate(names):
        frame[f"allocated_bytes.{o}"] = cumulative[:, j]
    frame[f"allocated_bytes.{BEFORE}"] = frame.allocated_bytes - cumulative.sum(axis=1)
    return frame


def _verdict(oom: dict, state: dict, hist: _History, segs: list) -> dict:
    """Why an allocation failed, with its numbers: fragmentation (the free memory was there, not in one piece)
    or a true shortage (even all of it would not do)."""
    request, device_free = oom.get("request_bytes") or 0, oom.get("device_free_bytes") or 0
    row = {k: oom.get(k) for k in ("t_s", "request_bytes", "device_free_bytes", "allocated_bytes", "reserved_bytes")}
    if oom["last"]:  # nothing was allocated or freed after it: the segments at the dump are the state at the OOM
        pool = "small" if request < SMALL_REQUEST else "large"
        cached = state["free_in_reserved_bytes"]
        largest = max((b["size"] for s in segs if s.get("segment_type", pool) == pool for b in s.get("blocks", [])
                       if b.get("state") == "inactive"), default=0)
    else:
        cached, largest = oom["reserved_bytes"] - oom["allocated_bytes"], None
    row.update(cached_free_bytes=cached, largest_free_block_bytes=largest)

    if largest is not None and request <= largest:
        row.update(verdict="other stream or pool", explanation=(
            f"a free cached block of {h(largest)} could hold the {h(request)} request: it belongs to another "
            "stream or memory pool (CUDA graphs), which this request may not use"))
    elif request <= device_free:
        row.update(verdict="allocator limit", explanation=(
            f"the device reported {h(device_free)} free, enough for {h(request)}: a memory fraction limit "
            "(torch.cuda.set_per_process_memory_fraction) or the segment's rounding stopped it"))
    elif request <= cached + device_free:
        expandable = state["expandable_segments"]
        fix = ("expandable segments are already on, so the free pages were in other segments' address ranges"
               if expandable else "with expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) "
               "free memory is mapped into one growing segment and the request would have fit")
        if state["inactive_split_bytes"] > request and not state.get("max_split_size_bytes"):
            fix += (f"; {h(state['inactive_split_bytes'])} sit in split blocks of partly used segments, which "
                    "max_split_size_mb (blocks above it are never split) would keep whole")
        row.update(verdict="fragmentation", explanation=(
            f"tried to allocate {h(request)}; {h(device_free)} free on the device and {h(cached)} free inside "
            f"reserved segments ({h(cached + device_free)} in all), but the largest contiguous free block was "
            f"{h(largest) if largest is not None else 'unknown'}: {fix}"))
    else:
        row.update(verdict="true shortage", explanation=(
            f"tried to allocate {h(request)}; even every free byte ({h(device_free)} on the device and "
            f"{h(cached)} cached) is {h(request - cached - device_free)} short: what was live is listed "
            "at this OOM"))
    return row
