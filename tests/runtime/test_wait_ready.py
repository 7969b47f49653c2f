"""A graph segment reads all of a layer's slots at once, so the fast path waits for their copies at once
(`CopyEngine.wait_ready_many`): copies run in issue order on the one copy stream, so the wait is for the last
one issued among them, with one readiness check and at most one stall interval; every slot waited for is done with
(its handle goes back to the clock, which may record its event again), and slots not read are left pending."""
from spice_core.runtime.copies import CopyEngine
from spice_core.timing.timeline import OpHandle
from spice_core.types import ExpertKey


class _Clock:
    def __init__(self) -> None:
        self.waits, self.done = [], []

    def wait(self, handle, start=None) -> None:
        self.waits.append(handle)

    def copy_done(self, handle) -> None:
        self.done.append(handle)


def _executor(ready: dict) -> CopyEngine:
    ex = object.__new__(CopyEngine)      # only the copy bookkeeping: no model, no slots
    ex.ready, ex.clock = dict(ready), _Clock()
    return ex


def _copy(expert: int, end_ms: float) -> OpHandle:
    return OpHandle(ExpertKey(0, expert), "copy", "copy", end_ms=end_ms)


def test_the_layer_waits_once_for_the_last_copy_issued_among_its_slots():
    first, last, other = _copy(1, 2.0), _copy(2, 5.0), _copy(3, 9.0)
    ex = _executor({3: first, 1: last, 7: other})
    ex.wait_ready_many([3, 1, 5])            # slot 5 holds a copy that landed long ago (nothing pending)
    assert ex.clock.waits == [last]
    assert ex.ready == {7: other}           # slot 7 is not read by this layer: its copy stays pending
    assert ex.clock.done == [first, last]   # both waited for (the first through the last): handed back, in order


def test_a_layer_with_nothing_in_flight_waits_for_nothing():
    ex = _executor({})
    ex.wait_ready_many([0, 1, 2])
    assert ex.clock.waits == []


def test_one_slot_waits_as_wait_ready_does():
    h = _copy(4, 1.0)
    a, b = _executor({2: h}), _executor({2: h})
    a.wait_ready_many([2])
    b.wait_ready(2)
    assert a.clock.waits == b.clock.waits == [h] and a.ready == b.ready == {}
    assert a.clock.done == b.clock.done == [h]
