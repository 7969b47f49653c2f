"""The modeled clock charges a side-by-side lane's jobs their share of the layer's wall (`CostModel.lane_batch_factor`),
and keeps that through a one-graph step's profile swap."""
from dataclasses import replace

import pytest

from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.timing.timeline import ModeledTimeline
from spice_core.types import ExpertKey

PROFILE = "h200-pcie5x16-graphed"      # measured cpu_side_speedup


def _lane_ms(costs: CostModel, batch: int) -> float:
    clock = ModeledTimeline(costs, native_expert_bytes=costs.expert_bytes)
    ops = [clock.cpu_expert(ExpertKey(1, e), 1, batch=batch) for e in range(batch)]
    return ops[-1].end_ms - ops[0].start_ms


@pytest.mark.parametrize("batch", [1, 2, 3, 6])
def test_a_layers_lane_jobs_end_when_the_lanes_shape_says(batch):
    profile, shape = get_profile(PROFILE), get_shape("deepseek-v2-lite")
    fixed, auto = CostModel(profile, shape), CostModel(profile, shape, lane_side_from=3)
    one = fixed.cpu_expert_ms(1)
    assert _lane_ms(fixed, batch) == pytest.approx(batch * one)
    want = batch * one / (profile.cpu_side_speedup if batch >= 3 else 1.0)
    assert _lane_ms(auto, batch) == pytest.approx(want)


def test_a_one_graph_step_keeps_the_lanes_shape():
    profile = replace(get_profile(PROFILE), graph_step_kernel_us=3.0)      # a profile with a one-graph step cost
    costs = CostModel(profile, get_shape("deepseek-v2-lite"), lane_side_from=3)
    clock = ModeledTimeline(costs, native_expert_bytes=costs.expert_bytes)
    assert clock.one_graph_step(top_k=6)
    assert clock.costs.lane_side_from == 3 and clock.costs.profile.graph_step_kernel_us > 0
