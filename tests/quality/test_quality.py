"""Quality metrics on a tiny model: exact policies score zero loss, lossy ones measurable loss;
the agreement arithmetic; the `quality` command and its bad input."""
import json
import re
import sys

import pytest
import torch

from spice_core.api import RunSettings
from spice_core.tools.quality import EvalSet, agreement, evaluate, exact_reference, forced_logits

from lore_support import build_tiny, engine_with_lore, random_rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny("deepseek_v2", tmp_path_factory.mktemp("tiny_quality") / "ds")


@pytest.fixture(scope="module")
def engine(model_dir):
    return engine_with_lore(model_dir, 8)


@pytest.fixture(scope="module")
def reference(engine):
    windows = tuple(tuple(r) for r in random_rows(96, n_rows=3, length=40, seed=7))
    data = EvalSet(windows, tuple(w[:6] for w in windows), "random ids")
    return exact_reference(engine, data, new_tokens=12)


def test_teacher_forcing_one_token_per_step_matches_a_full_forward_pass(engine):
    ids = random_rows(96, 1, 24, seed=3)[0]
    stepped, outcomes, _ = forced_logits(engine, ids, RunSettings(policy="lru", cache_frac=0.4))
    full = engine.logits_for(ids, RunSettings(policy="lru", cache_frac=0.4))[:-1].cpu()
    assert stepped.shape == full.shape and (stepped - full).abs().max().item() < 1e-4
    assert sum(outcomes.values()) == 23 * engine.lm.top_k * len(engine.lm.moe_layers)


@pytest.mark.parametrize("settings", [RunSettings(policy="lru", cache_frac=0.4),
                                      RunSettings(policy="spice", cache_frac=0.3, tau_approx=0.0, lore_rank=8),
                                      RunSettings(policy="spice_no_lore", cache_frac=0.3, tau_approx=0.5)])
def test_exact_settings_score_zero_loss(engine, reference, settings):
    rep = evaluate(engine, settings, reference)
    assert rep.ppl_delta_pct == 0.0 and rep.mean_kl == 0.0 and rep.top1_agreement == 1.0
    assert rep.greedy_agreement == 1.0 and rep.first_divergence == (None,) * 3
    assert rep.tokens == 3 * 39 and rep.approx_share == 0.0


def test_approximation_costs_measurable_quality_that_grows_with_tau(engine, reference):
    small = evaluate(engine, RunSettings(policy="spice", cache_frac=0.3, tau_approx=0.05, lore_rank=8), reference)
    large = evaluate(engine, RunSettings(policy="spice", cache_frac=0.3, tau_approx=1.0, lore_rank=1), reference)
    assert 0.0 < large.approx_share and small.approx_share < large.approx_share
    assert small.mean_kl < large.mean_kl and large.mean_kl > 0
    assert large.greedy_agreement < 1.0 and any(f is not None for f in large.first_divergence)
    assert large.miss_split["approx"] > 0 and "copy" not in large.miss_split   # tau 1 approximates every miss
    as_json = json.dumps(large.as_dict(), allow_nan=False)
    assert '"ppl_delta_pct"' in as_json and '"first_divergence"' in as_json


@pytest.mark.parametrize("ref,got,same,first", [
    ([1, 2, 3], [1, 2, 3], 3, None), ([1, 2, 3, 4], [1, 2, 9, 4], 3, 2), ([1, 2, 3], [1, 2], 2, 2),
    ([1, 2], [1, 2, 5], 2, 2), ([], [], 0, None)])
def test_agreement_counts_identical_positions_and_the_first_divergence(ref, got, same, first):
    assert agreement(ref, got) == (same, first)


def _cli(*argv):
    from spice_core.tools.cli import main

    return main(["quality", *map(str, argv)])


def test_quality_command_prints_one_json_object(model_dir, capsys):
    assert _cli("--model", model_dir, "--device", "cpu", "--policy", "lru", "--cache-frac", "0.4",
                "--max-tokens", "48", "--window", "24", "--n-prompts", "2", "--new-tokens", "4", "--json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["policy"] == "lru" and out["ppl_delta_pct"] == 0.0 and out["greedy_agreement"] == 1.0
    assert out["tokens"] > 0 and out["prompts"] == 2


def test_quality_without_greedy_tokens_says_agreement_was_not_measured(model_dir, capsys):
    """Regression (review): --new-tokens 0 printed "greedy agreement 1.0000 over 2 prompts x 0 tokens" and JSON 1.0
    for an agreement nobody measured."""
    argv = ["--model", model_dir, "--device", "cpu", "--policy", "spice", "--tau-approx", "0.2", "--max-tokens", "32",
            "--window", "16", "--n-prompts", "2", "--new-tokens", "0"]
    assert _cli(*argv, "--json") == 0
    assert json.loads(capsys.readouterr().out)["greedy_agreement"] is None
    assert _cli(*argv) == 0
    out = capsys.readouterr().out
    assert "not measured (--new-tokens 0)" in out and "1.0000" not in out.split("greedy agreement")[1].split("\n")[0]


def test_quality_command_table_and_prompt_file(model_dir, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the cat saw a dog\n\nthe girl ran home\n")
    assert _cli("--model", model_dir, "--device", "cpu", "--policy", "spice", "--tau-approx", "0.2",
                "--max-tokens", "32", "--window", "16", "--prompts", prompts, "--new-tokens", "4") == 0
    out = capsys.readouterr().out
    assert "perplexity delta" in out and "greedy agreement" in out and "over 2 prompts x 4 tokens" in out
    assert "no LoRE artifacts" in out       # this model has none beside it: exact, and it says so


@pytest.mark.parametrize("argv,match", [
    (["--tau-approx", "1.5"], r"--tau-approx 1.5 is out of range: use a value in \[0, 1\]"),
    (["--tau-approx", "-0.1"], r"--tau-approx -0.1 is out of range"),
    (["--lore-rank", "0"], r"--lore-rank 0 is out of range: use an integer >= 1"),
    (["--window", "100000"], r"--window 100000 is longer than the model's context \(256\)"),
    (["--prompts", "/nonexistent/prompts.txt"], r"--prompts /nonexistent/prompts.txt: no such file"),
    (["--policy", "fastest"], r"--policy 'fastest' is unknown")])
def test_quality_command_bad_input_says_what_to_change(model_dir, capsys, argv, match):
    assert _cli("--model", model_dir, "--device", "cpu", "--max-tokens", "16", *argv) == 2
    err = capsys.readouterr().err
    assert "error: " in err and "Traceback" not in err
    assert re.search(match, err), err
