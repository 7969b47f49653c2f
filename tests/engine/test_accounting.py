"""Cache accounting and event bookkeeping invariants."""
import pytest

from spice_core.api import RunSettings
from spice_core.trace.chrome_schema import validate_chrome_trace
from spice_core.trace.export import build_chrome_trace

PROMPT = [3, 14, 15, 9, 26, 5]


@pytest.mark.parametrize("policy", ["on_demand", "lru", "cpu_compute", "gate_prefetch", "oracle_prefetch"])
@pytest.mark.parametrize("frac", [0.2, 0.5])
def test_cache_never_exceeds_budget_and_hits_plus_misses_equal_selections(engines, policy, frac):
    eng = engines["deepseek_v2"]
    lm = eng.lm
    budget = frac * eng.routed_bytes
    peak = []

    def after_layer(rt, layer):
        peak.append(rt.used_bytes)
        assert rt.slots.capacity_bytes <= budget

    run = eng.start_ids(PROMPT, RunSettings(policy=policy, cache_frac=frac, max_new_tokens=12))
    run.layer_observers.append(after_layer)
    steps = list(run)
    assert peak and max(peak) <= budget
    for st in steps:
        n_tokens = len(PROMPT) if st.index == 0 else 1
        selections = n_tokens * lm.top_k * len(lm.moe_layers)
        assert st.hits + st.misses == selections
        assert len(st.outcomes) == len({(o.layer, o.expert) for o in st.outcomes})


def test_resident_never_misses_and_on_demand_never_hits(engines):
    eng = engines["deepseek_v2"]
    res = list(eng.start_ids(PROMPT, RunSettings(policy="resident", max_new_tokens=6)))
    od = list(eng.start_ids(PROMPT, RunSettings(policy="on_demand", cache_frac=0.3, max_new_tokens=6)))
    assert all(s.misses == 0 for s in res)
    assert all(s.hits == 0 and s.bytes_copied > 0 for s in od)


@pytest.mark.parametrize("policy", ["lru", "cpu_compute", "gate_prefetch"])
def test_exported_chrome_trace_passes_schema_check(engines, tmp_path, policy):
    import json

    eng = engines["deepseek_v2"]
    run = eng.start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.3, max_new_tokens=8))
    list(run)
    path = eng.export_chrome_trace(run.run_id, tmp_path)
    obj = json.loads(path.read_text())
    assert validate_chrome_trace(obj) == []
    lanes = {e["args"]["name"] for e in obj["traceEvents"] if e.get("ph") == "M" and e.get("name") == "thread_name"}
    want = {"gpu", "host", "cpu0"} if policy == "cpu_compute" else {"gpu", "copy", "host"}
    assert want <= {ln.split("#")[0] for ln in lanes}
    assert validate_chrome_trace(build_chrome_trace(eng.get_events(run.run_id), metadata={})) == []


def test_tensorboard_and_csv_exports(engines, tmp_path):
    import zipfile

    import pandas as pd

    eng = engines["deepseek_v2"]
    run = eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=5))
    list(run)
    z = eng.export_tensorboard_zip(run.run_id, tmp_path)
    names = zipfile.ZipFile(z).namelist()
    assert names == [f"spice-{run.run_id}/spice.pt.trace.json.gz"]      # unpacks as a logdir of one run
    assert sorted(p.name for p in tmp_path.iterdir()) == [z.name]        # the zip alone: no run folder left beside it
    df = pd.read_csv(eng.export_csv(run.run_id, tmp_path))
    assert len(df) == 5 and {"step_ms", "hit_selections", "miss_selections"} <= set(df.columns)


def test_modeled_times_follow_the_profile(engines):
    """A slower link must make on_demand slower in modeled time (same decisions)."""
    eng = engines["deepseek_v2"]
    fast = list(eng.start_ids(PROMPT, RunSettings(policy="on_demand", cache_frac=0.3, max_new_tokens=4,
                                                  profile="h200-pcie5x16")))
    slow = list(eng.start_ids(PROMPT, RunSettings(policy="on_demand", cache_frac=0.3, max_new_tokens=4,
                                                  profile="rtx4060-pcie4x8")))
    assert [s.token_id for s in fast] == [s.token_id for s in slow]
    assert slow[-1].step_ms > 2 * fast[-1].step_ms
    assert all(s.timing == "modeled" for s in fast)


def test_cancel_between_tokens_frees_the_engine(engines):
    eng = engines["deepseek_v2"]
    run = eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=30))
    got = []
    for st in run:
        got.append(st)
        if len(got) == 3:
            run.cancel()
    assert len(got) == 3
    assert run.summary().finish_reason == "cancelled"
    assert len(list(eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=2)))) == 2


def test_second_concurrent_generation_is_refused_clearly(engines):
    from spice_core.engine import EngineBusyError

    eng = engines["deepseek_v2"]
    a = iter(eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=5)))
    next(a)
    with pytest.raises(EngineBusyError, match="busy"):
        next(iter(eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=5))))
    a.close()
    assert len(list(eng.start_ids(PROMPT, RunSettings(policy="lru", cache_frac=0.3, max_new_tokens=2)))) == 2
