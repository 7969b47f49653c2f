"""A TensorBoard (torch-tb-profiler) run directory holding a SPICE trace.

    tiny torch.profiler run ──► export_chrome_trace ──► genuine profiler JSON
                                                        + SPICE slices on their own pid
                                                        ──► <run_dir>/<worker>.pt.trace.json.gz

torch-tb-profiler only opens files that a profiler wrote (it reads ``schemaVersion``,
``deviceProperties``, profiler categories, ...), so rather than imitate that format we record a
few real CPU ops and merge SPICE's lanes into the result. SPICE's run starts where the
profiler's first event starts; its slices carry "spice.*" categories, which the plugin's
overview ignores and its trace view shows. Perfetto remains the documented viewer; this is
for people whose tooling is TensorBoard.

This module deliberately does not know what the events mean, nor anything of CUDA: the profile
is CPU-only and exists to make the file loadable, not to measure SPICE.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Iterable

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from spice_core.trace.events import TraceEvent
from spice_core.trace.export import chrome_trace_events, jsonable, write_json, written_whole

TRACE_SUFFIX = ".pt.trace.json.gz"


_TEMPLATE_LOCK = threading.Lock()
_template_json: str | None = None


def _profiler_trace() -> dict:
    """A genuine torch.profiler Chrome trace of a few tiny CPU ops, recorded once per process.

    The profiler is process-wide: recording it while a generation runs on another thread would
    mix that generation's ops in (and slow it down). So it is recorded once, under a lock (call
    `warm_profiler_template()` at start-up, before serving), and every export gets a fresh copy.
    """
    global _template_json
    with _TEMPLATE_LOCK:
        if _template_json is None:
            with _without_profiler_chatter(), profile(activities=[ProfilerActivity.CPU]) as prof:
                with record_function("spice.export"):
                    a = torch.ones(4, 4)
                    torch.relu(a @ a).sum()
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "profile.json"
                prof.export_chrome_trace(str(path))
                _template_json = path.read_text(encoding="utf-8")
        return json.loads(_template_json)


# The profiler's native library prints these to file descriptor 2 at every start and stop, whatever its log level.
PROFILER_CHATTER = (b"USDT:", b"STAGE:")


@contextlib.contextmanager
def _without_profiler_chatter():
    """Run the block with file descriptor 2 going to a scratch file, then write back to it every line but the
    profiler's own start/stop lines (`PROFILER_CHATTER`): what anything else wrote meanwhile is delayed, not lost."""
    _flush_stderr()
    try:
        saved = os.dup(2)
    except OSError:                        # no descriptor 2 (a process started without one): nothing to filter
        yield
        return
    with tempfile.TemporaryFile() as scratch:
        os.dup2(scratch.fileno(), 2)
        try:
            yield
        finally:
            _flush_stderr()
            os.dup2(saved, 2)
            os.close(saved)
            scratch.seek(0)
            kept = [line for line in scratch.read().splitlines(keepends=True) if not line.startswith(PROFILER_CHATTER)]
            if kept:
                os.write(2, b"".join(kept))


def _flush_stderr() -> None:
    """Flush Python's stderr, whatever it is now: None (a process started without one), closed, or replaced."""
    try:
        flush = getattr(sys.stderr, "flush", None)
        if flush is not None:
            flush()
    except (OSError, ValueError):
        pass


def warm_profiler_template() -> None:
    """Record the profiler template now (first call ~1-2 s), so no export ever runs the profiler later."""
    _profiler_trace()


def _free_pid(trace_events: list[dict]) -> int:
    pids = [e.get("pid") for e in trace_events]
    return max((p for p in pids if isinstance(p, int) and not isinstance(p, bool)), default=0) + 1


def _is_time(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _near_zero(trace: dict, base: list[dict]) -> list[dict]:
    """The profiler's events moved back by whole µs to start near 0, ``trace``'s ``baseTimeNanoseconds`` forward by as
    much (the same instants). torch.profiler's clock reads ~5e12 µs, where a double cannot hold µs to 3 decimals: SPICE's
    back-to-back slices placed there came out 1-2 ns overlapping once rounded, which Perfetto reports and moves."""
    if any("ts" in e and not _is_time(e["ts"]) for e in base):
        return base                # a time that is not a number: moving the others would part them from it
    times = [e["ts"] for e in base if "ts" in e and math.isfinite(e["ts"]) and e.get("ph") != "M"]
    shift_us = int(min(times, default=0.0))
    if shift_us <= 0:
        return base
    if _is_time(trace.get("baseTimeNanoseconds")):
        trace["baseTimeNanoseconds"] = trace["baseTimeNanoseconds"] + shift_us * 1000
    # Metadata events may sit at 0: they stay at 0 rather than go negative.
    return [dict(e, ts=max(0.0, e["ts"] - shift_us)) if "ts" in e and math.isfinite(e["ts"]) else e for e in base]


def merge_into_profiler_trace(profiler_trace: dict, events: Iterable[TraceEvent], *,
                              metadata: dict | None = None, trace_name: str = "spice") -> dict:
    """``profiler_trace`` with SPICE's events added on a pid of their own; the input is not changed.

    Every top-level key of the profiler's export is kept ("schemaVersion", "deviceProperties",
    "traceName", ...); SPICE's ``metadata`` goes under a new "spice" key.
    """
    merged = dict(profiler_trace)
    base = _near_zero(merged, list(profiler_trace.get("traceEvents", [])))
    starts = [e["ts"] for e in base if e.get("ph") == "X" and _is_time(e.get("ts"))]
    meta = jsonable(dict(metadata or {}))
    timing = meta.get("timing")
    spice = chrome_trace_events(
        events, pid=_free_pid(base), process_name="SPICE" + (f" ({timing})" if timing else ""),
        process_sort_index=-1, ts_offset_us=min(starts, default=0.0))
    merged["traceEvents"] = base + spice
    merged["traceName"] = trace_name
    merged["spice"] = meta
    return merged


def write_tensorboard_run(events: Iterable[TraceEvent], run_dir: Path, *, worker: str = "spice",
                          metadata: dict | None = None) -> Path:
    """Write ``<run_dir>/<worker>.pt.trace.json.gz``; point TensorBoard's logdir at ``run_dir``'s parent."""
    if not worker or "/" in worker or "\\" in worker or worker.endswith("."):
        raise ValueError(f"worker={worker!r} must be a plain file-name stem such as 'spice'")
    run_dir = Path(run_dir)
    path = run_dir / f"{worker}{TRACE_SUFFIX}"
    merged = merge_into_profiler_trace(_profiler_trace(), events, metadata=metadata, trace_name=path.name)
    return write_json(jsonable(merged), path)


def write_tensorboard_zip(events: Iterable[TraceEvent], zip_path: Path, *, run_name: str, worker: str = "spice",
                          metadata: dict | None = None) -> Path:
    """`write_tensorboard_run` into a scratch folder beside ``zip_path``, zipped so that it unpacks as
    ``<run_name>/<worker>.pt.trace.json.gz``; the scratch folder goes, whatever happens."""
    zip_path = Path(zip_path)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=zip_path.parent, prefix=".tb-") as scratch:
        run_dir = Path(scratch) / run_name
        write_tensorboard_run(events, run_dir, worker=worker, metadata=metadata)
        return zip_dir(run_dir, zip_path)


def zip_dir(run_dir: Path, zip_path: Path) -> Path:
    """Zip ``run_dir`` so that it unpacks as ``<run_dir name>/...`` (a logdir holding one run)."""
    run_dir, zip_path = Path(run_dir), Path(zip_path)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run_dir={str(run_dir)!r} is not a directory")
    with written_whole(zip_path) as scratch, zipfile.ZipFile(scratch, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for file in sorted(p for p in run_dir.rglob("*") if p.is_file()):
            if file.resolve() in (zip_path.resolve(), scratch.resolve()):
                continue
            zf.write(file, arcname=str(Path(run_dir.name) / file.relative_to(run_dir)))
    return zip_path
