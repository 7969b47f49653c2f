"""The CPU lane: exact results, core budget, failures and timeouts counted, and the executor's
fallback to an exact copy when a lane task fails (output never silently corrupted)."""
import threading

import pytest
import torch
from torch.nn import functional as F

from spice_core.errors import ConfigError
from spice_core.exec import cpu_lane as cpu_lane_mod
from spice_core.exec.cpu_lane import CpuLane
from spice_core.exec.experts import expert_forward

from tiny_models import build_tiny


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 2)
    yield
    torch.set_num_threads(1)          # the lane sets the process-wide intra-op thread count


def _expert(seed=0, H=16, I=8):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, H, generator=g), torch.randn(2 * I, H, generator=g), torch.randn(H, I, generator=g)


def test_lane_result_is_the_exact_expert_output(two_cores):
    x, gate_up, down = _expert()
    with CpuLane(workers=1) as lane:
        y, worker, t0, t1 = lane.submit(x, gate_up, down, F.silu, torch.device("cpu")).result()
    assert torch.equal(y, expert_forward(x, gate_up, down, F.silu))
    assert worker == 0 and t1 >= t0 and lane.failures == 0 and lane.tasks == 1


def test_one_core_machine_gets_no_lane_and_is_told_what_to_change(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 1)
    with pytest.raises(ConfigError, match=r"needs at least 2 cores .* may use 1: run with --no-cpu-lane"):
        CpuLane()


@pytest.mark.parametrize("workers,threads,match", [(0, None, r"workers=0 is out of range"),
                                                   (4, None, r"would oversubscribe this machine's 2 cores"),
                                                   (1, 3, r"1 workers x 3 threads would oversubscribe 2 cores")])
def test_lane_never_oversubscribes_cores(two_cores, workers, threads, match):
    with pytest.raises(ConfigError, match=match):
        CpuLane(workers=workers, threads_per_worker=threads)


def test_threads_default_to_the_cores_left_after_the_driver(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 16)
    lane = CpuLane(workers=3)
    try:
        assert lane.threads_per_worker == 5       # 3 x 5 = 15 = 16 cores - the driver thread
    finally:
        lane.close()
        torch.set_num_threads(1)


def test_a_failing_task_raises_from_result_and_is_counted(two_cores):
    x, gate_up, down = _expert()
    with CpuLane() as lane:
        res = lane.submit(x, gate_up[:, :3], down, F.silu, torch.device("cpu"))   # wrong shape
        with pytest.raises(RuntimeError):
            res.result()
        assert lane.failures == 1


def test_an_overdue_task_times_out_instead_of_hanging(two_cores):
    x, gate_up, down = _expert()
    release = threading.Event()

    def stuck(t):
        release.wait(5.0)
        return F.silu(t)

    with CpuLane(timeout_s=0.05) as lane:
        res = lane.submit(x, gate_up, down, stuck, torch.device("cpu"))
        with pytest.raises(TimeoutError, match="still running after 0.1 s"):
            res.result()
        assert lane.failures == 1
        release.set()


def test_executor_falls_back_to_an_exact_copy_when_the_cpu_lane_fails(tmp_path):
    """A CPU-lane failure costs a copy, is counted and traced; the logits stay exact."""
    from transformers import AutoModelForCausalLM

    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.tools.quality import installed_runtime

    d = build_tiny("deepseek_v2", tmp_path / "m")
    eng = SpiceEngine.load(d, device="cpu")
    ids = [5, 17, 33, 2, 9, 41, 7, 3]
    with torch.no_grad():
        ref = AutoModelForCausalLM.from_pretrained(d).eval()(torch.tensor([ids])).logits[0]
        with installed_runtime(eng, RunSettings(policy="cpu_compute", cache_frac=0.3)) as (rt, _):
            class DeadWorker:
                def result(self):
                    raise RuntimeError("worker died")

            submit = rt.executor._submit_cpu

            def submit_to_a_dead_worker(*a, **k):
                op, _ = submit(*a, **k)
                return op, DeadWorker()

            rt.executor._submit_cpu = submit_to_a_dead_worker
            rt.begin_token(0)
            got = eng.lm.model(input_ids=torch.tensor([ids])).logits[0]
            rt.end_token()
            token = rt.recorder.end_token()
            events = token.events
    assert (got - ref).abs().max().item() < 1e-4
    assert rt.totals["cpu_fallbacks"] > 0 and token.cpu_fallbacks == rt.totals["cpu_fallbacks"]
    fallbacks = [e for e in events if e.kind == "cpu_fallback"]
    assert len(fallbacks) == rt.totals["cpu_fallbacks"] and "worker died" in fallbacks[0].detail
    assert sum(1 for e in events if e.kind == "copy") >= len(fallbacks)


def test_split_rows_cover_every_row_once():
    from spice_core.exec.cpu_lane import split_rows
    for n, parts in ((1408, 5), (2048, 15), (8, 4), (100, 1), (17, 16)):
        blocks = split_rows(n, parts)
        assert blocks[0][0] == 0 and blocks[-1][1] == n and len(blocks) <= parts
        assert all(a < b and b == blocks[i + 1][0] for i, (a, b) in enumerate(blocks[:-1]))


@pytest.mark.parametrize("workers", (2, 3))
def test_an_expert_split_across_workers_matches_the_whole_expert(monkeypatch, workers):
    """Each worker computes F.linear over its block of output rows: the same dot products, in bf16 as the slab is."""
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 4)
    x, gate_up, down = (t.to(torch.bfloat16) for t in _expert(H=96, I=40))
    try:
        with CpuLane(workers=workers, threads_per_worker=1) as lane:
            outs = [lane.submit(x, gate_up, down, F.silu, torch.device("cpu")) for _ in range(3)]
            ys = [r.result()[0] for r in outs]
            assert lane.shape == f"{workers}x1" and lane.failures == 0
    finally:
        torch.set_num_threads(1)
    ref = expert_forward(x, gate_up, down, F.silu)
    for y in ys:
        assert y.dtype == torch.bfloat16 and y.shape == ref.shape
        torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_a_failing_split_task_raises_and_the_lane_keeps_working(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 4)
    x, gate_up, down = _expert(H=64, I=32)
    try:
        with CpuLane(workers=3, threads_per_worker=1) as lane:
            bad = lane.submit(x, gate_up[:, :3], down, F.silu, torch.device("cpu"))
            with pytest.raises(RuntimeError):
                bad.result()
            y = lane.submit(x, gate_up, down, F.silu, torch.device("cpu")).result()[0]
            assert lane.failures == 1
    finally:
        torch.set_num_threads(1)
    torch.testing.assert_close(y, expert_forward(x, gate_up, down, F.silu), rtol=1e-5, atol=1e-5)
