"""resident's one-graph step in the timing model: the fitted kernel cost, the modeled step, and the engine's use."""
import json
from dataclasses import replace

import pytest

from spice_core.errors import ConfigError
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.timing.timeline import ONE_GRAPH_NOTE, ModeledTimeline
from spice_core.tools.recalibrate import fit_graph_step_kernel_us

SHAPE = get_shape("deepseek-v2-lite")
MOE_LAYERS, DENSE_LAYERS, TOP_K = 26, 1, 6


def _resident(tpot_ms, note=f"fast path: decode steps replay CUDA graphs ({ONE_GRAPH_NOTE}, captured in 0.6 s)"):
    return {"policy": "resident", "timing": "measured", "tpot_ms_median": tpot_ms, "notes": [note]}


def _token_ms(clock: ModeledTimeline, token: int = 1) -> float:
    """One decode token as the graphed executor reports it: the dense layer, then every MoE layer."""
    clock.start_token(token)
    clock.layer(0, 1, dense=True)
    for layer in range(1, 1 + MOE_LAYERS):
        clock.layer(layer, 1, dense=False)
    return clock.end_token()


def test_the_fitted_kernel_cost_models_the_measured_step_back():
    profile = get_profile("h200-pcie5x16-graphed")
    fit = fit_graph_step_kernel_us([_resident(5.5)], profile, SHAPE, MOE_LAYERS, DENSE_LAYERS, TOP_K)
    k = fit["graph_step_kernel_us"]
    assert 0 < k < profile.gpu_kernel_us
    clock = ModeledTimeline(CostModel(replace(profile, graph_step_kernel_us=k), SHAPE), native_expert_bytes=1)
    segmented = _token_ms(ModeledTimeline(CostModel(profile, SHAPE), native_expert_bytes=1))
    assert clock.one_graph_step(TOP_K)
    assert _token_ms(clock) == pytest.approx(5.5, rel=1e-9)
    assert segmented > 5.5 + profile.host_step_us / 1e3     # segments at eager kernel cost, plus the host step


def test_without_the_kernel_cost_the_step_stays_segmented():
    profile = get_profile("h200-pcie5x16-graphed")
    assert profile.graph_step_kernel_us == 0
    clock = ModeledTimeline(CostModel(profile, SHAPE), native_expert_bytes=1)
    assert not clock.one_graph_step(TOP_K)
    assert _token_ms(clock) == pytest.approx(_token_ms(ModeledTimeline(CostModel(profile, SHAPE), 1)))


def test_the_hosts_step_overlaps_the_next_graph_instead_of_adding_to_it():
    """Run ahead, a token takes the longer of the GPU step and the host's per-token step, not their sum."""
    base = replace(get_profile("h200-pcie5x16-graphed"), graph_step_kernel_us=1.0)
    gpu_only = ModeledTimeline(CostModel(replace(base, host_step_us=0.0), SHAPE), 1)
    gpu_only.one_graph_step(TOP_K)
    gpu_ms = _token_ms(gpu_only)
    for host_us in (0.5 * gpu_ms * 1e3, 3.0 * gpu_ms * 1e3):
        clock = ModeledTimeline(CostModel(replace(base, host_step_us=host_us), SHAPE), 1)
        clock.one_graph_step(TOP_K)
        first, second = _token_ms(clock, 1), _token_ms(clock, 2)
        assert first == pytest.approx(max(gpu_ms, host_us / 1e3)) and second == pytest.approx(first)


def test_the_fit_needs_a_one_graph_resident_record_and_refuses_an_impossible_one():
    profile = get_profile("h200-pcie5x16-graphed")
    segmented = _resident(7.5, note="fast path: decode steps replay CUDA graphs (27 segments captured in 0.5 s)")
    assert fit_graph_step_kernel_us([segmented, {"policy": "lru", "timing": "measured", "tpot_ms_median": 40.0}],
                                    profile, SHAPE, MOE_LAYERS, DENSE_LAYERS, TOP_K) is None
    with pytest.raises(ConfigError, match="gpu_mem_gbps"):
        fit_graph_step_kernel_us([_resident(0.01)], profile, SHAPE, MOE_LAYERS, DENSE_LAYERS, TOP_K)
    with pytest.raises(ConfigError, match="--dense-layers"):
        fit_graph_step_kernel_us([_resident(5.5)], profile, SHAPE, MOE_LAYERS, -1, TOP_K)


def _bench_resident(tmp_path, name, profile):
    from spice_core.tools.bench import _load_config, run_bench

    (tmp_path / f"{name}.json").write_text(json.dumps(profile.as_dict()))
    cfg = {"model": "random:tiny-deepseek", "timing": "modeled", "executor": "graphed", "policies": ["resident"],
           "prompts": {"random_ids": 1}, "max_new_tokens": 3, "reference_generate": False,
           "hw_profile": str(tmp_path / f"{name}.json")}
    path = tmp_path / f"cfg-{name}.json"
    path.write_text(json.dumps(cfg))
    (rec,) = run_bench(_load_config(path), tmp_path / f"out-{name}", "cpu")
    return rec


def test_a_modeled_resident_run_takes_the_one_graph_step_its_profile_gives(tmp_path):
    profile = replace(get_profile("h200-pcie5x16-graphed"), host_step_us=0.0)
    plain = _bench_resident(tmp_path, "plain", profile)
    graph = _bench_resident(tmp_path, "graph", replace(profile, graph_step_kernel_us=1.0))
    dearer = _bench_resident(tmp_path, "dearer", replace(profile, graph_step_kernel_us=2.0))
    assert not any("one graph run ahead" in n for n in plain["notes"])
    assert any("one graph run ahead" in n for n in graph["notes"])
    assert graph["tpot_ms_median"] < dearer["tpot_ms_median"] < plain["tpot_ms_median"]


def test_each_moe_layer_of_the_graph_reads_its_routed_experts():
    base = replace(get_profile("h200-pcie5x16-graphed"), graph_step_kernel_us=1.0, host_step_us=0.0)
    token_ms = {}
    for top_k in (6, 8):
        clock = ModeledTimeline(CostModel(base, SHAPE), 1)
        clock.one_graph_step(top_k)
        token_ms[top_k] = _token_ms(clock)
    assert token_ms[8] - token_ms[6] == pytest.approx(MOE_LAYERS * CostModel(base, SHAPE).gpu_routed_read_ms(2))
