"""Oracle predictor: the true future routing, read from a recorded trace of the same
generation (exact policies route identically). Only for upper bounds in benchmarks.

It looks at least ``MIN_HORIZON`` MoE layers ahead whatever ``max_lookahead`` is: the
planner prefetches only up to max_lookahead but lets every prediction inform eviction, and
the upper bound must see at least as far as the draft's heads (8 distances by default)."""
from __future__ import annotations

from spice_core.policy.prefetch import LayerPrediction


MIN_HORIZON = 8


class OraclePredictor:
    name = "oracle"

    def __init__(self, lm, routing: dict[tuple[int, int], tuple[int, ...]]) -> None:
        """``routing[(token, layer)]``: the experts the exact model selected (token 0 = prefill's last)."""
        self.lm = lm
        self.routing = routing

    def predict(self, layer: int, x_last, ctx) -> list[LayerPrediction]:
        """``ctx``: the run's PredictContext (runtime/context.py)."""
        layers = self.lm.moe_layers
        n = len(layers)
        p = layers.index(layer)
        out = []
        for d in range(1, max(ctx.max_lookahead, MIN_HORIZON) + 1):
            tok, q = ctx.token + (p + d) // n, (p + d) % n
            experts = self.routing.get((tok, layers[q]))
            if experts is None:
                break
            probs = [0.0] * self.lm.n_experts
            for e in experts:
                probs[e] = 1.0
            out.append(LayerPrediction(d, layers[q], tuple(probs)))
        return out
