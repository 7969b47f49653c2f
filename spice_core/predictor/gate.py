"""Training-free predictor: apply layer l+d's router to layer l's MoE input.

Works because the residual stream changes slowly across layers. It cannot see across
the token boundary (the next token's hidden state does not exist yet), so its
predictions stop at the last MoE layer.
"""
from __future__ import annotations

import torch

from spice_core.policy.prefetch import LayerPrediction


class GatePredictor:
    name = "gate"

    def __init__(self, lm, max_distance: int = 8) -> None:
        self.lm = lm
        self.max_distance = max_distance

    @torch.no_grad()
    def predict(self, layer: int, x_last: torch.Tensor, ctx) -> list[LayerPrediction]:
        """``ctx``: the run's PredictContext (runtime/context.py)."""
        layers = self.lm.moe_layers
        p = layers.index(layer)
        depth = min(ctx.max_lookahead, self.max_distance, len(layers) - 1 - p)
        if depth <= 0:
            return []
        targets = layers[p + 1: p + 1 + depth]

        def run():
            out = []
            for t in targets:
                logits = self.lm.moe_block(t).gate(x_last)[0]
                out.append(torch.softmax(logits.float(), dim=-1)[0])
            return torch.stack(out).tolist()

        start = ctx.clock.stamp()
        probs = run()
        ctx.clock.draft(layer, len(targets), start)
        return [LayerPrediction(d + 1, t, tuple(pr)) for d, (t, pr) in enumerate(zip(targets, probs))]
