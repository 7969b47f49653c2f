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

            submit = rt.executor.cpu.submit

            def submit_to_a_dead_worker(*a, **k):
                op, _, kernel = submit(*a, **k)
                return op, DeadWorker(), kernel

            rt.executor.cpu.submit = submit_to_a_dead_worker
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



@pytest.mark.parametrize("shape,workers,threads", [("1x0", 1, 3), ("2x1", 2, 1), (" 3X1 ", 3, 1)])
def test_lane_shape_parses_workers_by_threads(monkeypatch, shape, workers, threads):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 4)
    try:
        with cpu_lane_mod.lane_from_shape(shape) as lane:
            assert (lane.workers, lane.threads_per_worker) == (workers, threads)
            x, gate_up, down = _expert()
            ys = [r.result()[0] for r in [lane.submit(x, gate_up, down, F.silu, torch.device("cpu")) for _ in range(4)]]
    finally:
        torch.set_num_threads(1)
    ref = expert_forward(x, gate_up, down, F.silu)
    assert all(torch.equal(y, ref) for y in ys)


@pytest.mark.parametrize("shape", ("five", "2x", "x3", "2x2x2"))
def test_a_malformed_lane_shape_says_what_to_write(monkeypatch, shape):
    monkeypatch.setenv(cpu_lane_mod.SHAPE_ENV, shape)
    with pytest.raises(ConfigError, match=r"is not WxT .* fix SPICE_CPU_LANE"):
        cpu_lane_mod.lane_from_shape()


@pytest.mark.parametrize("batch,cores_left,want", [(1, 15, (1, 15)), (2, 15, (1, 15)), (3, 15, (3, 5)),
                                                    (4, 15, (4, 3)), (5, 15, (5, 3)), (6, 15, (3, 5)), (7, 15, (4, 3)),
                                                    (11, 15, (4, 3)), (3, 2, (1, 2)), (0, 15, (1, 15))])
def test_an_auto_lane_runs_a_layers_experts_side_by_side_only_from_three(batch, cores_left, want):
    assert cpu_lane_mod.batch_shape(batch, cores_left) == want


def test_an_auto_lane_gives_each_job_its_batchs_threads_and_exact_results(monkeypatch):
    """On 16 cores: a layer's 4 experts run side by side, 3 intra-op threads each, on 4 workers; a layer's 2 run one
    after another with all 15 threads on one worker; every output is the exact expert's."""
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 16)
    x, gate_up, down = _expert()
    seen, lock = [], threading.Lock()

    def act(t):
        with lock:
            seen.append((threading.get_ident(), torch.get_num_threads()))
        return F.silu(t)

    try:
        with cpu_lane_mod.lane_from_shape("auto") as lane:
            assert lane.adaptive and lane.side_workers == 5
            assert lane.shape == "auto (1x15 below 3 experts a layer, up to 5x3 from 3)"
            side = [lane.submit(x, gate_up, down, act, torch.device("cpu"), batch=4) for _ in range(4)]
            ys = [r.result() for r in side]
            four = list(seen)
            seen.clear()
            ys += [lane.submit(x, gate_up, down, act, torch.device("cpu"), batch=2).result() for _ in range(2)]
            two = list(seen)
    finally:
        torch.set_num_threads(1)
    ref = expert_forward(x, gate_up, down, F.silu)
    assert all(torch.equal(y, ref) for y, *_ in ys)
    assert {n for _, n in four} == {3} and {n for _, n in two} == {15}
    assert len({w for _, w, *_ in ys[4:]}) == 1 and {w for _, w, *_ in ys[4:]}.isdisjoint({w for _, w, *_ in ys[:4]})


def test_the_default_lane_is_auto_and_an_auto_lane_takes_no_fixed_shape(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 2)
    monkeypatch.delenv(cpu_lane_mod.SHAPE_ENV, raising=False)
    try:
        with cpu_lane_mod.lane_from_shape() as lane:
            assert lane.adaptive and lane.shape == "auto (1x1: too few cores to run experts side by side)"
            x, gate_up, down = _expert()
            y = lane.submit(x, gate_up, down, F.silu, torch.device("cpu"), batch=4).result()[0]
        assert torch.equal(y, expert_forward(x, gate_up, down, F.silu))
        with pytest.raises(ConfigError, match="picks its workers and threads per layer"):
            CpuLane(workers=2, adaptive=True)
    finally:
        torch.set_num_threads(1)


def test_a_workers_thread_count_survives_a_count_set_later_by_another_thread():
    """A thread's first parallel op takes the process's last count: a worker that set its own before that op must
    keep it, whatever another worker set meanwhile (`_set_threads` runs the thread's one-time set-up first)."""
    got, set_done, other_done = {}, threading.Event(), threading.Event()

    def worker():
        cpu_lane_mod._set_threads(3)
        set_done.set()
        other_done.wait(5.0)
        x = torch.randn(64, 64)
        (x @ x).sum()
        got["threads"] = torch.get_num_threads()

    def other():
        torch.get_num_threads()
        torch.set_num_threads(2)

    try:
        t = threading.Thread(target=worker)
        t.start()
        set_done.wait(5.0)
        o = threading.Thread(target=other)
        o.start()
        o.join()
        other_done.set()
        t.join()
    finally:
        torch.set_num_threads(1)
    assert got["threads"] == 3


@pytest.mark.parametrize("cores,batches", [(16, range(1, 13)), (12, (4, 6, 8)), (24, (7, 8, 12))])
def test_an_auto_lanes_jobs_never_run_more_threads_than_the_cores_left(monkeypatch, cores, batches):
    """Every job of a layer holds its intra-op threads while it computes (a short sleep makes them overlap): at no
    moment do the layer's running jobs hold more threads than the cores left after the driver thread."""
    import time as _time

    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: cores)
    x, gate_up, down = _expert()
    lock, state = threading.Lock(), {"now": 0, "most": 0}

    def act(t):
        n = torch.get_num_threads()
        with lock:
            state["now"] += n
            state["most"] = max(state["most"], state["now"])
        _time.sleep(0.02)
        with lock:
            state["now"] -= n
        return F.silu(t)

    try:
        with cpu_lane_mod.lane_from_shape("auto") as lane:
            for batch in batches:
                jobs = [lane.submit(x, gate_up, down, act, torch.device("cpu"), batch=batch) for _ in range(batch)]
                assert all(j.result()[0] is not None for j in jobs)
    finally:
        torch.set_num_threads(1)
    assert 0 < state["most"] <= cores - 1


def test_the_lane_says_from_how_many_experts_it_runs_them_side_by_side(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 16)
    with CpuLane(adaptive=True) as auto, CpuLane(workers=3, threads_per_worker=5) as fixed:
        assert auto.side_from == cpu_lane_mod.AUTO_PARALLEL_FROM and fixed.side_from == 0
        assert cpu_lane_mod.lane_side_from(auto) == auto.side_from and cpu_lane_mod.lane_side_from(fixed) == 0
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 3)     # 2 cores left: nothing side by side
    with CpuLane(adaptive=True) as small:
        assert small.side_from == 0
    assert cpu_lane_mod.shape_side_from("auto") == cpu_lane_mod.AUTO_PARALLEL_FROM
    assert cpu_lane_mod.shape_side_from(" AUTO ") == cpu_lane_mod.AUTO_PARALLEL_FROM
    assert cpu_lane_mod.shape_side_from("1x0") == cpu_lane_mod.shape_side_from("3x5") == 0
    monkeypatch.setenv(cpu_lane_mod.SHAPE_ENV, "1x0")          # no lane made (a modeled run): the shape setting's
    assert cpu_lane_mod.lane_side_from(None) == 0


def test_the_cores_counted_stay_within_the_containers_cpu_quota(tmp_path, monkeypatch):
    """Review risk: a 2-vCPU Space may see all its host's cores; the app's threads and the lane's shape counted
    them all (oversubscribing the two it has)."""
    monkeypatch.setattr(cpu_lane_mod.os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("200000 100000\n")
    assert cpu_lane_mod.available_cores(v2) == 2
    (v2 / "cpu.max").write_text("150000 100000\n")          # 1.5 CPUs: two threads may run
    assert cpu_lane_mod.available_cores(v2) == 2
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_lane_mod.available_cores(v2) == 16
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_lane_mod.available_cores(v1) == 4
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")    # no quota
    assert cpu_lane_mod.available_cores(v1) == 16
    assert cpu_lane_mod.available_cores(tmp_path / "none") == 16
