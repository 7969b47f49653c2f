"""The LayerPlanner on hand-made routing: every decision of a layer as plain data, no tensors, no device."""
import pytest

from spice_core.errors import ConfigError
from spice_core.policy.planner import CpuTasks, LayerPlanner, Queues, int8_tasks
from spice_core.policy.prefetch import LayerPrediction
from spice_core.policy.spec import get_spec
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.types import ExpertKey

COSTS = CostModel(get_profile("rtx4090-pcie4x16"), get_shape("deepseek-v2-lite"))   # no host costs
NOW = Queues(now_ms=0.0, copy_free_at_ms=0.0)


def planner(policy, n_slots, top_k=1, n_experts=4, layers=(1, 2), **kw):
    return LayerPlanner(get_spec(policy), n_slots=n_slots, n_experts=n_experts, top_k=top_k, moe_layers=layers,
                        costs=COSTS, **kw)


def step(p, layer, experts, weights=None, queues=NOW, batched=False):
    """One token's routing at ``layer`` ([T][K] lists): the plan, then its expert runs."""
    weights = weights or [[0.5] * len(row) for row in experts]
    plan = p.plan_layer(layer, experts, weights, queues)
    return plan, p.plan_experts(plan, batched=batched)


def test_lru_copies_a_miss_then_hits_it_and_evicts_the_least_recently_used():
    p = planner("lru", n_slots=2)
    plan, runs = step(p, 1, [[0]])
    assert plan.outcomes == {0: "copy"} and [o.key for o in plan.copies] == [ExpertKey(1, 0)]
    assert plan.copies[0].evicted is None and runs[0].slot == plan.copies[0].slot
    plan, _ = step(p, 1, [[0]])
    assert plan.outcomes == {0: "hit"} and plan.copies == ()
    step(p, 2, [[1]])                       # cache: (1,0) then (2,1), both used
    step(p, 1, [[0]])                       # (1,0) is now the most recent
    plan, _ = step(p, 2, [[3]])
    assert plan.copies[0].evicted == ExpertKey(2, 1)          # the least recently used goes
    assert ExpertKey(1, 0) in p.residency and ExpertKey(2, 3) in p.residency


def test_on_demand_keeps_nothing_after_the_layer():
    p = planner("on_demand", n_slots=2)
    _, runs = step(p, 1, [[2]])
    assert runs[0].drop_after and len(p.residency) == 0
    plan, _ = step(p, 1, [[2]])
    assert plan.outcomes == {2: "copy"}


def test_resident_places_every_expert_once_and_never_misses():
    p = planner("resident", n_slots=8)
    placed = p.place_static([ExpertKey(layer, e) for layer in (1, 2) for e in range(4)])
    assert len(placed) == 8 and len({slot for slot, _ in placed}) == 8
    plan, runs = step(p, 2, [[3]])
    assert plan.outcomes == {3: "hit"} and runs[0].slot == dict((k, s) for s, k in placed)[ExpertKey(2, 3)]


def test_spice_approximates_only_below_tau_approx_and_copies_the_rest():
    p = planner("spice", n_slots=4, top_k=2, tau_approx=0.1, can_approx=True)
    plan, runs = step(p, 1, [[0, 1]], [[0.05, 0.6]])
    assert plan.outcomes == {0: "approx", 1: "copy"}
    assert [r.outcome for r in runs] == ["approx", "copy"] and runs[0].slot == -1
    assert plan.hits == 0 and plan.misses == 2


def test_a_live_tau_approx_change_decides_the_next_layer():
    """The miss options are made once per threshold (the planner's cache): a slider move must still count."""
    p = planner("spice", n_slots=4, top_k=2, tau_approx=0.1, can_approx=True)
    plan, _ = step(p, 1, [[0, 1]], [[0.15, 0.6]])
    assert plan.outcomes == {0: "copy", 1: "copy"}
    p.tau_approx = 0.2
    plan, _ = step(p, 2, [[0, 1]], [[0.15, 0.6]])
    assert plan.outcomes == {0: "approx", 1: "copy"}
    p.tau_approx = 0.1
    plan, _ = step(p, 2, [[2, 3]], [[0.15, 0.6]])
    assert plan.outcomes == {2: "copy", 3: "copy"}


def test_a_miss_goes_to_the_cpu_lane_when_it_finishes_first():
    slow_link = CostModel(get_profile("rtx4060-pcie4x8"), get_shape("qwen2-57b-a14b"))
    p = LayerPlanner(get_spec("spice_no_lore"), n_slots=4, n_experts=4, top_k=1, moe_layers=(1, 2),
                     costs=slow_link, can_cpu=True)
    plan, runs = step(p, 1, [[2]], queues=Queues(0.0, copy_free_at_ms=50.0))     # the copy queue is busy
    assert plan.outcomes == {2: "cpu"} and plan.cpu == (2,) and runs == ()


def test_a_prefetch_is_planned_from_confident_predictions_and_used_by_the_layer_it_was_for():
    p = planner("spice_prefetch", n_slots=4, tau_prefetch=0.5, max_lookahead=2)
    step(p, 1, [[0]])
    preds = [LayerPrediction(1, 2, (0.0, 0.0, 0.0, 0.9))]          # layer 2 will want expert 3
    orders = p.plan_prefetch(1, preds, NOW)
    assert [(o.key, o.kind) for o in orders.copies] == [(ExpertKey(2, 3), "prefetch")]
    assert orders.depth >= 1
    p.prefetch_issued(orders.copies[0], layer=1, issued_ms=0.0, arrival_ms=0.5)
    plan, runs = step(p, 2, [[3]], queues=Queues(now_ms=1.0, copy_free_at_ms=0.5))
    assert plan.outcomes == {3: "prefetch_hit"} and runs[0].prefetch_used.arrival_ms == 0.5
    assert ExpertKey(2, 3) not in p.inflight


def test_an_unused_prefetch_evicted_later_is_reported_as_wasted():
    p = planner("spice_prefetch", n_slots=1, tau_prefetch=0.5)
    orders = p.plan_prefetch(1, [LayerPrediction(1, 2, (0.9, 0.0, 0.0, 0.0))], NOW)
    assert len(orders.copies) == 0 and orders.stop_reason == "cache"   # no room beyond one layer's top-k
    p = planner("spice_prefetch", n_slots=2, tau_prefetch=0.5)
    o = p.plan_prefetch(1, [LayerPrediction(1, 2, (0.9, 0.0, 0.0, 0.0))], NOW).copies[0]
    p.prefetch_issued(o, layer=1, issued_ms=0.0, arrival_ms=0.3)
    p.begin_token(1)                        # the prediction's moment has passed: (2,0) was not used
    step(p, 2, [[1]])
    plan, _ = step(p, 2, [[2]])             # needs a slot: the unused prefetch of (2,0) goes
    assert plan.copies[0].evicted == ExpertKey(2, 0) and plan.copies[0].evicted_unused_prefetch
    assert plan.copies[0].wasted is not None and plan.copies[0].wasted.confidence == 0.9


def test_a_skipped_plan_says_it_cost_more_than_it_could_hide():
    p = planner("spice_prefetch", n_slots=4)
    orders = p.plan_prefetch(1, None, NOW)
    assert orders.copies == () and orders.stop_reason == "cost" and orders.h_min == -1.0
    host = CostModel(get_profile("h200-pcie5x16-host"), get_shape("deepseek-v2-lite"))   # 1.26 ms per plan
    q = LayerPlanner(get_spec("spice_prefetch"), n_slots=4, n_experts=4, top_k=1, moe_layers=(1, 2), costs=host)
    q.miss_rate_ema = 0.1                   # few misses to hide: the plan does not pay
    assert not q.plan_pays()
    assert LayerPlanner(get_spec("spice_prefetch"), n_slots=4, n_experts=4, top_k=1, moe_layers=(1, 2), costs=host,
                        host_aware=False).plan_pays()


def test_late_copies_evict_experts_the_layer_already_ran_unless_its_experts_run_together():
    eager = planner("lru", n_slots=2)
    plan, runs = step(eager, 1, [[0], [1], [2]])   # a prefill of 3 tokens, 3 experts, 2 slots
    assert len(plan.copies) == 2 and plan.outcomes[2] == "copy"
    late = runs[2].late_copy
    assert late is not None and late.evicted in (ExpertKey(1, 0), ExpertKey(1, 1))
    graphed = planner("lru", n_slots=2)
    with pytest.raises(AssertionError):
        step(graphed, 1, [[0], [1], [2]], batched=True)      # one CUDA-graph step cannot hold them all


def _book(p):
    res = p.residency
    return (dict(res.where), list(res.lru_order), [(s.key, s.last_use_tick, s.use_count, s.prefetched, s.busy)
                                                   for s in res.state], p.tick, p.miss_rate_ema, p.global_pos)


@pytest.mark.parametrize("policy", ["lru", "resident", "cpu_compute", "on_demand"])
def test_plan_hits_keeps_the_book_as_the_phases_do(policy):
    """A token's all-hit layer planned in one call leaves the planner exactly as plan_layer + plan_experts do,
    with the same slots; any other layer is refused with nothing changed."""
    import random

    rng = random.Random(0)
    n_experts, top_k, layers = 8, 2, (1, 2, 3)
    a = planner(policy, n_slots=10, top_k=top_k, n_experts=n_experts, layers=layers)
    b = planner(policy, n_slots=10, top_k=top_k, n_experts=n_experts, layers=layers)
    spec = get_spec(policy)
    if spec.preload_all or spec.static_cache:
        keys = [ExpertKey(layer, e) for e in range(n_experts) for layer in layers][:10]
        assert a.place_static(keys) == b.place_static(keys)
    fast = 0
    for token in range(40):
        a.begin_token(token)
        b.begin_token(token)
        for layer in layers:
            ids = rng.sample(range(n_experts), top_k)
            before = _book(a)
            slots = a.plan_hits(layer, ids)
            plan, runs = step(b, layer, [ids])
            if slots is None:
                assert _book(a) == before
                step(a, layer, [ids])
            else:
                fast += 1
                assert set(plan.outcomes.values()) == {"hit"}
                assert slots == [next(r.slot for r in runs if r.expert == e) for e in ids]
            assert _book(a) == _book(b)
    assert fast > 0 or policy == "on_demand"


def test_plan_hits_refuses_a_prefetching_policy():
    p = planner("gate_prefetch", n_slots=4)
    step(p, 1, [[0]])
    step(p, 1, [[0]])                        # a plain hit now, but the lookahead needs the phases
    assert p.plan_hits(1, [0]) is None


def test_a_lookahead_planned_after_the_layer_was_placed_never_evicts_what_it_is_told_a_segment_reads():
    """The fast path plans layer 1's lookahead after its experts are placed (no longer busy) and their segment is
    launched: those experts are passed as ``protected``, and a prefetch takes another victim or none at all."""
    p = planner("spice_prefetch", n_slots=2, tau_prefetch=0.5, max_lookahead=2)
    step(p, 1, [[0]], batched=True)
    step(p, 2, [[1]], batched=True)            # full: (1,0) then (2,1), neither busy any more
    pred = [LayerPrediction(2, 1, (0.0, 0.0, 0.0, 0.9))]   # layer 1 of the next token wants expert 3
    unprotected = p.plan_prefetch(2, pred, NOW)
    assert [o.evicted for o in unprotected.copies] == [ExpertKey(1, 0)]   # what the hazard would do
    q = planner("spice_prefetch", n_slots=2, tau_prefetch=0.5, max_lookahead=2)
    step(q, 1, [[0]], batched=True)
    step(q, 2, [[1]], batched=True)
    guarded = q.plan_prefetch(2, pred, NOW, protected=frozenset({ExpertKey(2, 1), ExpertKey(1, 0)}))
    assert guarded.copies == () and guarded.stop_reason == "cache"
    assert ExpertKey(1, 0) in q.residency and ExpertKey(2, 1) in q.residency


def test_a_copy_is_credited_with_the_cheaper_way_a_later_miss_would_take_when_a_cpu_lane_exists():
    """FASTPATH §2.5: with a CPU lane a later miss of the expert costs at most a CPU run, so caching it by a copy
    saves that, not a whole copy. On a slow link where two CPU runs beat a copy, a fresh miss goes to the lane
    (crediting the full copy time made the copy look free and always won)."""
    import dataclasses
    desktop = dataclasses.replace(get_profile("rtx4060-pcie4x8"), cpu_mem_gbps=40.0)   # a DDR5 desktop's lane
    slow_link = CostModel(desktop, get_shape("qwen2-57b-a14b"))
    cpu, copy, gpu = slow_link.cpu_expert_ms(1), slow_link.copy_ms(), slow_link.gpu_expert_ms(1)
    assert 2 * cpu < copy + gpu and cpu > gpu          # the regime the rule is about
    p = LayerPlanner(get_spec("spice_no_lore"), n_slots=4, n_experts=4, top_k=1, moe_layers=(1, 2),
                     costs=slow_link, can_cpu=True)
    p.miss_rate_ema = 0.0                                # every use hits: the full credit
    plan, _ = step(p, 1, [[2]])
    assert plan.outcomes == {2: "cpu"}


def test_the_cpu_lane_slows_while_copies_read_the_same_dram():
    """With the profile's host DRAM bandwidth, a CPU run planned while the copy queue is busy gets what the link
    leaves of it (81 - 53.8 GB/s on the H200 host), so it costs more than on an idle link."""
    c = CostModel(get_profile("h200-pcie5x16-graphed"), get_shape("deepseek-v2-lite"))
    assert c.cpu_expert_ms(1, link_busy=True) > c.cpu_expert_ms(1)
    assert COSTS.cpu_expert_ms(1, link_busy=True) == COSTS.cpu_expert_ms(1)   # a profile without the figure


def test_the_lookahead_knows_misses_go_to_the_cpu_lane_only_where_the_lane_beats_a_copy():
    """The planner tells plan_lookahead an exact miss's lane time (its ``miss_ms``) when the policy sends exact
    misses to a CPU lane it has and that beats a copy: on x8 with the H200 host's lane, not on its native link,
    not without a lane, not for a policy that copies its misses."""
    import dataclasses
    h200 = get_profile("h200-pcie5x16-graphed")
    x8 = CostModel(dataclasses.replace(h200, h2d_pinned_gbps=13.0), get_shape("deepseek-v2-lite"))
    native = CostModel(h200, get_shape("deepseek-v2-lite"))
    assert x8.cpu_expert_ms(1, link_busy=True) < x8.copy_ms() and native.cpu_expert_ms(1, link_busy=True) > native.copy_ms()

    def miss_ms(policy, costs, can_cpu=True):
        return LayerPlanner(get_spec(policy), n_slots=8, n_experts=4, top_k=1, moe_layers=(1, 2), costs=costs,
                            can_cpu=can_cpu)._lane_miss_ms()
    assert miss_ms("spice", x8) == pytest.approx(x8.cpu_expert_ms(1, link_busy=True))
    assert miss_ms("spice", native) is None
    assert miss_ms("spice", x8, can_cpu=False) is None
    assert miss_ms("spice_prefetch", x8) is None and miss_ms("spice_no_cpu", x8) is None


def test_spice_sends_low_weight_misses_to_the_int8_lane_and_the_plan_says_which_kernel():
    """Between tau_approx and tau_int8 a miss runs on the CPU lane from the int8 copy (cheaper than a copy there,
    rtx5090's 13 GB/s link); the plan's CPU tasks name it, and no GPU run is planned for it."""
    slow_link = CostModel(get_profile("rtx5090-pcie4x8"), get_shape("deepseek-v2-lite"))
    p = LayerPlanner(get_spec("spice"), n_slots=4, n_experts=4, top_k=3, moe_layers=(1, 2), costs=slow_link,
                     tau_approx=0.05, can_approx=True, can_cpu=True, tau_int8=0.3, can_int8=True)
    plan, runs = step(p, 1, [[0, 1, 2]], [[0.01, 0.2, 0.6]])
    assert plan.outcomes[0] == "approx" and plan.outcomes[1] == "cpu_int8" and plan.outcomes[2] != "cpu_int8"
    assert isinstance(plan.cpu, CpuTasks) and 1 in plan.cpu and int8_tasks(plan.cpu) == {1}
    assert 1 not in {r.expert for r in runs} and plan.misses == 3


def test_exact_policies_never_take_the_int8_action_whatever_tau_int8():
    slow_link = CostModel(get_profile("rtx5090-pcie4x8"), get_shape("deepseek-v2-lite"))
    for policy in ("spice_no_lore", "cpu_compute", "lru"):
        p = LayerPlanner(get_spec(policy), n_slots=4, n_experts=4, top_k=3, moe_layers=(1, 2), costs=slow_link,
                         can_cpu=True, tau_int8=1.0, can_int8=True)
        plan, _ = step(p, 1, [[0, 1, 2]], [[0.1, 0.2, 0.3]])
        assert "cpu_int8" not in plan.outcomes.values() and not int8_tasks(plan.cpu), policy


def test_regression_a_failed_cpu_job_for_an_expert_still_in_flight_falls_back_into_its_own_slot():
    """The lane may be picked over waiting for a late prefetch; when that job failed, the fallback copy asked for a
    new slot for an expert the book already held and tripped the residency's "already resident" assertion."""
    slow_link = CostModel(get_profile("rtx5090-pcie4x8"), get_shape("deepseek-v2-lite"))
    p = LayerPlanner(get_spec("spice_no_lore"), n_slots=4, n_experts=4, top_k=1, moe_layers=(1, 2), costs=slow_link,
                     can_cpu=True, tau_prefetch=0.5, max_lookahead=2)
    step(p, 1, [[0]])
    order = p.plan_prefetch(1, [LayerPrediction(1, 2, (0.0, 0.0, 0.0, 0.9))], NOW).copies[0]
    p.prefetch_issued(order, layer=1, issued_ms=0.0, arrival_ms=50.0)          # lands long after the lane would
    plan, _ = step(p, 2, [[3]], queues=Queues(now_ms=1.0, copy_free_at_ms=50.0))
    assert plan.outcomes == {3: "cpu"}
    fallback = p.plan_fallback(ExpertKey(2, 3), hold=True)
    assert fallback.slot == order.slot and fallback.evicted is None
    p.release_fallback(ExpertKey(2, 3))
    assert p.residency.where[ExpertKey(2, 3)] == order.slot
    # ... and it is a demand copy from then on: once evicted, no stale in-flight entry makes a later miss wait for it
    assert ExpertKey(2, 3) not in p.inflight and not p.residency.book(ExpertKey(2, 3)).prefetched
    p.residency.evict(ExpertKey(2, 3))
    plan, _ = step(p, 2, [[3]], queues=Queues(now_ms=60.0, copy_free_at_ms=60.0))
    assert plan.outcomes == {3: "cpu"}


def test_spice_prefetches_only_experts_predicted_to_weigh_tau_approx_unless_told_to_admit_all():
    weights = (0.0, 0.0, 0.01, 0.4)                                   # expert 2 would be approximated on a miss
    preds = [LayerPrediction(1, 2, (0.0, 0.0, 0.8, 0.9), weights=weights)]

    def prefetched(policy, **kw):
        p = planner(policy, n_slots=4, tau_prefetch=0.5, max_lookahead=2, top_k=2, tau_approx=0.05,
                    can_approx=True, **kw)
        step(p, 1, [[0, 1]])
        return sorted(o.key.expert for o in p.plan_prefetch(1, preds, NOW).copies)

    assert prefetched("spice") == [3]
    assert prefetched("spice", prefetch_admission="all") == [2, 3]
    assert prefetched("spice_prefetch") == [2, 3]                     # exact: every miss costs a copy
    with pytest.raises(ConfigError, match="prefetch_admission"):
        planner("spice", n_slots=4, prefetch_admission="some")
