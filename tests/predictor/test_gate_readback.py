"""The gate predictor on the fast path: what its captured readback parses to is what the eager `predict` returns
(same probabilities, float for float; the ranking `ranked()` makes), in every family, at every lookahead."""

import numpy as np
import pytest
import torch

from tiny_models import FAMILIES, build_tiny

from spice_core.model.loader import load_model
from spice_core.predictor.gate import GatePredictor
from spice_core.runtime.context import PredictContext


class _NoClock:
    def stamp(self):
        return 0.0

    def draft(self, *args):
        pass


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gate")
    return {f: load_model(build_tiny(f, root / f), "cpu") for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_readback_parses_to_the_predictions_the_eager_predictor_makes(models, family):
    lm = models[family]
    gate = GatePredictor(lm)
    torch.manual_seed(0)
    hidden = lm.model.config.hidden_size
    dtype = next(lm.model.parameters()).dtype
    for layer in (lm.moe_layers[0], lm.moe_layers[len(lm.moe_layers) // 2], lm.moe_layers[-1]):
        x = torch.randn(1, hidden).to(dtype)
        row = gate.head_readback(layer, x).numpy()
        assert row.shape == (gate.readback_numel,) and row.dtype == np.float32
        for lookahead in (1, 4, 8):
            ctx = PredictContext(max_lookahead=lookahead, clock=_NoClock())
            want, got = gate.predict(layer, x, ctx), gate.predictions_from_readback(layer, row, ctx)
            assert [(p.distance, p.layer) for p in got] == [(p.distance, p.layer) for p in want]
            assert len(want) == min(lookahead, len(lm.moe_layers) - 1 - lm.moe_layers.index(layer))
            for g, w in zip(got, want):
                assert list(g.probs) == list(w.probs)          # the same float32 numbers
                assert list(g.ranked()) == list(w.ranked())    # descending, ties by index


def test_a_gate_row_past_the_last_layer_is_zero_and_parses_to_nothing(models):
    lm = models["mixtral"]
    gate = GatePredictor(lm, max_distance=3)
    x = torch.randn(1, lm.model.config.hidden_size).to(next(lm.model.parameters()).dtype)
    row = gate.head_readback(lm.moe_layers[-1], x).numpy()
    assert not row[: 3 * lm.n_experts].any()
    assert gate.predictions_from_readback(lm.moe_layers[-1], row, PredictContext(max_lookahead=4)) == []
