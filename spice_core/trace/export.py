"""Exports of a run's trace: Chrome-trace JSON (open it in Perfetto) and CSV tables.

    TraceEvent[] ──► assign_tracks ──► chrome_trace_events ──► build_chrome_trace ──► .json / .json.gz
                     (lane -> track:                (X / i / C / M dicts,
                      overflow "copy#2" when         µs, one pid, one tid
                      slices partially overlap)      per track)
    StepStats[]  ──► per_token_frame ──► .csv          TraceEvent[] ──► events_frame ──► .csv

Chrome-trace conventions used here (the "JSON Object Format"):
- one pid per run, one tid per *track*; a track is a lane (``gpu``, ``copy``, ``cpu0``.., ``host``)
  or an overflow of one (``copy#2``) used when a modeled trace puts two partially overlapping
  intervals on one lane (several logical streams). Slices on one tid are therefore always
  properly nested or disjoint, which Perfetto and chrome://tracing need to draw them.
- tracks are ordered gpu, copy, cpu0..cpuN, host, then unknown lanes by name; overflow tracks
  follow their lane.
- ``ts``/``dur`` are microseconds, rounded to the nanosecond; positive-length events are "X"
  slices, zero-length events "i" instants with thread scope.
- per-token "C" counters (experts hit/late/missed: distinct experts per layer, as the per-token CSV's
  experts_* columns; copied MB) are derived from the events themselves.
- a prefetch that came late (its ``prefetch_hit`` instant's detail is ``LATE_DETAIL``: the layer stalled
  for it) is named apart: the instant is ``prefetch_late L<l> E<e>`` in category ``spice.prefetch_late``
  (its args keep the event's kind), and the counters and the CSV count it neither hit nor miss.

This module deliberately does not know how events were produced (measured or modeled), what a
policy is, or anything of torch, TensorBoard or the UI: it turns plain records into files.
"""
from __future__ import annotations

import functools
import gzip
import json
import math
import os
import re
import stat
import tempfile
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import pandas as pd

from spice_core.records import StepStats
from spice_core.trace.events import LATE_DETAIL, TraceEvent
from spice_core.trace.metrics import ACCOUNT_OUTCOMES, LATE_OUTCOME, accounted_outcomes

SPICE_PID = 1
CATEGORY = "spice"              # prefix of every slice's "cat"; no TensorBoard category uses it
COUNTER_TID = 0                 # counters and process-level metadata; tracks start at tid 1
_US_DECIMALS = 3                # µs rounded to ns: enough, and nesting is checked on these values
_HIT_KINDS = ("hit", "prefetch_hit")     # instants; a late prefetch_hit counts apart (`_account_kind`)
_MISS_KINDS = ("miss",)
_COPY_KINDS = ("copy", "prefetch")
_CPU_LANE = re.compile(r"^cpu(\d+)$")

# One unit per column, said in its name: ``*_selections`` count router selections (tokens x top-k, so token 0
# counts every prompt token's), ``experts_*`` count the distinct experts of each layer with that outcome (an
# expert chosen by several prompt tokens once), ``bytes_copied`` are native bytes and ``shape_bytes_copied`` the
# timed shape's (those step_ms is for; the Chrome trace's "copied MB" counts these), times ms in the row's timing mode.
# The outcomes are trace.metrics' accounts: experts_prefetch_hit are prefetches in time, experts_prefetch_late those
# whose copy came after their layer needed it (a stall). hit_selections is the engine's count of selections the
# cache served, late prefetches' included: the engine records outcomes per expert, not per selection.
PER_TOKEN_COLUMNS = (
    "index", "token_id", "text", "step_ms", "timing", "hit_selections", "miss_selections", "bytes_copied",
    "shape_bytes_copied", "stall_ms", "lookahead_depth", *(f"experts_{o}" for o in ACCOUNT_OUTCOMES),
)
EVENT_COLUMNS = (
    "token", "layer", "expert", "lane", "kind", "start_ms", "end_ms", "dur_ms", "bytes", "timing", "detail",
)


# ---------------------------------------------------------------------------------------------
# tracks

def track_sort_key(track: str) -> tuple:
    """Display order: gpu, copy, cpu0..cpuN (numerically), host, other lanes by name; ``lane#k`` after ``lane``."""
    lane, _, slot = track.partition("#")
    slot_no = int(slot) if slot.isdigit() else 1
    cpu = _CPU_LANE.match(lane)
    if lane == "gpu":
        group = (0, 0, "")
    elif lane == "copy":
        group = (1, 0, "")
    elif cpu:
        group = (2, int(cpu.group(1)), "")
    elif lane == "host":
        group = (3, 0, "")
    else:
        group = (4, 0, lane)
    return group + (slot_no,)


def _us(ms: float) -> float:
    return round(ms * 1000.0, _US_DECIMALS)


def _check_event(ev: TraceEvent) -> None:
    if not (math.isfinite(ev.start_ms) and math.isfinite(ev.end_ms)) or ev.end_ms < ev.start_ms:
        raise ValueError(f"trace event has an invalid interval [{ev.start_ms}, {ev.end_ms}] ms: {ev!r}")


def _place(evs: Sequence[TraceEvent], origin_ms: float, ts_offset_us: float
           ) -> list[tuple[str, float, float]]:
    """(track, ts_us, end_us) per event, in input order; see `assign_tracks`."""
    placed = []
    for ev in evs:
        _check_event(ev)
        ts = round(_us(ev.start_ms - origin_ms) + ts_offset_us, _US_DECIMALS)
        end = round(_us(ev.end_ms - origin_ms) + ts_offset_us, _US_DECIMALS)
        placed.append([ev.lane, ts, end])
    by_lane: dict[str, list[int]] = defaultdict(list)
    for i, (lane, ts, end) in enumerate(placed):
        if end > ts:
            by_lane[lane].append(i)
    for lane, idxs in by_lane.items():
        idxs.sort(key=lambda i: (placed[i][1], -placed[i][2]))
        stacks: list[list[float]] = []    # per slot: end times (µs) of the open slices, outermost first
        for i in idxs:
            _, start, end = placed[i]
            for slot, stack in enumerate(stacks):
                # Later intervals start no earlier than this one, so closed slices stay closed.
                while stack and stack[-1] <= start:
                    stack.pop()
                if not stack or end <= stack[-1]:
                    break
            else:
                slot, stack = len(stacks), []
                stacks.append(stack)
            stack.append(end)
            placed[i][0] = lane if slot == 0 else f"{lane}#{slot + 1}"
    return [tuple(p) for p in placed]


def assign_tracks(events: Iterable[TraceEvent]) -> list[tuple[str, TraceEvent]]:
    """Give every event a track name so that slices on one track never partially overlap.

    Intervals of a lane are visited by (start, longest first); each goes to the first track of
    its lane (``lane``, ``lane#2``, ...) on which it is disjoint from, or nested inside, what is
    already open there. Instants stay on the lane's own track. Returns (track, event) pairs in
    the input order. The Chrome export decides on its own rounded µs values, which can differ
    from this at the nanosecond level.
    """
    evs = list(events)
    return [(track, ev) for (track, _, _), ev in zip(_place(evs, 0.0, 0.0), evs)]


# ---------------------------------------------------------------------------------------------
# Chrome trace

def _account_kind(ev: TraceEvent) -> str:
    """The event's kind, except a late prefetch's instant: ``prefetch_late``."""
    return LATE_OUTCOME if ev.kind == "prefetch_hit" and ev.detail == LATE_DETAIL else ev.kind


def _slice_name(ev: TraceEvent) -> str:
    if ev.kind == "token":
        return f"token {ev.token}"
    parts = [_account_kind(ev)]
    if ev.layer >= 0:
        parts.append(f"L{ev.layer}")
    if ev.expert >= 0:
        parts.append(f"E{ev.expert}")
    return " ".join(parts)


def _args(ev: TraceEvent, track: str) -> dict:
    return {
        "token": ev.token, "layer": ev.layer, "expert": ev.expert, "bytes": ev.bytes, "kind": ev.kind,
        "timing": ev.timing, "detail": ev.detail, "lane": ev.lane, "track": track,
        "start_ms": ev.start_ms, "dur_ms": ev.dur_ms,
    }


def _counter_events(events: Sequence[TraceEvent], pid: int | str, origin_ms: float,
                    ts_offset_us: float) -> list[dict]:
    """Per-token counters sampled where the token starts (its "token" slice, else its first event): hit / late
    prefetch / miss instants and copied MB."""
    first_ms: dict[int, float] = {}
    token_ms: dict[int, float] = {}
    hits: dict[int, int] = defaultdict(int)
    late: dict[int, int] = defaultdict(int)
    misses: dict[int, int] = defaultdict(int)
    copied: dict[int, int] = defaultdict(int)
    for ev in events:
        if ev.token < 0:
            continue
        first_ms[ev.token] = min(first_ms.get(ev.token, ev.start_ms), ev.start_ms)
        if ev.kind == "token":
            token_ms[ev.token] = ev.start_ms
        elif ev.kind in _HIT_KINDS:
            if _account_kind(ev) == LATE_OUTCOME:
                late[ev.token] += 1
            else:
                hits[ev.token] += 1
        elif ev.kind in _MISS_KINDS:
            misses[ev.token] += 1
        elif ev.kind in _COPY_KINDS:
            copied[ev.token] += ev.bytes
    out = []
    for token in sorted(first_ms):
        ts = round(_us(token_ms.get(token, first_ms[token]) - origin_ms) + ts_offset_us, _US_DECIMALS)
        out.append({"ph": "C", "name": "experts hit/late/missed", "cat": CATEGORY, "pid": pid, "tid": COUNTER_TID,
                    "ts": ts, "args": {"hit_experts": hits[token], "late_experts": late[token],
                                       "miss_experts": misses[token]}})
        out.append({"ph": "C", "name": "copied MB", "cat": CATEGORY, "pid": pid, "tid": COUNTER_TID,
                    "ts": ts, "args": {"MB": copied[token] / 1e6}})
    return out


def chrome_trace_events(events: Iterable[TraceEvent], *, pid: int | str = SPICE_PID,
                        process_name: str = "SPICE", process_sort_index: int = 0,
                        ts_offset_us: float = 0.0) -> list[dict]:
    """Chrome-trace event dicts for one run: metadata, slices, instants and counters.

    ``ts_offset_us`` shifts every timestamp (used to place the run beside another trace). Event
    times are taken relative to the earliest start when that is negative (a measured clock may
    start slightly before the run's zero), so timestamps are never negative.
    """
    evs = list(events)
    origin_ms = min(min((ev.start_ms for ev in evs), default=0.0), 0.0)
    placed = _place(evs, origin_ms, ts_offset_us)
    track_names = sorted({track for track, _, _ in placed}, key=track_sort_key)
    tids = {track: n for n, track in enumerate(track_names, start=COUNTER_TID + 1)}

    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": COUNTER_TID, "args": {"name": process_name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": COUNTER_TID,
         "args": {"sort_index": process_sort_index}},
    ]
    for track, tid in tids.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": track}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    body = []
    for (track, ts, end), ev in zip(placed, evs):
        rec = {"name": _slice_name(ev), "cat": f"{CATEGORY}.{_account_kind(ev)}", "pid": pid, "tid": tids[track],
               "ts": ts, "args": _args(ev, track)}
        if end > ts:
            rec.update(ph="X", dur=round(end - ts, _US_DECIMALS))
        else:
            rec.update(ph="i", s="t")
        body.append(rec)
    # Outer slices before the slices they contain: what viewers expect when they stream a file.
    body.sort(key=lambda r: (r["ts"], -r.get("dur", 0.0)))
    return out + body + _counter_events(evs, pid, origin_ms, ts_offset_us)


def jsonable(obj):
    """A JSON-safe copy of ``obj``: non-finite floats become None, tuples lists, others ``str``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, (int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if hasattr(obj, "item") and callable(obj.item):     # numpy / torch scalars
        return jsonable(obj.item())
    return str(obj)


def build_chrome_trace(events: Iterable[TraceEvent], *, metadata: dict) -> dict:
    """The JSON Object Format dict: traceEvents, displayTimeUnit "ms", otherData = metadata."""
    meta = jsonable(dict(metadata))
    timing = meta.get("timing")
    run_id = meta.get("run_id")
    name = "SPICE" + (f" {run_id}" if run_id else "") + (f" ({timing})" if timing else "")
    return {"traceEvents": chrome_trace_events(events, process_name=name),
            "displayTimeUnit": "ms", "otherData": meta}


@contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A scratch file beside ``path`` to write into: it becomes ``path`` (``os.replace``) when the block ends
    normally and is removed when it raises (a full disk, Ctrl-C), so ``path`` is never a cut-short file, and an
    earlier export there is kept until the new one is whole. The folder is made if needed.

    Where no scratch file can stand in for ``path``, it is written in place, as a plain write would, and is then not
    whole-or-absent (a failure leaves what was written): a device or a pipe (``/dev/stdout``), and a writable file in
    a folder this process may not add files to."""
    path = Path(path)
    try:
        st = os.stat(path)          # through any link: /dev/stdout to a pipe is a link to "pipe:[N]", no real path
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        yield path
        return
    path = Path(os.path.realpath(path)) if path.is_symlink() else path    # a link to a file: write its target
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=".export-", suffix=".part")    # short: any name fits
    except PermissionError:
        if not (path.is_file() and os.access(path, os.W_OK)):
            raise
        scratch = None
    if scratch is None:
        yield path
        return
    os.close(fd)
    try:
        os.chmod(scratch, _mode_for(path))       # mkstemp's 0600 would make every export private
        yield Path(scratch)
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def _mode_for(path: Path) -> int:
    """The permissions a plain write would give ``path``: an existing file's own, else 0666 less the umask (read
    from /proc on Linux; 0644 where it cannot be read without changing it)."""
    try:
        return stat.S_IMODE(path.stat().st_mode)
    except OSError:
        pass
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644


JSON_CHUNK_EVENTS = 10_000      # trace events encoded at a time by `json_pieces`


def json_pieces(obj, chunk: int = JSON_CHUNK_EVENTS) -> Iterator[str]:
    """``obj`` as strict compact JSON (no NaN), in pieces whose concatenation is ``json.dumps(obj)``'s text: a long
    "traceEvents" list (wherever it sits among the keys: the TensorBoard trace puts it after its schema fields) goes
    ``chunk`` events at a time, so a long run's trace is never one string (with its bytes copy, twice the file in
    memory on top of the events)."""
    dumps = functools.partial(json.dumps, allow_nan=False, separators=(",", ":"))
    events = obj.get("traceEvents") if isinstance(obj, dict) else None
    if not isinstance(events, list) or len(events) <= chunk:
        yield dumps(obj)
        return
    yield "{"
    for n, (key, value) in enumerate(obj.items()):
        head = ("," if n else "") + dumps(key) + ":"
        if key != "traceEvents":
            yield head + dumps(value)
            continue
        yield head + "["
        for i in range(0, len(value), chunk):
            yield ("," if i else "") + dumps(value[i:i + chunk])[1:-1]
        yield "]"
    yield "}"


def write_json(obj: dict, path: Path) -> Path:
    """Write ``obj`` as strict JSON (no NaN); gzip it when ``path`` ends in ``.gz``. Whole or not at all."""
    path = Path(path)
    gz = path.suffix.lower() == ".gz"
    with written_whole(path) as scratch, open(scratch, "wb") as raw:
        # mtime=0: the same trace gives the same bytes; the name stored is the export's own (gzip takes the
        # scratch file's by default, which `gunzip -N` restores: a hidden .part file).
        out = gzip.GzipFile(filename=path.stem, fileobj=raw, mode="wb", mtime=0) if gz else raw
        with out:
            for piece in json_pieces(obj):
                out.write(piece.encode("utf-8"))
    return path


def write_chrome_trace(events: Iterable[TraceEvent], path: Path, *, metadata: dict) -> Path:
    """Write a Chrome-trace JSON file (``.json``, or gzipped ``.json.gz``) for Perfetto; returns ``path``."""
    return write_json(build_chrome_trace(events, metadata=metadata), Path(path))


# ---------------------------------------------------------------------------------------------
# CSV tables

def per_token_frame(steps: Sequence[StepStats]) -> pd.DataFrame:
    """One row per generated token: the StepStats scalars plus a count of experts per accounted outcome (units:
    see PER_TOKEN_COLUMNS)."""
    rows = []
    for s in steps:
        counts = dict.fromkeys(ACCOUNT_OUTCOMES, 0)
        for o in accounted_outcomes(s):
            if o.outcome in counts:
                counts[o.outcome] += 1
        rows.append({
            "index": s.index, "token_id": s.token_id, "text": s.text, "step_ms": s.step_ms,
            "timing": s.timing, "hit_selections": s.hits, "miss_selections": s.misses, "bytes_copied": s.bytes_copied,
            "shape_bytes_copied": s.shape_bytes_copied, "stall_ms": s.stall_ms, "lookahead_depth": s.lookahead_depth,
            **{f"experts_{o}": n for o, n in counts.items()},
        })
    return pd.DataFrame(rows, columns=list(PER_TOKEN_COLUMNS))


def write_per_token_csv(steps: Sequence[StepStats], path: Path) -> Path:
    path = Path(path)
    frame = per_token_frame(steps)
    with written_whole(path) as scratch:
        frame.to_csv(scratch, index=False)
    return path


def events_frame(events: Iterable[TraceEvent]) -> pd.DataFrame:
    """One row per event, in the given order, with ``dur_ms`` added."""
    rows = [{**ev.as_dict(), "dur_ms": ev.dur_ms} for ev in events]
    return pd.DataFrame(rows, columns=list(EVENT_COLUMNS))


def write_events_csv(events: Iterable[TraceEvent], path: Path) -> Path:
    path = Path(path)
    frame = events_frame(events)
    with written_whole(path) as scratch:
        frame.to_csv(scratch, index=False)
    return path
