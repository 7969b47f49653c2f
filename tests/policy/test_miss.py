"""The per-miss decision on hand-made costs (no tensors): the machine decides CPU vs copy,
approximation only below tau, in-flight prefetches, and the per-layer plan's queue accounting."""
import pytest

from spice_core.api import RunSettings
from spice_core.errors import ConfigError
from spice_core.policy.miss import (MissAction, MissCosts, MissOptions, MissRequest, QueueState, decide_miss,
                                    plan_misses)
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape

EXACT = MissOptions(tau_approx=0.0, can_approx=True, can_cpu=True, can_copy=True)


def machine(profile: str, now_ms: float = 10.0) -> MissCosts:
    """Idle queues; one DeepSeek-V2-Lite expert for one token on ``profile``."""
    c = CostModel(get_profile(profile), get_shape("deepseek-v2-lite"))
    return MissCosts(now_ms=now_ms, copy_free_at_ms=0.0, copy_ms=c.copy_ms(), cpu_free_at_ms=0.0,
                     cpu_ms=c.cpu_expert_ms(1), gpu_ms=c.gpu_expert_ms(1))


def test_on_the_h200_box_a_copy_beats_the_cpu_lane():
    costs = machine("h200-pcie5x16")
    assert costs.copy_ms == pytest.approx(0.325, abs=0.01)      # DESIGN §2: ~0.31 ms per expert
    assert costs.cpu_ms == pytest.approx(1.06, abs=0.05)        # ~1 ms from DRAM on its 16 cores
    assert decide_miss(0.3, costs, EXACT) == MissAction.COPY


def test_on_a_pcie4_x8_desktop_the_cpu_lane_beats_a_copy():
    costs = machine("rtx5090-pcie4x8")
    assert costs.copy_ms > 1.3 > costs.cpu_ms
    assert decide_miss(0.3, costs, EXACT) == MissAction.CPU


def test_the_choice_follows_the_costs_not_the_profile_name():
    # the same desktop, its copy queue backed up by 2 ms of prefetches vs. idle: the CPU wins more clearly;
    # the H200 box with 1 ms of copies queued: now the CPU lane finishes first there too
    h200 = machine("h200-pcie5x16")
    busy = MissCosts(**{**h200.__dict__, "copy_free_at_ms": h200.now_ms + 1.0})
    assert decide_miss(0.3, busy, EXACT) == MissAction.CPU
    slow_cpu = MissCosts(**{**machine("rtx5090-pcie4x8").__dict__, "cpu_ms": 5.0})
    assert decide_miss(0.3, slow_cpu, EXACT) == MissAction.COPY


@pytest.mark.parametrize("weight,tau,expected", [
    (0.049, 0.05, MissAction.APPROX), (0.05, 0.05, MissAction.COPY), (0.2, 0.05, MissAction.COPY),
    (0.0, 0.0, MissAction.COPY), (0.99, 1.0, MissAction.APPROX)])
def test_approximate_only_below_tau(weight, tau, expected):
    opts = MissOptions(tau_approx=tau, can_approx=True, can_cpu=False, can_copy=True)
    assert decide_miss(weight, machine("h200-pcie5x16"), opts) == expected


def test_no_approximation_without_a_surrogate_whatever_tau():
    opts = MissOptions(tau_approx=0.5, can_approx=False, can_cpu=True, can_copy=True)
    assert decide_miss(0.01, machine("rtx5090-pcie4x8"), opts) == MissAction.CPU


def test_an_inflight_prefetch_that_lands_first_is_waited_for():
    costs = machine("rtx5090-pcie4x8")
    soon = MissCosts(**{**costs.__dict__, "inflight_arrival_ms": costs.now_ms + 0.2})
    assert decide_miss(0.3, soon, EXACT) == MissAction.WAIT_PREFETCH
    landed = MissCosts(**{**costs.__dict__, "inflight_arrival_ms": costs.now_ms - 1.0})
    tau = MissOptions(tau_approx=0.5, can_approx=True, can_cpu=True, can_copy=True)
    assert decide_miss(0.01, landed, tau) == MissAction.WAIT_PREFETCH     # landed: a hit, never approximated


def test_a_late_prefetch_loses_to_a_faster_exact_path_or_to_approximation():
    costs = machine("rtx5090-pcie4x8")
    late = MissCosts(**{**costs.__dict__, "inflight_arrival_ms": costs.now_ms + 5.0})
    assert decide_miss(0.3, late, EXACT) == MissAction.CPU
    copy_only = MissOptions(can_cpu=False, can_copy=True)
    assert decide_miss(0.3, late, copy_only) == MissAction.COPY
    approx = MissOptions(tau_approx=0.1, can_approx=True, can_cpu=False, can_copy=True)
    assert decide_miss(0.05, late, approx) == MissAction.APPROX
    nothing_else = MissOptions(can_cpu=False, can_copy=False)
    assert decide_miss(0.3, late, nothing_else) == MissAction.WAIT_PREFETCH


def test_ties_prefer_waiting_then_copying():
    t = MissCosts(now_ms=0.0, copy_free_at_ms=0.0, copy_ms=1.0, cpu_free_at_ms=0.0, cpu_ms=1.0,
                  inflight_arrival_ms=1.0)
    assert decide_miss(0.5, t, EXACT) == MissAction.WAIT_PREFETCH
    assert decide_miss(0.5, MissCosts(**{**t.__dict__, "inflight_arrival_ms": None}), EXACT) == MissAction.COPY


def test_no_exact_path_is_an_internal_error():
    with pytest.raises(ValueError, match="no exact miss path"):
        decide_miss(0.5, machine("h200-pcie5x16"), MissOptions(can_cpu=False, can_copy=False))


def _requests(profile: str, weights):
    c = CostModel(get_profile(profile), get_shape("deepseek-v2-lite"))
    return [MissRequest(w, c.copy_ms(), c.cpu_expert_ms(1), c.gpu_expert_ms(1)) for w in weights]


def test_a_layer_of_misses_is_shared_out_between_the_copy_queue_and_the_cpu_lane():
    # PCIe 4.0 x8: the CPU lane is slightly faster, but 6 misses must not all queue on it
    q = QueueState(now_ms=0.0, copy_free_at_ms=0.0)
    acts = plan_misses(_requests("rtx5090-pcie4x8", [0.3] * 6), q, EXACT)
    assert acts[0] == MissAction.CPU and acts.count(MissAction.COPY) == 3 and acts.count(MissAction.CPU) == 3
    assert q.copy_free_at_ms > 0 and q.cpu_free_at_ms[0] > 0
    # H200: copies win until the copy backlog nears one CPU run (~3 copies), then the CPU takes one in four
    acts = plan_misses(_requests("h200-pcie5x16", [0.3] * 8), QueueState(now_ms=0.0, copy_free_at_ms=0.0), EXACT)
    assert acts[:2] == [MissAction.COPY] * 2 and acts.count(MissAction.CPU) == 2 and acts.count(MissAction.COPY) == 6


def test_plan_charges_copies_behind_prefetches_already_queued():
    c = CostModel(get_profile("rtx4090-pcie4x16"), get_shape("deepseek-v2-lite"))
    assert c.copy_ms() < c.cpu_expert_ms(1)                      # idle: a copy would win here
    q = QueueState(now_ms=5.0, copy_free_at_ms=5.0 + 3 * c.copy_ms())   # three prefetches ahead
    assert plan_misses(_requests("rtx4090-pcie4x16", [0.3]), q, EXACT) == [MissAction.CPU]


def test_plan_with_several_cpu_workers_uses_the_earliest_free():
    q = QueueState(now_ms=0.0, copy_free_at_ms=100.0, cpu_free_at_ms=[4.0, 0.0])
    reqs = [MissRequest(0.3, copy_ms=1.0, cpu_ms=1.0)] * 3
    assert plan_misses(reqs, q, EXACT) == [MissAction.CPU] * 3
    assert q.cpu_free_at_ms == [4.0, 3.0]


def test_plan_approximates_below_tau_without_touching_the_queues():
    q = QueueState(now_ms=0.0, copy_free_at_ms=0.0)
    opts = MissOptions(tau_approx=0.1, can_approx=True, can_cpu=True, can_copy=True)
    acts = plan_misses(_requests("h200-pcie5x16", [0.05, 0.5, 0.09]), q, opts)
    assert acts == [MissAction.APPROX, MissAction.COPY, MissAction.APPROX]
    assert q.cpu_free_at_ms == [0.0]


@pytest.mark.parametrize("tau", [-0.01, 1.01, 2.0])
def test_tau_approx_outside_unit_interval_says_the_allowed_range(tau):
    with pytest.raises(ConfigError, match=r"tau_approx=.* is out of range: use a value in \[0.0, 1.0\]"):
        RunSettings(tau_approx=tau)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\]"):
        MissOptions(tau_approx=tau)


def test_a_copy_is_credited_with_the_later_hits_it_buys():
    # PCIe 4.0 x8: the CPU lane is ~0.1 ms faster per miss, but a copy stays cached; at a 50% hit
    # rate the transfer it saves later outweighs that, unless the copy queue is backed up
    desk = machine("rtx5090-pcie4x8")
    credit = 0.5 * desk.copy_ms
    assert decide_miss(0.3, MissCosts(**{**desk.__dict__, "copy_value_ms": credit}), EXACT) == MissAction.COPY
    backed_up = MissCosts(**{**desk.__dict__, "copy_value_ms": credit, "copy_free_at_ms": desk.now_ms + 2.0})
    assert decide_miss(0.3, backed_up, EXACT) == MissAction.CPU
    reqs = [MissRequest(0.3, desk.copy_ms, desk.cpu_ms, desk.gpu_ms, copy_value_ms=credit)] * 6
    acts = plan_misses(reqs, QueueState(now_ms=0.0, copy_free_at_ms=0.0), EXACT)
    assert acts[0] == MissAction.COPY and MissAction.CPU in acts


def test_plan_never_copies_an_expert_whose_prefetch_is_in_flight():
    # the copy credit would make a second copy look cheapest; the prefetch is already that copy
    desk = machine("rtx5090-pcie4x8", now_ms=0.0)
    late = MissRequest(0.3, desk.copy_ms, cpu_ms=50.0, gpu_ms=desk.gpu_ms, inflight_arrival_ms=3.0,
                       copy_value_ms=10.0)
    assert plan_misses([late], QueueState(now_ms=0.0, copy_free_at_ms=3.0), EXACT) == [MissAction.WAIT_PREFETCH]
    soon_cpu = MissRequest(0.3, desk.copy_ms, cpu_ms=1.0, inflight_arrival_ms=3.0, copy_value_ms=10.0)
    assert plan_misses([soon_cpu], QueueState(now_ms=0.0, copy_free_at_ms=3.0), EXACT) == [MissAction.CPU]


def test_the_cpu_lane_is_offered_only_where_it_beats_an_idle_link_copy():
    """Measured on the H200 (docs/benchmarks/cpu-lane): offered on the native link the lane cost spice ~8 ms a token;
    on the emulated PCIe 4.0 x8 link it made spice 3.25x faster than on_demand."""
    from dataclasses import replace

    from spice_core.assembly import lane_pays
    from spice_core.timing.costs import CostModel
    from spice_core.timing.profiles import get_profile, get_shape

    prof, shape = get_profile("h200-pcie5x16-graphed"), get_shape("deepseek-v2-lite", None)
    assert not lane_pays(CostModel(prof, shape))                                   # native: a copy is 0.32 ms
    assert lane_pays(CostModel(replace(prof, h2d_pinned_gbps=13.0), shape))        # x8: a copy is 1.33 ms


# ---------------------------------------------------------------------- the lossy int8 CPU run
INT8 = MissOptions(tau_approx=0.05, can_approx=True, can_cpu=True, can_copy=True, tau_int8=0.3, can_int8=True)


def _int8_costs(**over) -> MissCosts:
    """A PCIe 4.0 x8 desktop: the int8 run (half the bytes) finishes before the exact CPU run and the copy."""
    c = CostModel(get_profile("rtx5090-pcie4x8"), get_shape("deepseek-v2-lite"))
    base = dict(now_ms=10.0, copy_free_at_ms=0.0, copy_ms=c.copy_ms(), cpu_free_at_ms=0.0, cpu_ms=c.cpu_expert_ms(1),
                gpu_ms=c.gpu_expert_ms(1), cpu_int8_ms=c.cpu_int8_expert_ms(1))
    return MissCosts(**{**base, **over})


def test_the_int8_run_costs_about_half_the_exact_cpu_run():
    c = CostModel(get_profile("h200-pcie5x16-graphed"), get_shape("deepseek-v2-lite"))
    assert c.int8_expert_bytes == 2048 * 1408 * 3 + 2 * (2 * 1408 + 2048)     # a byte a weight, a bf16 scale a row
    task_ms = c.profile.cpu_task_us / 1e3
    assert c.cpu_int8_expert_ms(1) - task_ms == pytest.approx((c.cpu_expert_ms(1) - task_ms) / 2, rel=0.02)


@pytest.mark.parametrize("weight,expected", [
    (0.01, MissAction.APPROX),          # LoRE keeps the lowest weights
    (0.05, MissAction.CPU_INT8), (0.29, MissAction.CPU_INT8),
    (0.3, MissAction.CPU), (0.9, MissAction.CPU)])     # at or above tau_int8: exact
def test_int8_only_between_tau_approx_and_tau_int8(weight, expected):
    assert decide_miss(weight, _int8_costs(), INT8) == expected


def test_int8_is_taken_only_when_it_finishes_before_the_exact_choice():
    backed_up_lane = _int8_costs(cpu_free_at_ms=10.0 + 5.0)        # the copy now finishes first
    assert decide_miss(0.2, backed_up_lane, INT8) == MissAction.COPY
    soon = _int8_costs(inflight_arrival_ms=10.1)                   # an exact prefetch lands sooner
    assert decide_miss(0.2, soon, INT8) == MissAction.WAIT_PREFETCH


def test_int8_is_never_taken_where_it_is_not_offered():
    for opts in (MissOptions(**{**INT8.__dict__, "can_int8": False}), MissOptions(**{**INT8.__dict__, "tau_int8": 0.0}),
                 EXACT):
        assert decide_miss(0.2, _int8_costs(), opts) == MissAction.CPU
    assert decide_miss(0.2, _int8_costs(cpu_int8_ms=None), INT8) == MissAction.CPU


def test_plan_charges_int8_runs_to_the_cpu_lane():
    c = _int8_costs()
    reqs = [MissRequest(0.2, c.copy_ms, c.cpu_ms, c.gpu_ms, cpu_int8_ms=c.cpu_int8_ms)] * 6
    q = QueueState(now_ms=0.0, copy_free_at_ms=0.0)
    acts = plan_misses(reqs, q, INT8)
    assert acts[0] == MissAction.CPU_INT8 and MissAction.COPY in acts and MissAction.CPU not in acts
    assert q.cpu_free_at_ms[0] == pytest.approx(acts.count(MissAction.CPU_INT8) * c.cpu_int8_ms)


@pytest.mark.parametrize("tau", [-0.01, 1.01, float("nan")])
def test_tau_int8_outside_unit_interval_names_the_flag(tau):
    with pytest.raises(ConfigError, match=r"tau_int8=.* is out of range: use a value in \[0, 1\] \(--tau-int8"):
        RunSettings(tau_int8=tau)
    with pytest.raises(ValueError, match=r"tau_int8=.* must be in \[0, 1\]"):
        MissOptions(tau_int8=tau)


def test_int8_makes_spice_lossy_but_no_exact_policy():
    from spice_core.api import EXACT_POLICIES

    assert not RunSettings(policy="spice", tau_int8=0.3).exact and RunSettings(policy="spice").exact
    assert RunSettings(policy="spice_no_lore", tau_int8=0.3).exact and "spice" not in EXACT_POLICIES


def test_approximated_misses_charge_no_queue_so_the_others_are_decided_as_if_they_were_not_there():
    """What the planner's rule-2 pre-pass relies on: plan_misses over every miss gives the non-approximated ones
    the actions it gives them alone (the planner skips building requests for the approximated ones)."""
    import random

    rng = random.Random(3)
    opts = MissOptions(tau_approx=0.05, can_approx=True, can_cpu=True, tau_int8=0.1, can_int8=True)
    for _ in range(300):
        reqs = []
        for _ in range(rng.randint(1, 8)):
            inflight = rng.choice([None, None, rng.uniform(-1.0, 2.0)])
            reqs.append(MissRequest(rng.choice([0.01, 0.03, 0.2, 0.4]), 0.32, rng.uniform(0.2, 1.0), 0.05, inflight,
                                    rng.uniform(0.0, 0.3), rng.uniform(0.3, 1.2), 0.3, 0.4))
        state = dict(now_ms=0.0, copy_free_at_ms=rng.uniform(0.0, 1.0), cpu_free_at_ms=[rng.uniform(0.0, 1.0)] * 2)
        def queues():
            return QueueState(**{**state, "cpu_free_at_ms": list(state["cpu_free_at_ms"])})

        every = plan_misses(reqs, queues(), opts)
        rest = [i for i, a in enumerate(every) if a != MissAction.APPROX]
        alone = plan_misses([reqs[i] for i in rest], queues(), opts)
        assert [every[i] for i in rest] == alone
        assert all(every[i] == MissAction.APPROX for i in range(len(reqs)) if reqs[i].router_weight < 0.05
                   and not (reqs[i].inflight_arrival_ms is not None and reqs[i].inflight_arrival_ms <= 0.0))


def test_a_lane_that_runs_experts_side_by_side_prices_a_layers_third_expert_at_its_share():
    # copies 1.0 ms each, one CPU expert 0.9 ms: one after another, the lane and the link take turns
    reqs = [MissRequest(0.3, copy_ms=1.0, cpu_ms=0.9)] * 6
    serial = plan_misses(reqs, QueueState(now_ms=0.0, copy_free_at_ms=0.0), EXACT)
    assert serial == [MissAction.CPU, MissAction.COPY] * 3
    # side by side from 3 at 1.5x: a third lane expert ends the layer's three at 3 x 0.9 / 1.5 = 1.8 ms, before a
    # second copy lands (2.0): the lane takes the 4th miss too, and the planner books the lane's wall, not its sum
    q = QueueState(now_ms=0.0, copy_free_at_ms=0.0, side_from=3, side_speedup=1.5)
    side = plan_misses(reqs, q, EXACT)
    assert side == [MissAction.CPU, MissAction.COPY, MissAction.CPU, MissAction.CPU, MissAction.COPY, MissAction.CPU]
    assert q.cpu_free_at_ms == [pytest.approx(4 * 0.9 / 1.5)] and q.copy_free_at_ms == pytest.approx(2.0)


@pytest.mark.parametrize("profile", ["rtx5090-pcie4x8", "h200-pcie5x16", "rtx4060-pcie4x8"])
def test_side_by_side_at_speedup_one_or_never_is_the_one_after_another_plan(profile):
    reqs = _requests(profile, [0.3, 0.2, 0.5, 0.4, 0.3, 0.6])
    base_q = QueueState(now_ms=1.0, copy_free_at_ms=2.0, cpu_free_at_ms=[0.5])
    base = plan_misses(reqs, base_q, EXACT)
    for side_from, speedup in ((3, 1.0), (0, 1.5)):
        q = QueueState(now_ms=1.0, copy_free_at_ms=2.0, cpu_free_at_ms=[0.5], side_from=side_from,
                       side_speedup=speedup)
        assert plan_misses(reqs, q, EXACT) == base
        assert q.cpu_free_at_ms == base_q.cpu_free_at_ms and q.copy_free_at_ms == base_q.copy_free_at_ms


def test_the_cost_models_lane_batch_factor_follows_the_lanes_shape():
    profile = get_profile("h200-pcie5x16-graphed")
    assert profile.cpu_side_speedup > 1.0                        # measured (profiles.json says where)
    fixed = CostModel(profile, get_shape("deepseek-v2-lite"))
    auto = CostModel(profile, get_shape("deepseek-v2-lite"), lane_side_from=3)
    assert [fixed.lane_batch_factor(n) for n in (1, 3, 6)] == [1.0, 1.0, 1.0]
    assert [auto.lane_batch_factor(n) for n in (1, 2)] == [1.0, 1.0]
    assert auto.lane_batch_factor(3) == auto.lane_batch_factor(6) == pytest.approx(1.0 / profile.cpu_side_speedup)
    assert get_profile("rtx4060-pcie4x8").cpu_side_speedup == 1.0   # not measured: no gain assumed


def test_a_profile_refuses_a_side_speedup_of_zero():
    from dataclasses import replace
    with pytest.raises(ConfigError, match="cpu_side_speedup"):
        replace(get_profile("h200-pcie5x16"), cpu_side_speedup=0.0)
