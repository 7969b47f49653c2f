"""Prefetching never changes outputs: gate/spice/oracle_prefetch are token-identical to stock
transformers on every tiny family, with a trained draft, across thresholds and depths."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from tiny_models import FAMILIES

PROMPT = [5, 17, 33, 2, 9, 41, 7, 11]
N_NEW = 24


@pytest.fixture(scope="module")
def engines(calibrated_dirs):
    return {f: SpiceEngine.load(d, device="cpu") for f, d in calibrated_dirs.items()}


@pytest.fixture(scope="module")
def references(calibrated_dirs):
    refs = {}
    for fam, d in calibrated_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            out = model.generate(torch.tensor([PROMPT]), max_new_tokens=N_NEW, min_new_tokens=N_NEW,
                                 do_sample=False, pad_token_id=0)
        refs[fam] = out[0, len(PROMPT):].tolist()
    return refs


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("policy", ["gate_prefetch", "spice_prefetch", "oracle_prefetch"])
@pytest.mark.parametrize("cache_frac,tau,depth", [(0.4, 0.2, 4), (0.7, 0.0, 8), (0.4, 1.0, 1)])
def test_prefetch_policy_is_token_identical_to_stock_generate(engines, references, family, policy, cache_frac, tau,
                                                              depth):
    eng = engines[family]
    assert eng.info().has_draft
    s = RunSettings(policy=policy, cache_frac=cache_frac, tau_prefetch=tau, max_lookahead=depth, max_new_tokens=N_NEW)
    run = eng.start_ids(PROMPT, s)
    tokens = [st.token_id for st in run]
    assert tokens == references[family][: len(tokens)]
    totals = eng.get_record(run.run_id).totals
    assert 0 <= totals["wasted_prefetch_bytes"] <= totals["prefetch_bytes"]


@pytest.mark.parametrize("family", FAMILIES)
def test_spice_prefetch_really_prefetches_with_a_low_threshold(engines, family):
    """Guards the exactness test above against passing vacuously."""
    eng = engines[family]
    run = eng.start_ids(PROMPT, RunSettings(policy="spice_prefetch", cache_frac=0.7, tau_prefetch=0.0,
                                            max_lookahead=4, max_new_tokens=8))
    steps = list(run)
    assert eng.get_record(run.run_id).totals["prefetch_bytes"] > 0
    assert any(st.prefetches for st in steps)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("policy", ["spice_prefetch", "spice_no_lore"])
def test_prefetch_planned_after_the_experts_is_token_identical(calibrated_dirs, references, family, policy):
    """The measured-mode order (plan after launching the layer's experts) on the same tiny models."""
    eng = SpiceEngine.load(calibrated_dirs[family], device="cpu", prefetch_after_experts=True)
    s = RunSettings(policy=policy, cache_frac=0.4, tau_prefetch=0.0, max_lookahead=4, max_new_tokens=N_NEW)
    run = eng.start_ids(PROMPT, s)
    tokens = [st.token_id for st in run]
    assert tokens == references[family][: len(tokens)]
    assert eng.get_record(run.run_id).totals["prefetch_bytes"] > 0


@pytest.mark.parametrize("family", ["deepseek_v2", "mixtral"])
def test_a_profile_whose_host_cannot_afford_planning_skips_it_and_stays_exact(calibrated_dirs, references, family):
    from dataclasses import replace

    from spice_core.timing.profiles import get_profile

    slow_host = replace(get_profile("h200-pcie5x16"), host_plan_us=1e6, host_copy_us=10.0)
    eng = SpiceEngine.load(calibrated_dirs[family], device="cpu", hw_profile=slow_host)
    run = eng.start_ids(PROMPT, RunSettings(policy="spice_prefetch", cache_frac=0.4, tau_prefetch=0.0,
                                            max_new_tokens=N_NEW))
    steps = list(run)
    assert [st.token_id for st in steps] == references[family][: len(steps)]
    assert eng.get_record(run.run_id).totals["prefetch_bytes"] == 0
