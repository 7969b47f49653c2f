"""The CPU lane's shape in the run's prices: a lane that runs a layer's experts side by side (the default, auto) is
priced so, by the planner and by a modeled clock; a fixed shape (``SPICE_CPU_LANE=1x0``) one after another. The tokens
of an exact policy do not depend on it."""
import pytest

from spice_core.api import RunSettings
from spice_core.exec import cpu_lane as cpu_lane_mod
from spice_core.engine import SpiceEngine

PROMPT = [5, 17, 33, 2, 9, 41, 7]
# the H200 host's measured profile (cpu_side_speedup 1.3); cpu_compute sends every miss to the lane, and the tiny
# DeepSeek-V2 routes 3 experts a token: a decode step's layer sends the lane up to 3, side by side on an auto lane
LANE = dict(policy="cpu_compute", profile="h200-pcie5x16", shape="deepseek-v2-lite", cache_frac=0.3, max_new_tokens=8)


def _run(eng):
    run = eng.start_ids(PROMPT, RunSettings(**LANE))
    toks = [s.token_id for s in run]
    return toks, eng.get_summary(run.run_id)


@pytest.mark.parametrize("shape, side_from", [(None, cpu_lane_mod.AUTO_PARALLEL_FROM), ("auto", 3), ("1x0", 0),
                                              ("3x5", 0)])
def test_a_modeled_run_prices_the_lane_shape_the_machine_names(engines, monkeypatch, shape, side_from):
    if shape is None:
        monkeypatch.delenv(cpu_lane_mod.SHAPE_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_lane_mod.SHAPE_ENV, shape)
    rt = engines["deepseek_v2"].build_runtime(RunSettings(**LANE), notes=[], modeled=True)
    assert rt.planner.costs.lane_side_from == side_from and rt.clock.costs.lane_side_from == side_from


def test_a_policy_without_the_lane_prices_no_lane_shape(engines, monkeypatch):
    monkeypatch.delenv(cpu_lane_mod.SHAPE_ENV, raising=False)
    rt = engines["deepseek_v2"].build_runtime(RunSettings(**{**LANE, "policy": "lru"}), notes=[], modeled=True)
    assert rt.planner.costs.lane_side_from == 0


def test_side_by_side_lane_experts_end_a_modeled_token_sooner_with_the_same_tokens(engines, monkeypatch):
    eng = SpiceEngine(engines["deepseek_v2"].lm)             # its own engine: nothing made before
    monkeypatch.setenv(cpu_lane_mod.SHAPE_ENV, "1x0")
    one_by_one, s_one = _run(eng)
    monkeypatch.setenv(cpu_lane_mod.SHAPE_ENV, "auto")
    side, s_side = _run(eng)
    assert side == one_by_one
    assert s_side.miss_split["cpu"] == s_one.miss_split["cpu"] > 0
    assert s_side.tpot_ms_median < s_one.tpot_ms_median
