"""The lossy cpu_int8 miss action through the engine: spice takes it for low-weight misses and counts it (miss split,
outcomes, trace intervals of its own kind), on the eager executor and inside the fast path's step; exact policies
never take it whatever tau_int8, and their tokens do not change; tau_int8 0 makes no int8 copy at all."""
import pytest

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from spice_core.trace.events import CPU_INT8_RUN

PROMPT = [5, 17, 33, 2, 9, 41, 7]
SLOW_LINK = dict(profile="rtx5090-pcie4x8", cache_frac=0.3, max_new_tokens=10)   # 13 GB/s: the lane pays there


def _run(eng, **kw):
    run = eng.start_ids(PROMPT, RunSettings(**{**SLOW_LINK, **kw}))
    toks = [s.token_id for s in run]
    return toks, eng.get_summary(run.run_id), eng.get_record(run.run_id)


def test_spice_runs_low_weight_misses_from_the_int8_copy_and_counts_them(engines):
    toks, s, rec = _run(engines["deepseek_v2"], policy="spice", tau_int8=1.0)
    assert s.miss_split["cpu_int8"] > 0
    assert any("cpu_int8 (lossy)" in n for n in s.notes), s.notes
    outcomes = sum(o.outcome == "cpu_int8" for st in rec.steps for o in st.outcomes)
    instants = [e for e in rec.events if e.kind == "miss" and e.detail == "cpu_int8"]
    runs = [e for e in rec.events if e.kind == CPU_INT8_RUN]
    assert outcomes == len(instants) == len(runs) > 0 and all(e.lane.startswith("cpu") for e in runs)
    assert not any(e.kind == "cpu_run" and (e.token, e.layer, e.expert) in {(r.token, r.layer, r.expert) for r in runs}
                   for e in rec.events)        # an int8 run is never also counted as an exact one


@pytest.mark.parametrize("policy", ["spice_no_lore", "cpu_compute", "lru"])
def test_exact_policies_never_take_cpu_int8_and_keep_their_tokens(engines, policy):
    eng = SpiceEngine(engines["qwen2_moe"].lm)          # its own engine: nothing made before
    ref, _, _ = _run(eng, policy=policy)
    toks, s, rec = _run(eng, policy=policy, tau_int8=1.0)
    assert toks == ref and s.miss_split["cpu_int8"] == 0
    assert not any(e.kind == CPU_INT8_RUN for e in rec.events)
    assert any("tau_int8 1 is ignored" in n for n in s.notes), s.notes
    assert eng._int8_store is None


def test_tau_int8_zero_makes_no_int8_copy(engines):
    eng = SpiceEngine(engines["mixtral"].lm)
    _, s, _ = _run(eng, policy="spice")
    assert s.miss_split["cpu_int8"] == 0 and eng._int8_store is None


@pytest.fixture(scope="module")
def shipped_graphed():
    """The shipped model (it has draft heads, so spice runs the fast path) on the graphed executor, 13 GB/s link."""
    return SpiceEngine.load(None, device="cpu", executor="graphed", link_gbps=13.0)


FAST = dict(policy="spice", cache_frac=0.3, profile="h200-pcie5x16-graphed", shape="deepseek-v2-lite",
            max_new_tokens=10)


def test_the_fast_path_runs_cpu_int8_jobs_inside_its_step(shipped_graphed):
    run = shipped_graphed.start_prompt("Tell me a story about a cat and a ball", RunSettings(**FAST, tau_int8=0.3))
    steps = list(run)
    s = shipped_graphed.get_summary(run.run_id)
    assert any(n.startswith("fast path: decode steps") for n in s.notes), s.notes
    assert s.miss_split["cpu_int8"] > 0 and len(steps) == 10


def test_a_failed_int8_job_on_the_fast_path_falls_back_to_an_exact_copy(shipped_graphed, monkeypatch):
    """Every int8 job fails: each is copied in and run exactly, so the tokens are the exact ones (tau_approx 0)."""
    from spice_core.runtime.cpu_jobs import CpuJobs

    class Failed:
        def result(self, timeout=None):
            raise RuntimeError("CPU-lane worker died")

    def failing(self, key, xs, n, act, out_device, stream=None, decode=False, batch=1):
        return self.clock.cpu_expert(key, n, int8=True), Failed(), "int8"   # (op, job, kernel) as CpuJobs makes

    prompt = "Tell me a story about a cat and a ball"
    ref = [st.token_id for st in shipped_graphed.start_prompt(prompt, RunSettings(**FAST))]
    monkeypatch.setattr(CpuJobs, "submit_int8", failing)
    run = shipped_graphed.start_prompt(prompt, RunSettings(**FAST, tau_int8=0.3))
    toks = [st.token_id for st in run]
    int8 = sum(o.outcome == "cpu_int8" for st in run.record.steps for o in st.outcomes)
    assert toks == ref and run.record.totals["cpu_fallbacks"] == int8 > 0
