"""The measured clock (CUDA): its events are recycled once resolved, its intervals stay right across tokens."""
import pytest
import torch

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="the measured clock times CUDA streams")]


def test_resolved_gpu_events_are_recycled_and_intervals_stay_ordered():
    from spice_core.timing.measured import MeasuredTimeline
    from spice_core.types import ExpertKey

    dev = torch.device("cuda")
    cs = torch.cuda.Stream(dev)
    clock = MeasuredTimeline(dev, cs)
    a = torch.randn(2048, 2048, device=dev)
    src, dst = torch.randn(1 << 22).pin_memory(), torch.empty(1 << 22, device=dev)
    created = []
    real = torch.cuda.Event

    class Counting(real):
        def __init__(self, *args, **kw):
            created.append(1)

    torch.cuda.Event = Counting
    try:
        per_token = []
        for token in range(6):
            clock.start_token(token)
            n0 = len(created)
            for layer in range(4):
                a = a @ a / 2048
                clock.layer(layer, 1, dense=False)
                with torch.cuda.stream(cs):
                    dst.copy_(src, non_blocking=True)
                    h = clock.copy(ExpertKey(layer, 1), src.numel() * 4, "demand", None, cs)
                start = clock.stamp()
                clock.compute_stream.wait_event(h.native)
                clock.wait(h, start)
                clock.mark("miss", ExpertKey(layer, 1), detail="copy")
            clock.end_token()
            per_token.append(len(created) - n0)
            events = clock.drain_events()
            kinds = {e.kind for e in events}
            assert {"layer", "stall", "miss", "token"} <= kinds and any(e.lane == "copy" for e in events)
            assert all(e.end_ms >= e.start_ms for e in events)
            layers = [e for e in events if e.kind == "layer"]
            assert all(x.end_ms <= y.start_ms + 1e-3 for x, y in zip(layers, layers[1:]))
    finally:
        torch.cuda.Event = real
    # Token 0 creates every event; later tokens create only the copies' (kept as the executor's handles), the
    # token's reference and what the pool cannot yet give back.
    assert per_token[-1] < per_token[0]
    assert clock._free_events


def test_a_graph_segment_is_timed_from_its_launch_to_its_end_not_through_the_host_step():
    """The fast path tells the clock each segment's launch and end (`segment`): its layer interval leaves out the
    host step that kept the GPU idle before the launch and the host's wake-up after the end; the layers the segment
    also covers are empty; the decoder's own event is never taken into the clock's pool."""
    import time

    from spice_core.timing.measured import MeasuredTimeline

    dev = torch.device("cuda")
    clock = MeasuredTimeline(dev, torch.cuda.Stream(dev))
    a = torch.randn(2048, 2048, device=dev)
    (a @ a).sum().item()                                 # cuBLAS loaded and the clocks up before anything is timed
    began, seg_end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)  # the decoder's
    for token in range(3):
        clock.start_token(token)
        time.sleep(0.005)                                 # a host step with the GPU idle, before the launch
        launched = time.perf_counter()
        began.record(clock.compute_stream)
        for _ in range(4):
            a = a @ a / 2048
        seg_end.record(clock.compute_stream)
        seg_end.synchronize()
        time.sleep(0.003)                                 # the host's bookkeeping after the segment ended
        clock.segment(launched, seg_end)
        clock.layer(0, 1, dense=True)
        clock.layer(1, 1, dense=False)                   # in the same segment: empty
        clock.end_token()
        layers = [e for e in clock.drain_events() if e.kind == "layer"]
        assert [e.layer for e in layers] == [0, 1]
        first, second = layers
        gpu_ms = first.end_ms - first.start_ms
        # the GPU's own time for the work, give or take the host-device alignment (a few µs) and launch latency,
        # not the 5 + 3 ms of host around it
        assert abs(gpu_ms - began.elapsed_time(seg_end)) < 0.5, (gpu_ms, began.elapsed_time(seg_end))
        assert second.end_ms - second.start_ms == 0.0 and second.start_ms == first.end_ms
        assert all(ev is not seg_end for ev in clock._free_events)
