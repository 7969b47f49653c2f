"""Training-free predictor: apply layer l+d's router to layer l's MoE input.

Works because the residual stream changes slowly across layers. It cannot see across
the token boundary (the next token's hidden state does not exist yet), so its
predictions stop at the last MoE layer.

Both executors run the same arithmetic: the eager one calls `predict` (the routers on the device, one
readback); the fast path captures `head_readback` into each layer's segment (the next routers' softmax and
its ranking, read back with the routing) and parses the row with `predictions_from_readback`.
"""
from __future__ import annotations

import numpy as np
import torch

from spice_core.policy.prefetch import LayerPrediction


class GatePredictor:
    name = "gate"

    def __init__(self, lm, max_distance: int = 8) -> None:
        self.lm = lm
        self.max_distance = max_distance
        self._pos = {layer: p for p, layer in enumerate(lm.moe_layers)}

    def _targets(self, layer: int, max_lookahead: int) -> list[int]:
        """The MoE layers after ``layer`` this predictor sees, nearest first (none past the last)."""
        layers, p = self.lm.moe_layers, self._pos[layer]
        return layers[p + 1: p + 1 + max(0, min(max_lookahead, self.max_distance))]

    def _probs(self, targets: list[int], x_last: torch.Tensor) -> torch.Tensor:
        """Each target router's softmax on ``x_last`` [1,H]: [len(targets), E] float32 on x's device."""
        out = []
        for t in targets:
            logits = self.lm.moe_block(t).gate(x_last)[0]
            out.append(torch.softmax(logits.float(), dim=-1)[0])
        return torch.stack(out)

    @torch.no_grad()
    def predict(self, layer: int, x_last: torch.Tensor, ctx) -> list[LayerPrediction]:
        """``ctx``: the run's PredictContext (runtime/context.py)."""
        targets = self._targets(layer, ctx.max_lookahead)
        if not targets:
            return []
        start = ctx.clock.stamp()
        probs = self._probs(targets, x_last).tolist()
        ctx.clock.draft(layer, len(targets), start)
        return [LayerPrediction(d + 1, t, tuple(pr)) for d, (t, pr) in enumerate(zip(targets, probs))]

    # ------------------------------------------------------------------ the fast path
    @property
    def readback_numel(self) -> int:
        """Floats per layer `head_readback` makes: max_distance rows of probabilities, then their rankings."""
        return 2 * self.max_distance * self.lm.n_experts

    @torch.no_grad()
    def head_readback(self, layer: int, x_last: torch.Tensor) -> torch.Tensor:
        """x_last [1,H] -> [2*D*E] float32 on x's device (D = max_distance): the next D routers' softmax on it
        (rows past the last MoE layer zero), then each row's experts by descending probability, ties by index
        (ids as floats, exact below 2^24). Captured into the layer's segment, so it sees as far as it can
        whatever the live lookahead; `predictions_from_readback` keeps what the lookahead asks for."""
        D, E = self.max_distance, self.lm.n_experts
        targets = self._targets(layer, D)
        probs = torch.zeros((D, E), dtype=torch.float32, device=x_last.device)
        if targets:
            probs[: len(targets)] = self._probs(targets, x_last)
        order = torch.sort(probs, dim=-1, descending=True, stable=True).indices
        return torch.cat([probs.reshape(-1), order.reshape(-1).to(torch.float32)])

    def predictions_from_readback(self, layer: int, arr: np.ndarray, ctx) -> list[LayerPrediction]:
        """`head_readback`'s numbers of ``layer`` (host, [2*D*E] float32) -> the predictions `predict` makes
        there: the same probabilities (float32 each), as far as ``ctx.max_lookahead`` asks."""
        targets = self._targets(layer, ctx.max_lookahead)
        n = len(targets)
        if not n:
            return []
        D, E = self.max_distance, self.lm.n_experts
        probs = arr[: n * E].reshape(n, E).tolist()
        order = arr[D * E: D * E + n * E].reshape(n, E).astype(np.int64).tolist()
        return [LayerPrediction(d + 1, t, tuple(probs[d]), order[d]) for d, t in enumerate(targets)]
