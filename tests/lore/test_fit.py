"""LoRE fitting: error per rank, nesting, the shared-expert term, rank bounds, traces forms."""
import pytest
import torch

from spice_core.errors import ConfigError
from spice_core.lore import fit_lore_bank, lore_error_report
from spice_core.lore.fit import fit_expert
from spice_core.types import ExpertKey
from lore_support import FAMILIES

ERROR_FAMILIES = [f for f in FAMILIES if f != "deepseek_v2_grouped"]


@pytest.mark.parametrize("family", ERROR_FAMILIES)
def test_lore_error_falls_with_rank_and_beats_plain_svd_on_heldout_activations(lore_engines, family):
    eng, traces = lore_engines[family]
    width = eng.lm.layout.intermediate
    rows = lore_error_report(eng.lm, traces, [1, 2, 4, 8, width], heldout_frac=0.25)
    errs = [r["lore_rel_err"] for r in rows]
    assert all(b <= a + 0.02 for a, b in zip(errs, errs[1:])), errs          # falls with rank
    assert errs[-2] < 0.8 * errs[0], errs
    for r in rows[:-1]:                                                         # ranks below the width
        assert r["lore_rel_err"] < r["svd_rel_err"], r
        assert r["lore_rel_err"] < r["linear_rel_err"], r
    assert rows[-1]["lore_rel_err"] < 1e-3 and rows[-1]["svd_rel_err"] == 0.0   # every neuron: the expert itself
    assert rows[0]["heldout_tokens"] > 0 and rows[0]["fit_tokens"] > rows[0]["heldout_tokens"]


def test_error_report_skips_ranks_above_the_expert_width_and_says_why(lore_engines):
    eng, traces = lore_engines["mixtral"]
    rows = lore_error_report(eng.lm, traces, [4, 32, 64], bank=eng.artifacts.lore)
    assert rows[0]["rank"] == 4 and "lore_rel_err" in rows[0] and rows[0]["linear_rel_err"] is None
    assert rows[1] == {"rank": 32, "skipped": "above the expert width 16"}
    with pytest.raises(ConfigError, match="expert width is 16"):
        lore_error_report(eng.lm, traces, [32, 64])


def test_a_truncated_bank_is_the_least_squares_refit_at_that_rank(lore_engines):
    eng, traces = lore_engines["deepseek_v2"]
    full = eng.artifacts.lore                       # fitted at rank 8
    direct = fit_lore_bank(eng.lm, traces, 3)
    x = traces.hidden_by_layer()[eng.lm.moe_layers[0]][:20].float()
    for e in range(eng.lm.n_experts):
        key = ExpertKey(eng.lm.moe_layers[0], e)
        assert torch.allclose(full.with_rank(3).apply(key, x), direct.apply(key, x), atol=1e-4, rtol=1e-4)


def test_greedy_selection_recovers_the_neurons_and_shared_share_that_make_the_output():
    g = torch.Generator().manual_seed(0)
    n, I, H = 400, 12, 10
    h = torch.randn(n, I, generator=g)
    s = torch.randn(n, H, generator=g)
    down = torch.randn(3, H, generator=g)
    y = h[:, [7, 2, 9]] @ down + 0.5 * s + 0.25
    order, T, C, alpha = fit_expert(h, y, s, torch.ones(n), max_rank=5)
    assert set(order[:3]) == {7, 2, 9} and len(order) == 5
    assert alpha == pytest.approx(0.5, abs=1e-6)
    feats = torch.cat([torch.ones(n, 1), h[:, order[:3]]], 1).double()
    pred = feats @ (T[:4, :4] @ C[:4]) + alpha * s.double()
    assert torch.allclose(pred, y.double(), atol=1e-6)


def test_families_without_a_shared_expert_use_lore_alone(lore_engines):
    for fam in ("mixtral", "olmoe", "qwen3_moe"):
        bank = lore_engines[fam][0].artifacts.lore
        assert bank.shared_fn is None
        assert all(float(ly.alpha.abs().max()) == 0.0 for ly in bank.layers.values())
    for fam in ("deepseek_v2", "qwen2_moe"):
        assert lore_engines[fam][0].artifacts.lore.shared_fn is not None


@pytest.mark.parametrize("rank,match", [(0, r"--lore-rank 0 is out of range: use an integer in \[1, 8\]"),
                                        (-3, r"--lore-rank -3 is out of range"),
                                        (17, r"above the expert width 16.*use --lore-rank <= 8"),
                                        (12, r"above the rank the LoRE factors were built with \(8\).*--lore-rank "
                                             r"<= 8.*python -m spice_core calibrate --model M --lore-max-rank 12")])
def test_bad_lore_rank_says_what_to_change(lore_engines, rank, match):
    bank = lore_engines["olmoe"][0].artifacts.lore
    with pytest.raises(ConfigError, match=match):
        bank.with_rank(rank)


def test_fitting_above_the_expert_width_is_refused(lore_engines):
    eng, traces = lore_engines["olmoe"]
    with pytest.raises(ConfigError, match="above the expert width 16"):
        fit_lore_bank(eng.lm, traces, 20)


def test_traces_are_accepted_as_mapping_tuples_or_routing_traces(lore_engines):
    eng, traces = lore_engines["qwen3_moe"]
    hidden = traces.hidden_by_layer()
    a = fit_lore_bank(eng.lm, hidden, 2)
    b = fit_lore_bank(eng.lm, {k: (v, None) for k, v in hidden.items()}, 2)
    c = fit_lore_bank(eng.lm, traces, 2)
    key = ExpertKey(eng.lm.moe_layers[-1], 3)
    x = hidden[key.layer][:5].float()
    assert torch.equal(a.apply(key, x), b.apply(key, x)) and torch.equal(a.apply(key, x), c.apply(key, x))


def test_bad_traces_say_what_to_record(lore_engines):
    eng, traces = lore_engines["mixtral"]
    hidden = traces.hidden_by_layer()
    with pytest.raises(ConfigError, match="empty"):
        fit_lore_bank(eng.lm, {}, 2)
    with pytest.raises(ConfigError, match="reach none of the MoE layers"):
        fit_lore_bank(eng.lm, {99: next(iter(hidden.values()))}, 2)
    first = eng.lm.moe_layers[0]
    with pytest.raises(ConfigError, match=f"lack MoE layers \\[{first}\\]"):
        fit_lore_bank(eng.lm, {k: v for k, v in hidden.items() if k != first}, 2)
    with pytest.raises(ConfigError, match="expected \\[tokens, 32\\]"):
        fit_lore_bank(eng.lm, {k: v[:, :8] for k, v in hidden.items()}, 2)


def test_an_expert_no_calibration_token_reached_still_gets_a_finite_surrogate(lore_engines):
    eng, traces = lore_engines["olmoe"]
    few = {k: v[:3] for k, v in traces.hidden_by_layer().items()}   # 3 tokens: most experts unseen
    bank = fit_lore_bank(eng.lm, few, 4)
    assert bank.info["experts_without_tokens"] > 0
    y = bank.apply(ExpertKey(eng.lm.moe_layers[0], 0), few[eng.lm.moe_layers[0]].float())
    assert torch.isfinite(y).all()
