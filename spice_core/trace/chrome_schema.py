"""A checker for Chrome-trace (Trace Event Format) JSON, strict where viewers are fragile.

`validate_chrome_trace(obj)` returns a list of human-readable problems; an empty list means the
trace is well formed. It checks:
- the container: a dict with a ``traceEvents`` list (or a bare list, the JSON Array Format);
  ``displayTimeUnit`` in {"ms", "ns"}; ``otherData`` a dict;
- every event: a known ``ph``; the keys that phase requires; ``ts``/``dur`` finite, non-negative
  numbers; ``pid``/``tid`` ints or strings (torch.profiler uses strings such as "Spans");
  ``args`` a dict; instant scope in {"g", "p", "t"}; counter values numeric;
- metadata ("M") events: a known name, and the ``args`` that name needs;
- nesting: "X" slices on one (pid, tid) are properly nested or disjoint, never partially
  overlapping, and "B"/"E" pairs balance.

Overlap is judged as Perfetto's JSON importer reads times: ``ts`` and ``dur`` each rounded to whole
nanoseconds, a slice ending at ``ts + dur``, no tolerance beyond that. So a trace near 5e12 µs
(torch.profiler's clock), where a double cannot hold µs to 3 decimals, fails where its back-to-back
slices come out 1 ns apart (Perfetto moves such a slice to another track and reports an import error).

This module deliberately does not know SPICE's lanes, event kinds or units: it judges any
Chrome trace, including the ones torch.profiler writes.
"""
from __future__ import annotations

import math
from collections import defaultdict

_KNOWN_PHASES = frozenset("BEXiICbneMsftPONDRc") | {"(", ")"}
_REQUIRED = {
    "X": ("name", "ts", "dur", "pid", "tid"),
    "B": ("name", "ts", "pid", "tid"),
    "E": ("ts", "pid", "tid"),
    "i": ("name", "ts", "pid"),
    "I": ("name", "ts", "pid"),
    "C": ("name", "ts", "pid", "args"),
    "M": ("name", "pid", "args"),
}
_REQUIRED_OTHER = ("ts", "pid")
# metadata name -> (needs tid, args key, expected type)
_METADATA = {
    "process_name": (False, "name", str),
    "process_labels": (False, "labels", str),
    "process_sort_index": (False, "sort_index", int),
    "thread_name": (True, "name", str),
    "thread_sort_index": (True, "sort_index", int),
}
MAX_PROBLEMS = 200


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _where(i: int, ev: dict) -> str:
    return f"traceEvents[{i}] (ph {ev.get('ph')!r}, name {ev.get('name')!r})"


def _check_event(i: int, ev, problems: list[str]) -> bool:
    """Per-event checks; True when the event is sound enough for the nesting checks."""
    if not isinstance(ev, dict):
        problems.append(f"traceEvents[{i}]: is a {type(ev).__name__}, not an object")
        return False
    ph = ev.get("ph")
    where = _where(i, ev)
    if not isinstance(ph, str) or ph not in _KNOWN_PHASES:
        problems.append(f"{where}: unknown or missing phase 'ph'")
        return False
    ok = True
    required = _REQUIRED.get(ph, _REQUIRED_OTHER)
    if ph in "iI" and ev.get("s", "t") == "t":
        required = required + ("tid",)
    for key in required:
        if key not in ev:
            problems.append(f"{where}: missing {key!r}")
            ok = False
    for key in ("ts", "dur"):
        if key in ev and not (_is_number(ev[key]) and ev[key] >= 0):
            problems.append(f"{where}: {key!r} must be a finite non-negative number, got {ev[key]!r}")
            ok = False
    for key in ("pid", "tid"):
        if key in ev and (isinstance(ev[key], bool) or not isinstance(ev[key], (int, str))):
            problems.append(f"{where}: {key!r} must be an int or a string, got {ev[key]!r}")
            ok = False
    if "name" in ev and not isinstance(ev["name"], str):
        problems.append(f"{where}: 'name' must be a string")
        ok = False
    if "args" in ev and not isinstance(ev["args"], dict):
        problems.append(f"{where}: 'args' must be an object")
        return False
    if ph in "iI" and ev.get("s", "t") not in ("g", "p", "t"):
        problems.append(f"{where}: instant scope 's' must be 'g', 'p' or 't', got {ev.get('s')!r}")
        ok = False
    if ph == "C" and isinstance(ev.get("args"), dict):
        if not ev["args"]:
            problems.append(f"{where}: counter has no values in 'args'")
            ok = False
        for k, v in ev["args"].items():
            if not _is_number(v):
                problems.append(f"{where}: counter value {k!r} must be a finite number, got {v!r}")
                ok = False
    if ph == "M" and isinstance(ev.get("name"), str) and isinstance(ev.get("args"), dict):
        spec = _METADATA.get(ev["name"])
        if spec is None:
            problems.append(f"{where}: unknown metadata name; use one of {', '.join(_METADATA)}")
            return False
        needs_tid, arg_key, arg_type = spec
        if needs_tid and "tid" not in ev:
            problems.append(f"{where}: missing 'tid'")
            ok = False
        value = ev["args"].get(arg_key)
        if not isinstance(value, arg_type) or isinstance(value, bool):
            problems.append(f"{where}: args[{arg_key!r}] must be a {arg_type.__name__}, got {value!r}")
            ok = False
    return ok


def _check_slices(slices: dict, events: list, problems: list[str]) -> None:
    """"X" slices of one (pid, tid) must be properly nested or disjoint."""
    for (pid, tid), idxs in slices.items():
        span = {}
        for i in idxs:
            ts_ns, dur_ns = events[i]["ts"] * 1000, events[i]["dur"] * 1000
            if math.isfinite(ts_ns) and math.isfinite(dur_ns):
                span[i] = (round(ts_ns), round(ts_ns) + round(dur_ns))     # whole ns, as Perfetto's importer rounds
            else:
                problems.append(f"{_where(i, events[i])}: ts/dur too large to hold in nanoseconds")
        idxs = sorted(span, key=lambda i: (span[i][0], -span[i][1]))
        stack: list[int] = []           # indices of open slices, outermost first
        for i in idxs:
            ts, end = span[i]
            while stack and span[stack[-1]][1] <= ts:
                stack.pop()
            if stack:
                j = stack[-1]
                if end > span[j][1]:
                    problems.append(
                        f"{_where(i, events[i])} [{ts}, {end}] ns partially overlaps "
                        f"{_where(j, events[j])} [{span[j][0]}, {span[j][1]}] ns on pid {pid!r} tid {tid!r}")
                    continue
            stack.append(i)


def _check_begin_end(begin_end: dict, events: list, problems: list[str]) -> None:
    for (pid, tid), idxs in begin_end.items():
        idxs.sort(key=lambda i: events[i]["ts"])      # stable: file order breaks ties
        depth = 0
        for i in idxs:
            if events[i]["ph"] == "B":
                depth += 1
            elif depth == 0:
                problems.append(f"{_where(i, events[i])}: 'E' without a matching 'B' on pid {pid!r} tid {tid!r}")
            else:
                depth -= 1
        if depth:
            problems.append(f"pid {pid!r} tid {tid!r}: {depth} 'B' event(s) never ended")


def validate_chrome_trace(obj) -> list[str]:
    """Problems found in a Chrome trace (JSON Object or Array Format); ``[]`` when valid."""
    problems: list[str] = []
    if isinstance(obj, list):
        events = obj
    elif isinstance(obj, dict):
        events = obj.get("traceEvents")
        if not isinstance(events, list):
            return ["'traceEvents' is missing or not a list"]
        if "displayTimeUnit" in obj and obj["displayTimeUnit"] not in ("ms", "ns"):
            problems.append(f"'displayTimeUnit' must be 'ms' or 'ns', got {obj['displayTimeUnit']!r}")
        if "otherData" in obj and not isinstance(obj["otherData"], dict):
            problems.append("'otherData' must be an object")
    else:
        return [f"a trace is an object or a list, not a {type(obj).__name__}"]

    slices: dict[tuple, list[int]] = defaultdict(list)
    begin_end: dict[tuple, list[int]] = defaultdict(list)
    for i, ev in enumerate(events):
        if not _check_event(i, ev, problems):
            continue
        if ev["ph"] == "X":
            slices[(ev["pid"], ev["tid"])].append(i)
        elif ev["ph"] in "BE":
            begin_end[(ev["pid"], ev["tid"])].append(i)
    _check_slices(slices, events, problems)
    _check_begin_end(begin_end, events, problems)

    if len(problems) > MAX_PROBLEMS:
        extra = len(problems) - MAX_PROBLEMS
        problems = problems[:MAX_PROBLEMS] + [f"... and {extra} more problems"]
    return problems
