"""Baselines by replay: a run's recorded routing through the real planner and the modeled clock, no model.
Replaying a routing-pure policy's own run must give back exactly that run's modeled TPOT."""
import pytest

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from spice_core.timing.whatif import replay_tpot_ms, routing_of


@pytest.fixture(scope="module")
def shipped():
    return SpiceEngine.load(None, device="cpu")


@pytest.mark.parametrize("policy", ["lru", "on_demand", "resident"])
def test_replaying_a_runs_routing_gives_back_its_own_modeled_tpot(shipped, policy):
    run = shipped.start_prompt("Tell me a story about a cat", RunSettings(policy=policy, max_new_tokens=10))
    list(run)
    summary = shipped.get_summary(run.run_id)
    assert shipped.baselines(run.run_id)[policy] == pytest.approx(summary.tpot_ms_median, rel=1e-9)


def test_a_spice_run_sits_between_its_baselines_and_the_app_says_how_far(shipped):
    pytest.importorskip("gradio")
    from pages.trace_explorer import summary_html

    run = shipped.start_prompt("Tell me a story about a dog", RunSettings(policy="spice_prefetch", max_new_tokens=10))
    list(run)
    s, b = shipped.get_summary(run.run_id), shipped.baselines(run.run_id)
    assert b["resident"] < b["lru"] < b["on_demand"]
    html = summary_html(s, "", b)
    assert "vs lru" in html and "vs on_demand" in html and "vs resident floor" in html and "same routing" in html


def test_only_routing_pure_policies_replay():
    with pytest.raises(ValueError, match="cannot be replayed"):
        replay_tpot_ms([{}], "spice", None, moe_layers=(1,), n_layers=2, n_experts=4, top_k=1, cache_frac=0.5,
                       native_expert_bytes=10)
    assert routing_of([]) == []


def test_the_default_lore_rank_is_noted_only_where_the_run_may_approximate_and_never_asks_to_refit(shipped):
    """Regression (review): every default run on a shipped model (tau_approx 0 included) told the user to refit LoRE,
    although the default rank means "up to 16" and the shipped factors (rank 4) are used whole as asked."""
    exact = shipped.start_prompt("Once", RunSettings(policy="spice", tau_approx=0.0, max_new_tokens=2))
    list(exact)
    lossy = shipped.start_prompt("Once", RunSettings(policy="spice", tau_approx=0.05, max_new_tokens=2))
    list(lossy)
    exact_notes, lossy_notes = " ".join(exact.summary().notes), " ".join(lossy.summary().notes)
    assert "LoRE at rank" not in exact_notes and "refit" not in exact_notes, exact_notes
    assert "LoRE at rank 4, the largest of the model's factors" in lossy_notes and "refit" not in lossy_notes
