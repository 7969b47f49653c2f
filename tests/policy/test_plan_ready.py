"""LayerPlanner.plan_ready: one token's layer with no miss action but a hit or LoRE, planned in one call, decides and
keeps the book exactly as plan_layer then plan_experts(batched=True) do; any other layer is refused with nothing
changed. Checked on random routing with prefetches landed and still in flight, approximations and a CPU lane."""
import random

import pytest

from spice_core.policy.planner import LayerPlanner, Queues
from spice_core.policy.prefetch import LayerPrediction
from spice_core.policy.spec import get_spec
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.types import ExpertKey

COSTS = CostModel(get_profile("rtx4090-pcie4x16"), get_shape("deepseek-v2-lite"))
LAYERS, N_EXPERTS, TOP_K = (1, 2, 3, 4), 8, 2


def _planner(policy: str) -> LayerPlanner:
    return LayerPlanner(get_spec(policy), n_slots=9, n_experts=N_EXPERTS, top_k=TOP_K, moe_layers=LAYERS, costs=COSTS,
                        tau_prefetch=0.3, tau_approx=0.2, max_lookahead=2, can_approx=True, can_cpu=True)


def _book(p: LayerPlanner):
    res = p.residency
    return (dict(res.where), list(res.lru_order), [(s.key, s.last_use_tick, s.use_count, s.prefetched, s.busy)
                                                   for s in res.state],
            p.tick, p.miss_rate_ema, p.global_pos, dict(p.inflight), dict(p.next_use_abs))


def _lookahead(p: LayerPlanner, layer: int, preds, queues: Queues, needed, arrivals) -> None:
    """The fast path's lookahead after the layer: its experts protected, each prefetch given its arrival time."""
    orders = p.plan_prefetch(layer, preds, queues, protected=frozenset(ExpertKey(layer, e) for e in needed))
    for order, arrival in zip(orders.copies, arrivals):
        p.prefetch_issued(order, layer, queues.now_ms, arrival)


@pytest.mark.parametrize("policy", ["spice", "spice_no_lore", "spice_prefetch"])
def test_plan_ready_decides_and_keeps_the_book_as_the_phases_do(policy):
    rng = random.Random(7)
    a, b = _planner(policy), _planner(policy)
    ready = refused = 0
    now = 0.0
    for token in range(150):
        a.begin_token(token)
        b.begin_token(token)
        for i, layer in enumerate(LAYERS):
            now += 0.2
            q = Queues(now_ms=now, copy_free_at_ms=now + rng.choice((0.0, 0.3, 2.0)))
            ids = rng.sample(range(N_EXPERTS), TOP_K)
            ws = [rng.choice((0.05, 0.15, 0.4, 0.7)) for _ in ids]
            before = _book(a)
            got = a.plan_ready(layer, ids, ws, q)
            plan = b.plan_layer(layer, [ids], [ws], q)
            runs = b.plan_experts(plan, batched=True)
            if got is None:
                refused += 1
                assert _book(a) == before                        # nothing changed
                plan_a = a.plan_layer(layer, [ids], [ws], q)
                a.plan_experts(plan_a, batched=True)
                assert set(plan.outcomes.values()) - {"hit", "prefetch_hit", "approx"}
            else:
                ready += 1
                assert got.outcomes == plan.outcomes and got.needed == plan.needed
                assert (got.hits, got.misses) == (plan.hits, plan.misses)
                assert plan.copies == () and plan.cpu == ()
                assert got.slots == {r.expert: (None if r.outcome == "approx" else r.slot) for r in runs}
                assert got.used == tuple((r.expert, r.prefetch_used) for r in runs if r.prefetch_used is not None)
            assert _book(a) == _book(b)
            # The lookahead: the next layers' experts predicted, some prefetches landing before their use, some after.
            nxt = [LAYERS[(i + d) % len(LAYERS)] for d in (1, 2)]
            preds = [LayerPrediction(d + 1, nxt[d], tuple(rng.choice((0.0, 0.1, 0.5, 0.9)) for _ in range(N_EXPERTS)),
                                     weights=tuple(rng.choice((0.1, 0.5)) for _ in range(N_EXPERTS)))
                     for d in range(2)]
            arrivals = [now + rng.choice((0.1, 0.3, 1.5)) for _ in range(N_EXPERTS)]
            _lookahead(a, layer, preds, q, plan.needed, arrivals)
            _lookahead(b, layer, preds, q, plan.needed, arrivals)
            assert _book(a) == _book(b)
    assert ready > 20 and refused > 20


def test_plan_ready_refuses_a_repeated_or_out_of_range_expert_and_a_miss_to_copy():
    p = _planner("spice")
    p.begin_token(0)
    before = _book(p)
    q = Queues(now_ms=0.0, copy_free_at_ms=0.0)
    assert p.plan_ready(1, [3, 3], [0.5, 0.5], q) is None
    assert p.plan_ready(1, [3, N_EXPERTS], [0.5, 0.5], q) is None
    assert p.plan_ready(1, [3, 4], [0.5, 0.05], q) is None           # expert 3 is not cached and weighs 0.5
    assert _book(p) == before
    got = p.plan_ready(1, [3, 4], [0.1, 0.05], q)                     # both below tau_approx: approximated
    assert got is not None and got.outcomes == {3: "approx", 4: "approx"} and got.slots == {3: None, 4: None}
    assert (got.hits, got.misses) == (0, 2)


@pytest.mark.parametrize("can_cpu", [False, True])
def test_the_miss_decisions_skip_no_rule_when_an_in_flight_prefetch_is_waited_for_without_asking(can_cpu):
    """Without a CPU lane `_decide_misses` waits for an exact miss's in-flight prefetch without a request; the
    actions are what `plan_misses` decides when every miss but the approximated ones is put to it."""
    from spice_core.policy.miss import MissAction, MissRequest, QueueState, plan_misses

    rng = random.Random(3)
    for trial in range(300):
        p = LayerPlanner(get_spec("spice"), n_slots=9, n_experts=N_EXPERTS, top_k=TOP_K, moe_layers=LAYERS,
                         costs=COSTS, tau_approx=0.2, can_approx=True, can_cpu=can_cpu)
        now = 1.0
        for e in rng.sample(range(N_EXPERTS), 4):     # prefetches of layer 1, some landed, some on their way
            order = p._acquire(ExpertKey(1, e), "prefetch", frozenset())
            p.prefetch_issued(order, 1, 0.0, rng.choice((0.5, 1.5, 3.0)))
        misses = [(e, rng.choice((0.1, 0.3, 0.6)), 1) for e in rng.sample(range(N_EXPERTS), 3)]
        q = Queues(now_ms=now, copy_free_at_ms=now + rng.choice((0.0, 1.0)))
        got = p._decide_misses(1, misses, q)
        opts = p._options()
        want, reqs, idx = [None] * len(misses), [], []
        for i, (e, w, n) in enumerate(misses):
            inf = p.inflight.get(ExpertKey(1, e))
            if w < opts.tau_approx and (inf is None or inf.arrival_ms > now):
                want[i] = MissAction.APPROX
                continue
            ms = (COSTS.cpu_expert_ms(n), COSTS.gpu_expert_ms(n), COSTS.cpu_expert_ms(n, link_busy=True))
            reqs.append(MissRequest(w, COSTS.copy_ms(), ms[0], ms[1], inf.arrival_ms if inf else None,
                                    (1.0 - p.miss_rate_ema) * p._later_miss_ms, ms[2]))
            idx.append(i)
        for i, a in zip(idx, plan_misses(reqs, QueueState(now, q.copy_free_at_ms), opts)):
            want[i] = a
        assert got == want, trial
