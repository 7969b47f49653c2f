"""A copy's end event is both a trace interval and the handle the compute stream waits on, so the measured clock
records it again for a later copy only once it is resolved *and* the copy engine has handed the handle back
(`MeasuredTimeline.copy_done`): a slot whose copy is still waited for keeps its own event, and slots refilled
token after token through recycled events hold the last copy's bytes. CUDA: real streams, pinned memory."""
import pytest
import torch

from tiny_models import build_tiny

from spice_core.policy.planner import CopyOrder


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """The tiny model on the GPU (its experts in pinned host rows); skips without one."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.model.loader import load_model

    return load_model(build_tiny("qwen2_moe", tmp_path_factory.mktemp("tiny_events") / "qwen2_moe"), "cuda")


def _engine(lm, n_slots: int):
    from spice_core.runtime.copies import CopyEngine
    from spice_core.timing.measured import MeasuredTimeline
    from spice_core.trace.recorder import Recorder

    device = torch.device("cuda")
    cs = torch.cuda.Stream(device)
    clock = MeasuredTimeline(device, cs)
    return CopyEngine(lm, n_slots, clock, Recorder(clock, lm.expert_bytes), copy_stream=cs,
                      compute_stream=clock.compute_stream)


def _pool_ids(engine) -> set:
    return {id(e) for e in engine.clock._free_events}


@pytest.mark.cuda
def test_a_held_copy_keeps_its_event_and_a_handed_back_one_is_recorded_again(lm):
    n_slots = 4
    engine = _engine(lm, n_slots)
    keys = lm.host.keys()
    engine.clock.start_token(0)
    # prefetches: each keeps its own end event (a layer's demand copies share one: the test below)
    handles = engine.issue_many([CopyOrder(keys[i], i, "prefetch") for i in range(n_slots)])
    assert len({id(h.native) for h in handles}) == n_slots
    torch.cuda.synchronize()
    engine.clock.end_token()                   # every copy resolved, none waited for yet
    held = {id(h.native) for h in handles}
    assert not held & _pool_ids(engine), "an event the engine still waits on went back to the pool"
    engine.clock.start_token(1)
    engine.wait_ready(0)
    engine.wait_ready_many([1, 2])             # slot 3 is still held
    assert {id(handles[i].native) for i in range(3)} <= _pool_ids(engine)
    assert id(handles[3].native) not in _pool_ids(engine)
    engine.clock.end_token()
    assert id(handles[3].native) not in _pool_ids(engine)


@pytest.mark.cuda
def test_slots_refilled_through_recycled_events_hold_the_last_copy_and_wait_for_it(lm):
    n_slots = 3
    engine = _engine(lm, n_slots)
    keys = lm.host.keys()
    made = set()
    last = {}
    for token in range(6):                      # each token refills every slot; from token 1 events come back
        engine.clock.start_token(token)
        for slot in range(n_slots):
            key = keys[(token * n_slots + slot) % len(keys)]
            h = engine.issue(CopyOrder(key, slot, "copy"))
            made.add(id(h.native))
            last[slot] = key
        engine.wait_ready_many(range(n_slots))
        out = engine.slots.buffer.sum(dim=1)   # a read on the compute stream, after the wait
        engine.clock.end_token()
        torch.cuda.synchronize()
        for slot, key in last.items():
            assert torch.equal(engine.slots.buffer[slot].cpu(), lm.host.flat(key)), (token, slot)
        assert torch.equal(out.cpu(), engine.slots.buffer.sum(dim=1).cpu())
    assert len(made) < 6 * n_slots, "no copy event was ever recorded again"


@pytest.mark.cuda
def test_a_layers_demand_copies_share_one_event_until_every_one_is_handed_back(lm):
    """One clock event times a layer's demand copies in a row (`CopyEngine.issue_many`): it goes back to the pool
    only once every copy of the batch is handed back; each copy's trace interval is an even share of the batch's
    span, in issue order, and says so; the slots hold the bytes copied."""
    n_slots = 4
    engine = _engine(lm, n_slots)
    keys = [k for k in lm.host.keys() if k.layer == lm.host.keys()[0].layer][:3]
    other = next(k for k in lm.host.keys() if k.layer != keys[0].layer)
    engine.clock.start_token(0)
    orders = [CopyOrder(k, i, "copy") for i, k in enumerate(keys)] + [CopyOrder(other, 3, "copy")]
    handles = engine.issue_many(orders)
    shared = {id(h.native) for h in handles[:3]}
    assert len(shared) == 1, "one layer's demand copies in a row: one event"
    assert id(handles[3].native) not in shared, "another layer's copy is timed on its own"
    assert [h.end_ms for h in handles[:3]] == sorted(h.end_ms for h in handles[:3])   # the last is waited for
    torch.cuda.synchronize()
    engine.clock.end_token()
    events = [e for e in engine.clock.drain_events() if e.lane == "copy"]
    batch = [e for e in events if (e.layer, e.expert) in {(k.layer, k.expert) for k in keys}]
    assert [(e.layer, e.expert) for e in batch] == [(k.layer, k.expert) for k in keys]
    for a, b in zip(batch, batch[1:]):
        assert a.end_ms == pytest.approx(b.start_ms)      # back to back, in issue order
    spans = [e.end_ms - e.start_ms for e in batch]
    assert all(s == pytest.approx(spans[0]) for s in spans) and spans[0] > 0
    assert all("split evenly" in e.detail for e in batch)
    engine.clock.start_token(1)
    engine.wait_ready_many([0, 1])             # two of the batch handed back, slot 2 still held
    assert not shared & _pool_ids(engine), "the batch's event went back while one of its copies was held"
    engine.wait_ready(2)
    assert shared <= _pool_ids(engine)
    engine.clock.end_token()
    for order in orders:
        assert torch.equal(engine.slots.buffer[order.slot].cpu(), lm.host.flat(order.key))
