"""plan_lookahead against its first, per-key definition (prefetch_reference.py): the same plan, item for item
and float for float, on random predictions, whichever way residency is asked (a container, a predicate or
`Residency.on_way_row`)."""
import random

import pytest

from prefetch_reference import plan_lookahead_reference
from spice_core.policy.prefetch import LayerPrediction, plan_lookahead
from spice_core.policy.residency import Residency
from spice_core.types import ExpertKey as K


def _case(rng: random.Random):
    n_layers, E, k = rng.choice([(4, 8, 2), (26, 64, 6), (3, 16, 1)])
    D = rng.randint(1, 8)
    layer0 = rng.randrange(n_layers)
    preds = []
    for d in range(1, D + 1):
        raw = [rng.random() ** rng.choice([1, 3, 8]) if rng.random() > 0.1 else 0.0 for _ in range(E)]
        if rng.random() < 0.3:               # ties, which the ranking breaks by index
            raw = [round(x, 1) for x in raw]
        s = sum(raw) or 1.0
        probs = [min(1.0, x * k / s) for x in raw]
        order = sorted(range(E), key=lambda e: (-probs[e], e)) if rng.random() < 0.5 else None
        preds.append(LayerPrediction(d, (layer0 + d) % n_layers, probs, order))
    rng.shuffle(preds)
    res = Residency(rng.randint(k, n_layers * E // 2))
    keys = [K(layer, e) for layer in range(n_layers) for e in range(E)]
    if rng.random() < 0.5:      # rows made before the book changes, then kept in step by assign and evict
        for layer in range(n_layers):
            res.on_way_row(layer, E)
    for key in rng.sample(keys, res.n_slots):
        res.assign(res.free_slot(), key, 0, prefetched=False)
    for key in rng.sample(list(res.where), rng.randint(0, len(res.where))):
        res.evict(key)
    args = dict(tau_prefetch=rng.choice([0.0, 0.05, 0.2, 0.5, 0.9]), max_lookahead=rng.randint(1, 8),
                now_ms=10.0, copy_free_at_ms=10.0 + rng.choice([0.0, 0.5, 3.0]), copy_ms=rng.choice([0.3, 0.7, 1.3]),
                layer_ms=rng.choice([0.2, 0.3, 1.0, 2.0]), top_k=k, max_items=rng.choice([None, 3, 40]),
                h_min_value=1.0, issue_ms=rng.choice([0.0, 0.0, 0.05]))
    return preds, res, args


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_is_the_reference_plan_however_residency_is_asked(seed):
    rng = random.Random(seed)
    for _ in range(150):
        preds, res, args = _case(rng)
        want = plan_lookahead_reference(preds, is_resident_or_inflight=res.where, **args)
        assert plan_lookahead(preds, is_resident_or_inflight=res.where, **args) == want
        assert plan_lookahead(preds, is_resident_or_inflight=res.__contains__, **args) == want
        assert plan_lookahead(preds, is_resident_or_inflight=res.where, on_way_rows=res.on_way_row, **args) == want


def test_a_residency_row_follows_assign_and_evict():
    res = Residency(3)
    row = res.on_way_row(2, 4)
    res.assign(res.free_slot(), K(2, 1), 0, prefetched=False)
    res.assign(res.free_slot(), K(5, 1), 0, prefetched=True)
    assert list(row) == [0, 1, 0, 0] and list(res.on_way_row(5, 4)) == [0, 1, 0, 0]
    res.evict(K(2, 1))
    res.assign(res.free_slot(), K(2, 3), 0, prefetched=True)
    assert list(res.on_way_row(2, 4)) == [0, 0, 0, 1] and res.on_way_row(2, 4) is row
