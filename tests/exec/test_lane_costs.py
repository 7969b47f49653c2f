"""The CPU lane's measured cost per job (`CpuJobs.lane_totals`) and what bench reports from it
(`bench_records.lane_metrics`): one-token jobs are counted with their compute time on the worker and the host's wait,
prompt jobs (several tokens) are not, a failed job is not, and shards add up to the whole."""
import pytest
import torch
from torch.nn import functional as F

from spice_core.exec import cpu_lane as cpu_lane_mod
from spice_core.exec.cpu_lane import CpuLane
from spice_core.timing.timeline import OpHandle
from spice_core.tools.bench_records import _combine, derive, lane_metrics

from tiny_models import build_tiny


class _Clock:
    """Only what CpuJobs tells a clock: the job's handle, then its measured run."""

    def __init__(self) -> None:
        self.runs = []

    def cpu_expert(self, key, n, int8=False, batch=1):
        return OpHandle(key, "cpu", "cpu_int8" if int8 else "cpu_run")

    def cpu_collected(self, handle, lane_run=None):
        self.runs.append(lane_run)


class _Recorder:
    def __init__(self) -> None:
        self.fallbacks = []

    def cpu_fallback(self, key, err) -> None:
        self.fallbacks.append(key)


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 2)
    yield
    torch.set_num_threads(1)


def test_one_token_jobs_are_costed_and_prompt_jobs_and_failures_are_not(tmp_path, two_cores):
    from spice_core.model.loader import load_model
    from spice_core.runtime.cpu_jobs import CpuJobs

    lm = load_model(build_tiny("qwen2_moe", tmp_path / "m"), "cpu")
    keys = lm.host.keys()
    act = F.silu
    with CpuLane(workers=1) as lane:
        jobs = CpuJobs(lm, _Clock(), _Recorder(), cpu_lane=lane)
        assert jobs.lane_totals() == {}                       # nothing ran yet
        h = lm.layout.hidden
        one = [jobs.submit(k, torch.randn(1, h), 1, act, torch.device("cpu"), decode=True) for k in keys[:3]]
        prompt = jobs.submit(keys[3], torch.randn(4, h), 4, act, torch.device("cpu"))
        # A prompt's expert that one of its tokens routed to: one row, still a prompt job (not costed).
        prompt_one = jobs.submit(keys[5], torch.randn(1, h), 1, act, torch.device("cpu"))
        outs = [jobs.collect(k, j) for k, j in zip(keys[:3], one)] + [jobs.collect(keys[3], prompt),
                                                                     jobs.collect(keys[5], prompt_one)]
        op, _, kernel = jobs.submit(keys[4], torch.randn(1, h), 1, act, torch.device("cpu"), decode=True)

        class Died:
            def result(self):
                raise RuntimeError("worker died")

        assert jobs.collect(keys[4], (op, Died(), kernel)) is None
    assert all(o is not None for o in outs)
    t = jobs.lane_totals()
    runs = jobs.clock.runs[:3]                                # (worker, t0, t1, wait start, wait end) per job
    assert t["lane_experts"] == 3 and t["lane_int8_experts"] == 0
    assert t["lane_compute_us_sum"] == pytest.approx(sum(r[2] - r[1] for r in runs) * 1e6)
    assert t["lane_wait_us_sum"] == pytest.approx(sum(r[4] - r[3] for r in runs) * 1e6)
    assert t["lane_expert_bytes"] == lm.expert_bytes
    # Submitted one by one (batch 1 each), the three jobs are three bursts: the lane was busy for their runs alone.
    # (The fourth job's handle was replaced by a dead stand-in, so its own burst never completes and adds nothing.)
    assert t["lane_bursts"] == 3 and t["lane_busy_us_sum"] == pytest.approx(t["lane_compute_us_sum"])


def test_a_layers_jobs_are_one_burst_whose_busy_wall_spans_them(tmp_path, two_cores):
    """A layer's jobs submitted together (``batch``) count as one burst: the lane was busy from the first one's start
    to the last one's end, which for jobs one after another on one worker is at least their compute, summed."""
    from spice_core.model.loader import load_model
    from spice_core.runtime.cpu_jobs import CpuJobs

    lm = load_model(build_tiny("qwen2_moe", tmp_path / "m"), "cpu")
    keys, h = lm.host.keys(), lm.layout.hidden
    with CpuLane(workers=1) as lane:
        jobs = CpuJobs(lm, _Clock(), _Recorder(), cpu_lane=lane)
        for layer_keys in (keys[:3], keys[3:5]):                # two layers: 3 jobs, then 2
            handles = [jobs.submit(k, torch.randn(1, h), 1, F.silu, torch.device("cpu"), decode=True,
                                   batch=len(layer_keys)) for k in layer_keys]
            assert all(jobs.collect(k, j) is not None for k, j in zip(layer_keys, handles))
    t, runs = jobs.lane_totals(), jobs.clock.runs
    spans = [max(r[2] for r in rs) - min(r[1] for r in rs) for rs in (runs[:3], runs[3:5])]
    assert t["lane_bursts"] == 2 and t["lane_busy_us_sum"] == pytest.approx(sum(spans) * 1e6)
    assert t["lane_busy_us_sum"] >= t["lane_compute_us_sum"] * (1 - 1e-9)


def test_a_layer_that_submits_fewer_jobs_than_it_announced_does_not_break_the_next_one(tmp_path, two_cores):
    """A layer says 3 jobs but only 2 reach the lane (a stand-in took the third, as some tests do): once those 2 are
    in, its burst counts, and the next layer's jobs open their own burst instead of failing."""
    from spice_core.model.loader import load_model
    from spice_core.runtime.cpu_jobs import CpuJobs

    lm = load_model(build_tiny("qwen2_moe", tmp_path / "m"), "cpu")
    keys, h = lm.host.keys(), lm.layout.hidden
    with CpuLane(workers=1) as lane:
        jobs = CpuJobs(lm, _Clock(), _Recorder(), cpu_lane=lane)
        short = [jobs.submit(k, torch.randn(1, h), 1, F.silu, torch.device("cpu"), decode=True, batch=3)
                 for k in keys[:2]]
        assert all(jobs.collect(k, j) is not None for k, j in zip(keys[:2], short))
        nxt = [jobs.submit(k, torch.randn(1, h), 1, F.silu, torch.device("cpu"), decode=True, batch=2)
               for k in keys[2:4]]
        assert all(jobs.collect(k, j) is not None for k, j in zip(keys[2:4], nxt))
    t = jobs.lane_totals()
    assert t["lane_experts"] == 4 and t["lane_bursts"] == 2


def _raw(**lane) -> dict:
    base = {"step_ms": [10.0, 12.0], "ttft_ms": [50.0], "selections": 8, "hits": 4, "bytes": 0, "stall_ms": 0.0,
            "miss_split": {"approx": 0, "cpu": 4, "copy": 0}, "wasted_prefetch_bytes": 0, "agreements": [],
            "gpu_peak_bytes": 0, "n_runs": 1, "device_ms": [9.0, 11.0]}
    return {**base, **lane}


def test_the_lane_metrics_are_its_ms_and_gb_per_s_per_expert_and_shards_add_up():
    a = _raw(lane_experts=4, lane_compute_us_sum=2000.0, lane_wait_us_sum=400.0, lane_bytes_sum=4 * 17_301_504)
    b = _raw(lane_experts=1, lane_compute_us_sum=1000.0, lane_wait_us_sum=100.0, lane_bytes_sum=17_301_504,
             lane_int8_experts=2, lane_int8_compute_us_sum=500.0)
    m = lane_metrics(a)
    assert m["cpu_lane_ms_per_expert"] == pytest.approx(0.5)
    assert m["cpu_lane_wait_ms_per_expert"] == pytest.approx(0.1)
    assert m["cpu_lane_gbps"] == pytest.approx(17_301_504 / 0.5e6)        # one expert's bytes per 0.5 ms
    assert m["cpu_lane_int8_ms_per_expert"] is None
    both = derive(_combine(a, b))
    assert both["cpu_lane_ms_per_expert"] == pytest.approx(3000.0 / 5 / 1e3)
    assert both["cpu_lane_int8_ms_per_expert"] == pytest.approx(0.25)
    assert lane_metrics(_raw())["cpu_lane_ms_per_expert"] is None           # no lane job: nothing claimed


def test_the_lanes_busy_wall_is_its_rate_where_recorded_and_the_floor_takes_it():
    """A lane running a layer's experts side by side: 4 jobs of 0.9 ms each in a busy wall of 1.2 ms. The record says
    both, and the three-lane floor takes the busy wall per expert (0.3 ms), not a job's 0.9."""
    from spice_core.tools.bench_records import add_three_lane_floor

    raw = _raw(lane_experts=4, lane_compute_us_sum=3600.0, lane_bursts=1, lane_busy_us_sum=1200.0,
               lane_bytes_sum=4 * 17_301_504)
    m = lane_metrics(raw)
    assert m["cpu_lane_ms_per_expert"] == pytest.approx(0.9) and m["cpu_lane_busy_ms_per_expert"] == pytest.approx(0.3)
    assert m["cpu_lane_busy_gbps"] == pytest.approx(17_301_504 / 0.3e6)
    assert lane_metrics(_raw(lane_experts=4, lane_compute_us_sum=3600.0))["cpu_lane_busy_ms_per_expert"] is None
    with_int8 = dict(raw, lane_int8_experts=1, lane_int8_compute_us_sum=100.0)
    assert lane_metrics(with_int8)["cpu_lane_busy_ms_per_expert"] is None    # two kernels in one wall: not one rate
    rec = {"policy": "cpu_compute", "tpot_ms_median": 50.0, "miss_split": {"approx": 0, "cpu": 40, "copy": 0},
           "n_decode_tokens": 10, "link_gbps": 13.0, **m}
    resident = {"policy": "resident", "tpot_ms_median": 5.0, "miss_split": {"approx": 0, "cpu": 0, "copy": 0},
                "n_decode_tokens": 10, "link_gbps": 13.0}
    add_three_lane_floor([resident, rec], 17_301_504, profile_lane_ms=0.7, dram_gbps=81.0)
    assert rec["floor3_inputs"]["lane_ms"] == pytest.approx(0.3) and rec["floor3_inputs"]["lane_source"] == "measured"
    assert rec["floor3_inputs"]["lane_basis"] == "busy wall per expert"


@pytest.mark.cuda
def test_a_fast_path_run_with_the_lane_reports_its_measured_cost(tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine

    eng = SpiceEngine.load(build_tiny("deepseek_v2", tmp_path / "m"), device="cuda", executor="graphed")
    run = eng.start_ids([5, 17, 33, 2, 9, 41, 7], RunSettings(policy="cpu_compute", cache_frac=0.3,
                                                              max_new_tokens=12))
    steps = list(run)
    t = run.record.totals
    lane_misses = sum(o.outcome == "cpu" for st in steps[1:] for o in st.outcomes)
    assert lane_misses > 0 and t["lane_experts"] == lane_misses - t.get("cpu_fallbacks", 0)   # decode jobs only
    assert t["lane_compute_us_sum"] > 0 and t["lane_expert_bytes"] == eng.lm.expert_bytes


def test_a_run_says_how_many_leading_tokens_it_reproduced_and_shards_pool_them():
    from spice_core.tools.bench_records import divergence_totals

    ref = [1, 2, 3, 4, 5, 6]
    assert divergence_totals(None, [1, 2]) == {}                            # no reference: nothing claimed
    assert divergence_totals(ref, ref)["identical_prefix_tokens"] == 6       # never diverged
    assert divergence_totals(ref, [1, 2, 9, 4, 5, 6])["identical_prefix_tokens"] == 2
    assert divergence_totals(ref, [1, 2, 3])["identical_prefix_tokens"] == 3   # stopped early
    a, b = _raw(identical_prefixes=[2, 6]), _raw(identical_prefixes=[64])
    assert derive(_combine(a, b))["identical_prefix_tokens_median"] == 6
    assert derive(_raw())["identical_prefix_tokens_median"] is None


def test_the_layers_an_auto_lane_ran_side_by_side_are_summed_apart(tmp_path, monkeypatch):
    """An auto lane runs a 3-job layer side by side and a 2-job layer one after another: the record's side sums hold
    the first alone, and the metrics give their busy walls per expert as the lane's measured speedup."""
    from spice_core.model.loader import load_model
    from spice_core.runtime.cpu_jobs import CpuJobs
    from spice_core.tools.bench_records import side_speedup

    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 7)     # 6 cores left: 3 side by side x 2 threads
    lm = load_model(build_tiny("qwen2_moe", tmp_path / "m"), "cpu")
    keys, h = lm.host.keys(), lm.layout.hidden
    try:
        with CpuLane(adaptive=True) as lane:
            assert lane.side_from == 3
            jobs = CpuJobs(lm, _Clock(), _Recorder(), cpu_lane=lane)
            for layer_keys in (keys[:3], keys[3:5]):
                handles = [jobs.submit(k, torch.randn(1, h), 1, F.silu, torch.device("cpu"), decode=True,
                                       batch=len(layer_keys)) for k in layer_keys]
                assert all(jobs.collect(k, j) is not None for k, j in zip(layer_keys, handles))
    finally:
        torch.set_num_threads(1)
    t, runs = jobs.lane_totals(), jobs.clock.runs
    first = max(r[2] for r in runs[:3]) - min(r[1] for r in runs[:3])
    assert t["lane_bursts"] == 2 and t["lane_side_bursts"] == 1 and t["lane_side_experts"] == 3
    assert t["lane_side_busy_us_sum"] == pytest.approx(first * 1e6)
    serial = (t["lane_busy_us_sum"] - t["lane_side_busy_us_sum"]) / 2
    assert side_speedup(t) == pytest.approx(serial / (t["lane_side_busy_us_sum"] / 3))


def test_the_measured_side_speedup_needs_layers_of_both_kinds():
    both = _raw(lane_experts=10, lane_compute_us_sum=9000.0, lane_bursts=4, lane_busy_us_sum=5000.0,
                lane_side_bursts=2, lane_side_experts=8, lane_side_busy_us_sum=3200.0, lane_bytes_sum=10 * 17_301_504)
    assert lane_metrics(both)["cpu_lane_side_speedup"] == pytest.approx((1800.0 / 2) / (3200.0 / 8))
    only_side = dict(both, lane_bursts=2, lane_experts=8, lane_busy_us_sum=3200.0)
    assert lane_metrics(only_side)["cpu_lane_side_speedup"] is None
    assert lane_metrics(_raw(lane_experts=4, lane_compute_us_sum=3600.0, lane_bursts=1,
                             lane_busy_us_sum=1200.0))["cpu_lane_side_speedup"] is None    # older records


def test_a_failed_job_of_a_side_by_side_layer_is_not_one_of_its_experts(tmp_path, monkeypatch):
    """Regression: the side sums counted a layer's jobs as submitted, a failed one too, while ``lane_experts`` and the
    busy wall count the jobs that ran; the one-after-another layers' experts (the difference) came out one short."""
    from spice_core.model.loader import load_model
    from spice_core.runtime.cpu_jobs import CpuJobs

    monkeypatch.setattr(cpu_lane_mod, "available_cores", lambda: 7)     # 6 cores left: 3 side by side x 2 threads
    lm = load_model(build_tiny("qwen2_moe", tmp_path / "m"), "cpu")
    keys, h = lm.host.keys(), lm.layout.hidden
    try:
        with CpuLane(adaptive=True) as lane:
            jobs = CpuJobs(lm, _Clock(), _Recorder(), cpu_lane=lane)
            xs = [torch.randn(1, h), torch.randn(1, h + 1), torch.randn(1, h)]     # the second one's rows are wrong
            handles = [jobs.submit(k, x, 1, F.silu, torch.device("cpu"), decode=True, batch=3)
                       for k, x in zip(keys[:3], xs)]
            assert [jobs.collect(k, j) is not None for k, j in zip(keys[:3], handles)] == [True, False, True]
            for k in keys[3:5]:
                assert jobs.collect(k, jobs.submit(k, torch.randn(1, h), 1, F.silu, torch.device("cpu"),
                                                   decode=True, batch=1)) is not None
    finally:
        torch.set_num_threads(1)
    t = jobs.lane_totals()
    assert t["lane_experts"] == 4 and t["lane_side_bursts"] == 1 and t["lane_side_experts"] == 2
    assert jobs.recorder.fallbacks == [keys[1]]
