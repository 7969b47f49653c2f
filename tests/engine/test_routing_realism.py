"""benchmarks/routing_realism.py on a tiny random DeepSeek-V2 (3 MoE layers of 8 experts, top-3): its hit rates are
rates, grow with the budget, and the engine lru figure is the engine's own run's hit rate, measured again here."""
from __future__ import annotations

import pytest

from benchmarks.routing_realism import measure, replay_lru
from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine

BUDGETS = [0.375, 0.5, 0.75]          # 9, 12 and 18 of the 24 routed experts; 3, 4 and 6 a layer
PROMPT = [5, 17, 9, 30, 41, 12]
TOKENS = 12


@pytest.fixture(scope="module")
def engine(tiny_dirs):
    return SpiceEngine.load(tiny_dirs["deepseek_v2"], device="cpu", timing="modeled")


@pytest.fixture(scope="module")
def measured(engine):
    return measure(engine, [PROMPT], BUDGETS, TOKENS)


def test_hit_rates_are_rates_and_grow_with_the_budget(measured):
    rows = measured["budgets"]
    assert [r["budget"] for r in rows] == BUDGETS and [r["cache_slots"] for r in rows] == [9, 12, 18]
    for name in ("engine_lru_hit_rate", "lru_per_layer_hit_rate", "static_oracle_hit_rate",
                 "static_oracle_per_layer_hit_rate"):
        rates = [r[name] for r in rows]
        assert all(0.0 <= x <= 1.0 for x in rates), name
        assert rates == sorted(rates) and rates[-1] > rates[0], name
    assert all(r["tokens_same_as_first_budget"] and r["decode_selections"] == (TOKENS - 1) * 3 * 3 for r in rows)
    skew = measured["routing_skew"]["summary"]
    assert 0.0 < skew["entropy_norm"]["mean"] <= 1.0
    assert skew["top10pct_share"]["mean"] <= skew["top25pct_share"]["mean"] <= skew["top50pct_share"]["mean"] <= 1.0


def test_engine_lru_figure_is_the_engines_own_run_hit_rate(engine, measured):
    for row in measured["budgets"]:
        settings = RunSettings(policy="lru", cache_frac=row["budget"], max_new_tokens=TOKENS)
        run = engine.start_ids(PROMPT, settings)
        for _ in run:
            pass
        assert row["engine_lru_hit_rate"] == pytest.approx(run.summary().hit_rate, abs=1e-12)
        assert row["lru_replay_equals_engine"]


def test_replay_counts_decode_steps_only_from_the_cache_the_prefill_left():
    # One MoE layer of 4 experts, top-2. Room for all four: the prefill's first uses miss (not counted), every decode
    # selection hits. Room for two: the prefill leaves experts 2 and 3, so only step 1's expert 2 hits.
    from spice_core.timing.costs import CostModel
    from spice_core.timing.profiles import get_profile, get_shape

    costs = CostModel(get_profile("rtx4090-pcie4x16"), get_shape("deepseek-v2-lite"))
    steps = [{1: ((0, 1), (2, 3))}, {1: ((0, 2),)}, {1: ((3, 1),)}]
    assert replay_lru([steps], n_slots=4, moe_layers=[1], n_experts=4, top_k=2, costs=costs) == (4, 4)
    assert replay_lru([steps], n_slots=2, moe_layers=[1], n_experts=4, top_k=2, costs=costs) == (1, 4)
