"""LoRE inside the engine: exact at tau_approx 0 on every family, approximation only below tau."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from spice_core.api import RunSettings
from spice_core.errors import ConfigError
from lore_support import FAMILIES, PROMPT

SPICE_POLICIES = ("spice", "spice_no_cpu", "spice_no_lore")


@pytest.fixture(scope="module")
def stock_tokens(lore_dirs):
    out = {}
    for fam, d in lore_dirs.items():
        model = AutoModelForCausalLM.from_pretrained(d).eval()
        with torch.no_grad():
            seq = model.generate(torch.tensor([PROMPT]), max_new_tokens=32, min_new_tokens=32, do_sample=False,
                                 pad_token_id=0)
        out[fam] = seq[0, len(PROMPT):].tolist()
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("policy", SPICE_POLICIES)
def test_tau_approx_zero_is_token_identical_to_stock_generate_with_lore_and_cpu_lane(
        lore_engines, stock_tokens, family, policy):
    eng, _ = lore_engines[family]
    run = eng.start_ids(PROMPT, RunSettings(policy=policy, cache_frac=0.4, tau_approx=0.0, lore_rank=4,
                                            max_new_tokens=32, profile="rtx5090-pcie4x8"))
    tokens = [s.token_id for s in run]
    assert tokens == stock_tokens[family][: len(tokens)]
    outcomes = {o.outcome for s in eng.get_steps(run.run_id) for o in s.outcomes}
    assert "approx" not in outcomes
    if policy != "spice_no_cpu":
        assert "cpu" in outcomes          # the CPU lane took part (modeled, computed exactly here)


def _weights_and_outcomes(eng, settings):
    """Per (token, layer, expert): the router weight, and what the engine did with it."""
    weights = {}
    run = eng.start_ids(PROMPT, settings)

    def observe(layer, idx_rows, w_rows):
        for e, wt in zip(idx_rows[-1], w_rows[-1]):
            weights[(run.token_index, layer, e)] = wt

    run.observers.append(observe)
    steps = list(run)
    return weights, [(s.index, o.layer, o.expert, o.outcome) for s in steps for o in s.outcomes]


@pytest.mark.parametrize("family", ["deepseek_v2", "qwen2_moe", "mixtral"])
def test_misses_are_approximated_only_below_tau(lore_engines, family):
    eng, _ = lore_engines[family]
    tau = 0.3
    s = RunSettings(policy="spice", cache_frac=0.3, tau_approx=tau, lore_rank=4, max_new_tokens=24)
    weights, outcomes = _weights_and_outcomes(eng, s)
    approx = [(t, layer, e) for t, layer, e, o in outcomes if o == "approx" and t > 0]
    assert approx, "some misses should fall below tau"
    assert all(weights[k] < tau for k in approx)
    exact_below = [(t, layer, e) for t, layer, e, o in outcomes if o in ("copy", "cpu") and t > 0]
    assert all(weights[k] >= tau for k in exact_below)   # every miss below tau was approximated


def test_lossy_output_stays_finite_and_close_at_small_tau(lore_engines):
    eng, _ = lore_engines["deepseek_v2"]
    run = eng.start_ids(PROMPT, RunSettings(policy="spice", cache_frac=0.3, tau_approx=0.1, lore_rank=8,
                                            max_new_tokens=16))
    list(run)
    assert run.last_logits is not None and torch.isfinite(run.last_logits).all()


def test_lore_rank_above_the_bank_is_a_config_error_before_any_token(lore_engines):
    eng, _ = lore_engines["olmoe"]
    run = eng.start_ids(PROMPT, RunSettings(policy="spice", tau_approx=0.1, lore_rank=12))
    with pytest.raises(ConfigError, match="--lore-rank 12 is above the rank the LoRE factors were built with"):
        next(iter(run))
    run = eng.start_ids(PROMPT, RunSettings(policy="spice", tau_approx=0.1, lore_rank=40))
    with pytest.raises(ConfigError, match="above the expert width 16"):
        next(iter(run))
    assert [s.token_id for s in eng.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=2))]  # engine free


def test_without_lore_artifacts_tau_approx_runs_exact_and_says_how_to_build_them(lore_dirs, stock_tokens):
    from spice_core.engine import SpiceEngine

    eng = SpiceEngine.load(lore_dirs["qwen3_moe"], device="cpu")
    assert eng.artifacts is None or eng.artifacts.lore is None
    run = eng.start_ids(PROMPT, RunSettings(policy="spice", tau_approx=0.5, max_new_tokens=32, cache_frac=0.4))
    assert [s.token_id for s in run] == stock_tokens["qwen3_moe"]
    assert any("no LoRE artifacts" in n and f"python -m spice_core calibrate --model {lore_dirs['qwen3_moe']}" in n
               for n in run.summary().notes)      # the model's own folder, runnable as printed
