"""The per-token builders of trace events and lane intervals make objects equal to their classes' own."""
import dataclasses

import pytest

from spice_core.records import LaneInterval, lane_intervals
from spice_core.trace.events import TraceEvent, events_from_rows

ROWS = [(0, 1, 5, "gpu", "expert", 0.5, 0.75, 0, "modeled", ""),
        (0, 1, 5, "gpu", "hit", 0.75, 0.75, 0, "modeled", ""),
        (3, -1, -1, "host", "token", 0.0, 2.0, 0, "measured", ""),
        (2, 4, 9, "copy", "evict", 1.0, 1.0, 17_000, "modeled", "x")]


def test_events_from_rows_equal_the_constructor():
    built = events_from_rows(ROWS)
    want = [TraceEvent(*r) for r in ROWS]
    assert built == want
    assert [hash(e) for e in built] == [hash(e) for e in want]
    assert [e.as_dict() for e in built] == [e.as_dict() for e in want]
    assert [dataclasses.astuple(e) for e in built] == list(ROWS)
    assert all(type(e) is TraceEvent for e in built)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built[0].kind = "stall"


def test_lane_intervals_keep_the_busy_intervals_equal_to_the_constructor():
    events = [TraceEvent(*r) for r in ROWS]
    got = lane_intervals(events)
    want = tuple(LaneInterval(e.lane, e.kind, e.start_ms, e.end_ms, e.layer, e.expert)
                 for e in events if e.end_ms > e.start_ms)
    assert got == want and len(got) == 2
    assert [vars(i) for i in got] == [vars(i) for i in want]
    assert [hash(i) for i in got] == [hash(i) for i in want]
