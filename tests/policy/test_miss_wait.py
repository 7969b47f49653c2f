"""The miss decisions of a layer (LayerPlanner._decide_misses): without a CPU lane an exact miss whose prefetch is on
its way is waited for without a cost request, which decides what plan_misses would."""
import random

import pytest

from spice_core.policy.planner import LayerPlanner, Queues
from spice_core.policy.spec import get_spec
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.types import ExpertKey

COSTS = CostModel(get_profile("rtx4090-pcie4x16"), get_shape("deepseek-v2-lite"))
LAYERS, N_EXPERTS, TOP_K = (1, 2, 3, 4), 8, 2


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
