"""The measured clock's booking of fast-path segments (`MeasuredTimeline.segment`), on any machine: CUDA events and
streams are replaced by a simulated GPU whose events carry the time the simulation gives them, so the clock's own
logic (which interval a layer gets, what is pooled, what the end of a token books) runs without a GPU. The same
booking on a real GPU: tests/trace/test_measured_clock.py."""
import time

import pytest
import torch

from spice_core.timing import measured
from spice_core.types import ExpertKey


class SimGpu:
    """A compute stream whose recorded events take the simulation's GPU time (ms on the run's axis)."""

    def __init__(self) -> None:
        self.now_ms = 0.0

    def synchronize(self) -> None:
        pass

    def wait_event(self, event) -> None:
        pass


class SimEvent:
    gpu: SimGpu = None

    def __init__(self, enable_timing: bool = False) -> None:
        self.at_ms = None

    def record(self, stream=None) -> None:
        self.at_ms = SimEvent.gpu.now_ms

    def query(self) -> bool:
        return self.at_ms is not None

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, other) -> float:
        return other.at_ms - self.at_ms


@pytest.fixture
def sim(monkeypatch):
    gpu = SimGpu()
    SimEvent.gpu = gpu
    monkeypatch.setattr(torch.cuda, "Event", SimEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: gpu)
    clock = measured.MeasuredTimeline(torch.device("cpu"), gpu)
    host = {"ms": 0.0}
    monkeypatch.setattr(clock, "_host_ms", lambda: host["ms"])
    return clock, gpu, host


def perf_s(clock, host_ms: float) -> float:
    """The time.perf_counter reading the clock maps to ``host_ms`` on its axis."""
    return clock._run_t0 + host_ms / 1e3


def test_segments_are_booked_from_launch_to_end_and_the_decoders_events_stay_its_own(sim):
    clock, gpu, host = sim
    seg_end = [SimEvent(True) for _ in range(3)]          # the decoder's, recorded again every token
    for token in range(2):
        base = 100.0 * token
        host["ms"] = gpu.now_ms = base
        clock.start_token(token)
        # segment 0 launched at base+2 (2 ms of host step first), runs 1 ms
        launch0 = base + 2.0
        gpu.now_ms = launch0 + 1.0
        seg_end[0].record(gpu)
        host["ms"] = base + 4.0                           # the host wakes late: its wake-up is not GPU work
        clock.segment(perf_s(clock, launch0), seg_end[0])
        clock.layer(0, 1, dense=True)
        clock.layer(1, 1, dense=False)                    # the same segment: empty
        # the host issues a copy and makes the GPU wait for it: a stall from 5 to 7
        host["ms"] = gpu.now_ms = base + 5.0
        start = clock.stamp()
        gpu.now_ms = base + 7.0
        h = measured.OpHandle(ExpertKey(1, 3), "copy", "copy", end_ms=base + 7.0, native=SimEvent())
        clock.wait(h, start)
        # segment 1 launched at base+6 (queued behind the stall): it starts when the stall ends, at base+7
        launch1 = base + 6.0
        gpu.now_ms = base + 9.0
        seg_end[1].record(gpu)
        clock.segment(perf_s(clock, launch1), seg_end[1])
        clock.layer(2, 1, dense=False)
        # the last segment, launched at base+12, ends at base+13; no layer after it books it: the token's end does
        gpu.now_ms = base + 13.0
        seg_end[2].record(gpu)
        clock.segment(perf_s(clock, base + 12.0), seg_end[2])
        host["ms"] = base + 14.0
        clock.end_token()
        events = clock.drain_events()
        layers = sorted((e for e in events if e.kind == "layer"), key=lambda e: e.start_ms)
        spans = [(e.layer, round(e.start_ms - base, 6), round(e.end_ms - base, 6)) for e in layers]
        assert spans == [(0, 2.0, 3.0), (1, 3.0, 3.0), (2, 7.0, 9.0), (-1, 12.0, 13.0)], spans
        assert layers[-1].detail == "the step's last segment"
        stall = next(e for e in events if e.kind == "stall")
        assert (stall.start_ms - base, stall.end_ms - base) == (5.0, 7.0)
        assert not any(ev in clock._free_events for ev in seg_end)      # never pooled, never re-recorded by it


def test_without_a_segment_a_layer_spans_from_the_last_mark_to_now(sim):
    """The eager executor's booking is unchanged: from the last mark to an event recorded now."""
    clock, gpu, host = sim
    clock.start_token(1)
    gpu.now_ms = 4.0
    clock.layer(0, 1, dense=True)
    gpu.now_ms = 6.0
    clock.layer(1, 1, dense=False)
    host["ms"] = 6.0
    clock.end_token()
    layers = [(e.layer, e.start_ms, e.end_ms) for e in clock.drain_events() if e.kind == "layer"]
    assert layers == [(0, 0.0, 4.0), (1, 4.0, 6.0)]


def test_a_segment_left_from_a_token_is_dropped_at_the_next(sim):
    clock, gpu, host = sim
    clock.start_token(1)
    clock.segment(time.perf_counter(), SimEvent(True))
    clock.start_token(2)                  # a step that never booked it (cancelled): nothing carries over
    gpu.now_ms = 1.0
    clock.layer(0, 1, dense=True)
    host["ms"] = 1.0
    clock.end_token()
    assert [(e.start_ms, e.end_ms) for e in clock.drain_events() if e.kind == "layer"] == [(0.0, 1.0)]
