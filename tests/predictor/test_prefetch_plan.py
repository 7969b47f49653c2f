"""plan_lookahead, h_min and the eviction policies on hand-made inputs (no tensors, no clocks)."""
import math

import pytest

from spice_core.policy.cache import (FarthestNextUseEviction, LruEviction, SlotView, cache_slots_for_budget)
from spice_core.policy.prefetch import LayerPrediction, h_min, plan_lookahead
from spice_core.types import ExpertKey as K


def pred(d, layer, conf, k=2):
    """A prediction over 8 experts, {expert: confidence}; like a calibrated predictor's, the
    confidences sum to k (the rest is spread evenly over the other experts)."""
    rest = max(0.0, k - sum(conf.values())) / (8 - len(conf))
    probs = [rest] * 8
    for e, c in conf.items():
        probs[e] = c
    return LayerPrediction(d, layer, tuple(probs))


def plan(preds, resident=(), **kw):
    args = dict(is_resident_or_inflight=lambda k: k in set(resident), tau_prefetch=0.3, max_lookahead=4,
                now_ms=0.0, copy_free_at_ms=0.0, copy_ms=1.0, layer_ms=2.0, top_k=2)
    args.update(kw)
    return plan_lookahead(preds, **args)


def test_items_come_in_order_of_need_nearer_layers_first_then_confidence():
    p = plan([pred(2, 3, {5: 0.9, 6: 0.4}), pred(1, 2, {1: 0.5, 0: 0.8})], layer_ms=3.0)
    assert [i.key for i in p.items] == [K(2, 0), K(2, 1), K(3, 5), K(3, 6)]
    assert [i.distance for i in p.items] == [1, 1, 2, 2]
    assert [i.arrival_ms for i in p.items] == [1.0, 2.0, 3.0, 4.0]


def test_stops_for_confidence_when_no_expert_reaches_tau():
    p = plan([pred(1, 2, {0: 0.9}), pred(2, 3, {4: 0.29}), pred(3, 4, {1: 0.9})])
    assert [i.key for i in p.items] == [K(2, 0)]
    assert (p.depth, p.stop_reason) == (1, "confidence")


def test_tau_zero_takes_top_ranked_and_tau_one_takes_only_certain():
    preds = [pred(1, 2, {0: 1.0, 1: 0.6, 2: 0.1})]
    assert {i.key for i in plan(preds, tau_prefetch=1.0).items} == {K(2, 0)}
    assert len(plan(preds, tau_prefetch=0.0, layer_ms=10.0).items) == 4      # the 2 * top_k most confident


def test_stops_for_time_when_the_queue_cannot_deliver_before_the_layer_starts():
    # layer_ms 2, copy 1.5: d=1 deadline 2 (the late 0.85 one is likely enough), d=2 deadline 4 but the
    # queue ends at 3.0 after the next layer's two copies
    p = plan([pred(1, 2, {0: 0.9, 1: 0.85}), pred(2, 3, {0: 0.9, 1: 0.9})], copy_ms=1.5)
    assert [i.key for i in p.items] == [K(2, 0), K(2, 1)]
    assert (p.depth, p.stop_reason) == (1, "time")


def test_a_busy_copy_queue_shortens_the_lookahead():
    preds = [pred(d, d + 1, {0: 0.9}, k=1) for d in range(1, 5)]
    idle = plan(preds, copy_ms=1.0, top_k=1)
    busy = plan(preds, copy_ms=1.0, top_k=1, copy_free_at_ms=5.0)
    assert idle.depth == 4 and len(idle.items) == 4
    assert busy.stop_reason == "time" and busy.depth < idle.depth


def test_next_layer_prefetch_is_queued_even_when_late():
    p = plan([pred(1, 2, {0: 0.9})], copy_free_at_ms=10.0)
    assert [i.key for i in p.items] == [K(2, 0)] and p.items[0].arrival_ms == 11.0


def test_when_the_link_is_short_the_confident_expert_goes_before_the_unlikely_nearer_one():
    # After the next layer's copy there is room for one more: the 0.95 expert at d=3 beats the 0.35 one at d=2.
    p = plan([pred(1, 2, {0: 0.9}, k=1), pred(2, 3, {1: 0.35}, k=1), pred(3, 4, {2: 0.95}, k=1)], top_k=1,
             copy_ms=1.0, layer_ms=1.5, copy_free_at_ms=1.0)
    assert [i.key for i in p.items] == [K(2, 0), K(4, 2)]
    assert (p.depth, p.stop_reason) == (1, "time")


def test_expected_demand_copies_of_nearer_layers_reserve_the_link():
    # Layer 2 predicted poorly: most of its 2 experts will be demand copies issued when it starts,
    # ahead of layer 3, so layer 3's experts no longer fit; predicted well, they do.
    poor = plan([pred(1, 2, {0: 0.3, 1: 0.3}), pred(2, 3, {1: 0.9, 2: 0.9})], copy_ms=1.0, layer_ms=2.1)
    good = plan([pred(1, 2, {0: 0.95, 1: 0.95}), pred(2, 3, {1: 0.9, 2: 0.9})], copy_ms=1.0, layer_ms=2.1)
    assert {i.key for i in poor.items} == {K(2, 0), K(2, 1)} and poor.stop_reason == "time"
    assert {K(3, 1), K(3, 2)} <= {i.key for i in good.items} and good.depth == 2


def test_resident_experts_lower_the_expected_demand_even_when_not_confident():
    preds = [pred(1, 2, {0: 0.3, 1: 0.3}), pred(2, 3, {1: 0.9, 2: 0.9})]
    # Layer 2's remaining probability mass sits on experts 2..7; with them resident, layer 2 needs
    # few demand copies and layer 3's experts fit.
    resident = [K(2, e) for e in range(2, 8)]
    p = plan(preds, resident=resident, copy_ms=1.0, layer_ms=2.1)
    assert {K(3, 1), K(3, 2)} <= {i.key for i in p.items}


def test_router_softmax_confidences_are_rescaled_to_k_for_the_demand_estimate():
    # A softmax (sums to 1) over a layer whose two likely experts are resident: no demand expected.
    softmax = LayerPrediction(1, 2, (0.45, 0.45, 0.02, 0.02, 0.02, 0.02, 0.01, 0.01))
    far = pred(2, 3, {5: 0.6})
    p = plan([softmax, far], resident=[K(2, 0), K(2, 1)], tau_prefetch=0.4, copy_ms=1.0, layer_ms=1.0)
    assert [i.key for i in p.items] == [K(3, 5)]


def test_a_late_next_layer_expert_is_queued_only_if_very_likely_needed():
    p = plan([pred(1, 2, {0: 0.9, 1: 0.6})], copy_free_at_ms=10.0)
    assert [i.key for i in p.items] == [K(2, 0)] and p.stop_reason == "time" and p.depth == 0
    on_time = plan([pred(1, 2, {0: 0.9, 1: 0.6})], layer_ms=5.0)
    assert [i.key for i in on_time.items] == [K(2, 0), K(2, 1)]


def test_stops_at_the_bound():
    preds = [pred(d, d + 1, {0: 0.9}) for d in range(1, 7)]
    p = plan(preds, max_lookahead=3, layer_ms=10.0)
    assert p.depth == 3 and p.stop_reason == "bound" and len(p.items) == 3


def test_stops_when_the_cache_cannot_take_more():
    p = plan([pred(1, 2, {0: 0.9, 1: 0.9}), pred(2, 3, {0: 0.9})], max_items=2, layer_ms=10.0)
    assert len(p.items) == 2 and p.stop_reason == "cache" and p.depth == 1


def test_resident_or_inflight_experts_are_not_copied_again_but_keep_their_next_use():
    p = plan([pred(1, 2, {0: 0.9, 1: 0.8})], resident=[K(2, 0)])
    assert [i.key for i in p.items] == [K(2, 1)]
    assert p.next_use == {K(2, 0): 1, K(2, 1): 1}


def test_next_use_keeps_the_nearest_distance_across_the_token_boundary():
    # Layer 1 predicted at distance 1 (this token) and again at distance 4 (next token).
    p = plan([pred(1, 1, {3: 0.9}), pred(4, 1, {3: 0.9})], layer_ms=10.0)
    assert p.next_use[K(1, 3)] == 1
    assert [i.key for i in p.items] == [K(1, 3)]


def test_no_predictions_is_an_empty_plan():
    p = plan([])
    assert p.items == () and p.depth == 0 and p.stop_reason == "bound"


def test_h_min_is_the_papers_formula():
    # P=3 missing experts of 17.3 MB over 25 GB/s (25e6 bytes/ms) behind 1 ms of compute: 2.076 layers
    assert h_min(3, 17_300_000, 25e6, 1.0) == pytest.approx(2.076)
    assert h_min(0, 17_300_000, 25e6, 1.0) == 0.0
    assert math.isinf(h_min(3, 100, 0.0, 1.0)) and math.isinf(h_min(3, 100, 1.0, 0.0))


# ------------------------------------------------------------------ eviction
def views(*specs):
    """Slot views as the engine passes them: least recently used first."""
    return sorted((SlotView(K(1, e), tick, 1, protected=prot) for e, tick, prot in specs),
                  key=lambda v: v.last_use_tick)


def test_farthest_next_use_evicts_the_expert_needed_last():
    v = views((0, 5, False), (1, 1, False), (2, 3, False))
    assert FarthestNextUseEviction().victim_for(v, {K(1, 0): 9, K(1, 1): 2, K(1, 2): 4}, 1) == K(1, 0)


def test_farthest_next_use_prefers_unpredicted_then_lru_among_ties():
    v = views((0, 5, False), (1, 1, False), (2, 3, False))
    assert FarthestNextUseEviction().victim_for(v, {K(1, 1): 2}, 1) == K(1, 2)   # unpredicted, older of 0 and 2


def test_a_prefetch_never_evicts_an_expert_needed_sooner_or_at_the_same_layer():
    v = views((0, 5, False), (1, 1, False))
    assert FarthestNextUseEviction().victim_for(v, {K(1, 0): 2, K(1, 1): 3}, 3) is None
    assert FarthestNextUseEviction().victim_for(v, {K(1, 0): 2, K(1, 1): 4}, 3) == K(1, 1)


def test_protected_slots_are_never_victims():
    v = views((0, 1, True), (1, 2, True))
    assert FarthestNextUseEviction().victim_for(v, {}, 1) is None
    assert LruEviction().choose_victim(v) is None
    assert LruEviction().choose_victim(views((0, 1, True), (1, 2, False))) == K(1, 1)


def test_cache_slots_for_budget_counts_reserved_bytes_inside_the_budget():
    assert cache_slots_for_budget(1000, 100) == 10
    assert cache_slots_for_budget(1000, 100, reserved_bytes=250) == 7
    assert cache_slots_for_budget(100, 100, reserved_bytes=500) == 0


def test_predictions_beyond_the_prefetch_bound_inform_eviction_but_are_not_prefetched():
    preds = [pred(d, d + 1, {0: 0.9}) for d in range(1, 7)]
    p = plan(preds, max_lookahead=2, layer_ms=10.0)
    assert {i.distance for i in p.items} == {1, 2} and p.stop_reason == "bound" and p.depth == 2
    assert p.next_use[K(6, 0)] == 5 and p.next_use[K(7, 0)] == 6


def test_oracle_sees_at_least_as_far_as_the_draft_heads():
    from types import SimpleNamespace

    from spice_core.predictor.oracle import MIN_HORIZON, OraclePredictor

    lm = SimpleNamespace(moe_layers=(1, 2, 3), n_experts=4)
    routing = {(t, layer): (t % 4,) for t in range(6) for layer in (1, 2, 3)}
    preds = OraclePredictor(lm, routing).predict(3, None, SimpleNamespace(max_lookahead=2, token=0))
    assert len(preds) == MIN_HORIZON >= 8
    assert (preds[0].layer, preds[0].probs) == (1, (0.0, 1.0, 0.0, 0.0))   # next token's first MoE layer


def test_with_a_host_issue_cost_only_experts_worth_it_are_prefetched():
    """p * copy_ms > issue_ms: at issue 0.5 ms per copy of 1 ms, a 0.4-likely expert is not worth it."""
    preds = [pred(1, 2, {0: 0.9, 1: 0.4}), pred(2, 3, {4: 0.8})]
    free = plan(preds, layer_ms=4.0)
    costly = plan(preds, layer_ms=4.0, issue_ms=0.5)
    assert {i.key for i in free.items} == {K(2, 0), K(2, 1), K(3, 4)}
    assert {i.key for i in costly.items} == {K(2, 0), K(3, 4)}
    assert (costly.depth, costly.stop_reason) == (0, "cost")
    assert costly.next_use[K(2, 1)] == 1          # still informs eviction


def test_a_plan_pays_when_it_can_hide_at_least_its_host_cost():
    from spice_core.policy.prefetch import plan_pays

    assert plan_pays(0.0, 0.0, 6, 0.3)                  # no host cost: always
    assert not plan_pays(1.26, 0.5, 6, 0.32)           # native link: 0.96 ms of copies to hide
    assert plan_pays(1.26, 0.5, 6, 1.33)               # PCIe 4.0 x8: 4 ms


def test_with_a_cpu_lane_a_prefetch_landing_after_the_lane_would_finish_is_not_queued():
    # Copies end at 11 (queue busy to 10), the next layer starts at 2: a lane run of 0.7 ms finishes at 2.7,
    # long before the copy lands, so the late prefetch would only take the link; without a lane it replaces a
    # demand copy that would land later still, so it is queued.
    late = [pred(1, 2, {0: 0.9})]
    assert plan(late, copy_free_at_ms=10.0, miss_ms=0.7).items == ()
    assert [i.key for i in plan(late, copy_free_at_ms=10.0).items] == [K(2, 0)]
    # Landing within the lane's time after the layer starts still pays.
    assert [i.key for i in plan(late, copy_free_at_ms=1.5, miss_ms=0.7).items] == [K(2, 0)]


def test_with_a_cpu_lane_demand_misses_do_not_reserve_the_link():
    # As in the test above on poorly predicted layer 2: its misses go to the lane, so layer 3's experts fit.
    preds = [pred(1, 2, {0: 0.3, 1: 0.3}), pred(2, 3, {1: 0.9, 2: 0.9})]
    lane = plan(preds, copy_ms=1.0, layer_ms=2.1, miss_ms=0.7)
    assert {K(3, 1), K(3, 2)} <= {i.key for i in lane.items} and lane.depth == 2


def test_a_candidate_predicted_to_weigh_less_than_min_weight_is_not_copied_but_still_informs_eviction():
    """Where misses below tau_approx are approximated, a copy of an expert predicted below it buys no time."""
    base = pred(1, 2, {0: 0.9, 1: 0.8})
    weights = [0.0] * 8
    weights[0], weights[1] = 0.30, 0.02           # expert 1: confident, but predicted to weigh 0.02
    weighed = base._replace(weights=tuple(weights))
    assert [i.key for i in plan([weighed], layer_ms=3.0, min_weight=0.05).items] == [K(2, 0)]
    filtered = plan([weighed], layer_ms=3.0, min_weight=0.05)
    assert filtered.next_use.get(K(2, 1)) == 1                       # still predicted: eviction knows
    assert filtered.skipped_approx == 1 and plan([weighed], layer_ms=3.0).skipped_approx == 0
    assert [i.key for i in plan([weighed], layer_ms=3.0).items] == [K(2, 0), K(2, 1)]     # min_weight 0: as before
    assert [i.key for i in plan([base], layer_ms=3.0, min_weight=0.05).items] == [K(2, 0), K(2, 1)]   # no weights
