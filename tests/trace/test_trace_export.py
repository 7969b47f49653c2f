"""Chrome-trace and CSV exports: tracks, units, overflow splitting, counters, files."""
from __future__ import annotations

import gzip
import json
import random

import pandas as pd
import pytest

from spice_core.api import ExpertOutcome, StepStats
from spice_core.trace.chrome_schema import validate_chrome_trace
from spice_core.trace.events import OUTCOMES, TraceEvent
from spice_core.trace.export import (
    EVENT_COLUMNS, PER_TOKEN_COLUMNS, assign_tracks, build_chrome_trace, chrome_trace_events,
    events_frame, per_token_frame, track_sort_key, write_chrome_trace, write_events_csv,
    write_per_token_csv,
)


def ev(lane, kind, start, end, token=0, layer=-1, expert=-1, nbytes=0, detail=""):
    return TraceEvent(token=token, layer=layer, expert=expert, lane=lane, kind=kind,
                      start_ms=start, end_ms=end, bytes=nbytes, detail=detail)


def thread_names(trace_events):
    """tid -> track name, from the thread_name metadata."""
    return {e["tid"]: e["args"]["name"] for e in trace_events if e["ph"] == "M" and e["name"] == "thread_name"}


def slices_by_track(trace_events):
    names = thread_names(trace_events)
    out = {}
    for e in trace_events:
        if e["ph"] == "X":
            out.setdefault(names[e["tid"]], []).append((e["ts"], e["ts"] + e["dur"]))
    return out


def test_partially_overlapping_copies_go_to_an_overflow_track():
    evs = [ev("copy", "copy", 0.0, 3.0, expert=1), ev("copy", "prefetch", 1.0, 4.0, expert=2)]
    assert [t for t, _ in assign_tracks(evs)] == ["copy", "copy#2"]
    out = chrome_trace_events(evs)
    assert slices_by_track(out) == {"copy": [(0.0, 3000.0)], "copy#2": [(1000.0, 4000.0)]}
    assert validate_chrome_trace({"traceEvents": out}) == []


def test_nested_and_touching_intervals_stay_on_the_lane_track():
    evs = [ev("host", "token", 0.0, 10.0), ev("host", "draft", 2.0, 3.0),
           ev("host", "token", 10.0, 20.0, token=1), ev("gpu", "layer", 0.0, 1.0), ev("gpu", "expert", 1.0, 2.0)]
    assert {t for t, _ in assign_tracks(evs)} == {"host", "gpu"}


def test_overflow_reuses_the_first_track_that_has_room():
    # [0,4] and [1,5] clash; [4.5,6] fits back on "copy" once [0,4] has ended.
    evs = [ev("copy", "copy", 0, 4), ev("copy", "copy", 1, 5), ev("copy", "copy", 4.5, 6)]
    assert [t for t, _ in assign_tracks(evs)] == ["copy", "copy#2", "copy"]
    # Three mutually clashing intervals need three tracks.
    evs = [ev("copy", "copy", 0, 4), ev("copy", "copy", 1, 5), ev("copy", "copy", 2, 6)]
    assert [t for t, _ in assign_tracks(evs)] == ["copy", "copy#2", "copy#3"]


def test_an_interval_crossing_a_nested_slice_end_is_moved():
    # [0,10] contains [1,3]; [2,5] starts inside both and ends outside [1,3]: it must move.
    evs = [ev("gpu", "layer", 0, 10), ev("gpu", "expert", 1, 3), ev("gpu", "expert", 2, 5)]
    assert [t for t, _ in assign_tracks(evs)] == ["gpu", "gpu", "gpu#2"]


def test_tracks_are_ordered_gpu_copy_cpus_host():
    lanes = ["host", "cpu10", "copy", "cpu2", "gpu", "zeta"]
    evs = [ev(lane, "cpu_run", 0, 1) for lane in lanes] + [ev("copy", "prefetch", 0.5, 2)]
    out = chrome_trace_events(evs)
    sort_index = {e["tid"]: e["args"]["sort_index"] for e in out
                  if e["ph"] == "M" and e["name"] == "thread_sort_index"}
    names = thread_names(out)
    ordered = [names[tid] for tid in sorted(names, key=lambda t: sort_index[t])]
    assert ordered == ["gpu", "copy", "copy#2", "cpu2", "cpu10", "host", "zeta"]
    assert sorted(lanes + ["copy#2"], key=track_sort_key) == ordered


def test_times_are_microseconds_and_zero_length_events_are_thread_instants():
    out = chrome_trace_events([ev("copy", "copy", 1.5, 2.25, layer=3, expert=7, nbytes=17_300_000, detail="demand"),
                               ev("gpu", "hit", 2.0, 2.0, layer=3, expert=5)])
    x = next(e for e in out if e["ph"] == "X")
    assert (x["ts"], x["dur"]) == (1500.0, 750.0)
    assert x["name"] == "copy L3 E7" and x["cat"] == "spice.copy"
    assert {k: x["args"][k] for k in ("token", "layer", "expert", "bytes", "kind", "timing", "detail")} == {
        "token": 0, "layer": 3, "expert": 7, "bytes": 17_300_000, "kind": "copy", "timing": "modeled",
        "detail": "demand"}
    inst = next(e for e in out if e["ph"] == "i")
    assert inst["s"] == "t" and inst["ts"] == 2000.0 and "dur" not in inst
    assert thread_names(out)[inst["tid"]] == "gpu"


def test_per_token_counters_count_hits_misses_and_copied_bytes():
    evs = [ev("host", "token", 0, 5, token=0), ev("gpu", "hit", 1, 1), ev("gpu", "prefetch_hit", 1, 1),
           ev("gpu", "miss", 2, 2), ev("copy", "copy", 2, 3, nbytes=2_000_000),
           ev("copy", "prefetch", 3, 4, nbytes=1_000_000),
           ev("host", "token", 5, 9, token=1), ev("gpu", "miss", 6, 6, token=1)]
    counters = [e for e in chrome_trace_events(evs) if e["ph"] == "C"]
    hm = [(e["ts"], e["args"]) for e in counters if e["name"] == "experts hit/late/missed"]
    mb = [(e["ts"], e["args"]) for e in counters if e["name"] == "copied MB"]
    assert hm == [(0.0, {"hit_experts": 2, "late_experts": 0, "miss_experts": 1}),
                  (5000.0, {"hit_experts": 0, "late_experts": 0, "miss_experts": 1})]
    assert mb == [(0.0, {"MB": 3.0}), (5000.0, {"MB": 0.0})]


def test_negative_times_are_shifted_so_timestamps_stay_non_negative():
    out = chrome_trace_events([ev("gpu", "layer", -0.5, 1.0), ev("gpu", "layer", 1.0, 2.0)])
    assert sorted(e["ts"] for e in out if e["ph"] == "X") == [0.0, 1500.0]


@pytest.mark.parametrize("start,end", [(2.0, 1.0), (float("nan"), 1.0), (0.0, float("inf"))])
def test_an_event_with_an_invalid_interval_is_refused(start, end):
    with pytest.raises(ValueError, match="invalid interval"):
        chrome_trace_events([ev("gpu", "layer", start, end)])


def test_random_multistream_traces_never_overlap_on_one_tid():
    rng = random.Random(7)
    lanes = ["gpu", "copy", "cpu0", "cpu1", "host"]
    evs = []
    for _ in range(400):
        start = round(rng.uniform(0, 50), 4)
        dur = rng.choice([0.0, round(rng.uniform(0.001, 5), 4)])
        evs.append(ev(rng.choice(lanes), "expert", start, start + dur, token=rng.randrange(4)))
    for offset in (0.0, 5.1e12):      # 5e12 µs: torch.profiler's clock, where doubles barely hold ns
        out = chrome_trace_events(evs, ts_offset_us=offset)
        assert validate_chrome_trace({"traceEvents": out}) == []
        assert sum(e["ph"] in "Xi" for e in out) == len(evs)
        assert len([n for n in thread_names(out).values() if "#" in n]) > 0   # the split was exercised


def test_written_trace_is_strict_json_with_metadata_and_loads_gzipped(tmp_path):
    evs = [ev("gpu", "layer", 0, 1), ev("copy", "copy", 0, 2)]
    meta = {"run_id": "r7", "timing": "modeled", "tpot_ms": float("nan"), "lanes": ("gpu", "copy")}
    path = write_chrome_trace(evs, tmp_path / "sub" / "trace.json", metadata=meta)
    text = path.read_text()
    assert "NaN" not in text
    obj = json.loads(text)
    assert obj["displayTimeUnit"] == "ms"
    assert obj["otherData"] == {"run_id": "r7", "timing": "modeled", "tpot_ms": None, "lanes": ["gpu", "copy"]}
    pname = next(e for e in obj["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name")
    assert pname["args"]["name"] == "SPICE r7 (modeled)"
    assert validate_chrome_trace(obj) == []
    gz = write_chrome_trace(evs, tmp_path / "trace.json.gz", metadata=meta)
    assert json.loads(gzip.decompress(gz.read_bytes())) == obj
    assert build_chrome_trace(evs, metadata=meta) == obj


def _step(index, outcomes=(), **kw):
    base = dict(index=index, token_id=100 + index, text=f"t{index}", step_ms=10.0, timing="modeled", hits=1,
                misses=2, bytes_copied=300, stall_ms=0.5, lookahead_depth=2.0)
    base.update(kw)
    return StepStats(outcomes=tuple(ExpertOutcome(layer, 0, o) for layer, o in outcomes), **base)


def test_per_token_csv_has_the_columns_and_outcome_counts(tmp_path):
    steps = [_step(0, [(1, "copy"), (1, "copy"), (2, "hit")], text="Hello, \"world\"\n"),
             _step(1, [(1, "prefetch_hit"), (2, "approx"), (2, "cpu"), (2, "hit")])]
    df = per_token_frame(steps)
    assert tuple(df.columns) == PER_TOKEN_COLUMNS
    assert df[[f"experts_{o}" for o in OUTCOMES]].values.tolist() == [[1, 0, 0, 0, 2], [1, 1, 1, 1, 0]]
    assert df["hit_selections"].tolist() == [1, 1] and df["miss_selections"].tolist() == [2, 2]
    back = pd.read_csv(write_per_token_csv(steps, tmp_path / "tokens.csv"), keep_default_na=False)
    assert back["text"].tolist() == ["Hello, \"world\"\n", "t1"]
    assert back["token_id"].tolist() == [100, 101]
    empty = pd.read_csv(write_per_token_csv([], tmp_path / "empty.csv"))
    assert tuple(empty.columns) == PER_TOKEN_COLUMNS and len(empty) == 0


def test_events_csv_round_trips_every_field(tmp_path):
    evs = [ev("copy", "copy", 0.25, 1.75, token=3, layer=4, expert=5, nbytes=99, detail="x,y")]
    assert tuple(events_frame(evs).columns) == EVENT_COLUMNS
    back = pd.read_csv(write_events_csv(evs, tmp_path / "events.csv"), keep_default_na=False)
    row = back.iloc[0].to_dict()
    assert row == {**evs[0].as_dict(), "dur_ms": 1.5}


@pytest.mark.parametrize("n_events", [0, 2, 3, 7, 9])
@pytest.mark.parametrize("rest", [{}, {"displayTimeUnit": "ms", "otherData": {"run_id": "r", "notes": ["a"]}}])
def test_a_long_trace_is_written_in_pieces_that_make_the_same_text(n_events, rest):
    """Review: a 4,096-token run's trace (739 MB) was one string and its bytes copy in memory; it is encoded a slice
    of events at a time, to the same text."""
    from spice_core.trace.export import json_pieces

    events = [{"ph": "X", "ts": i, "dur": 1.5, "name": f"e{i}", "args": {"l": [i]}} for i in range(n_events)]
    for obj in ({"traceEvents": events, **rest}, {"schemaVersion": 1, **rest, "traceEvents": events, "z": [1]}):
        # the second as the TensorBoard trace orders its keys: the events after the schema's fields (review)
        assert "".join(json_pieces(obj, chunk=3)) == json.dumps(obj, allow_nan=False, separators=(",", ":"))
        if n_events > 3:
            assert max(map(len, json_pieces(obj, chunk=3))) < len(json.dumps(obj)) / 2
    with pytest.raises(ValueError):
        "".join(json_pieces({"traceEvents": [{"ts": 0}] * 5 + [{"ts": float("nan")}]}, chunk=2))
