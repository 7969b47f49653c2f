"""bench's quality passes: teacher-forced runs on the run's own code, ties in the reference's logits, merging."""
import json
import math

import pytest
import torch

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from spice_core.tools.bench import _load_config, run_bench
from spice_core.tools.bench_quality import ReferencePath, forced_pass, heldout_windows, quality_totals
from spice_core.tools.bench_records import merge_records


@pytest.fixture(scope="module")
def mini():
    return SpiceEngine.load("assets/spice-mini", device="cpu", executor="graphed", timing="modeled")


def _settings(policy: str, **kw) -> RunSettings:
    return RunSettings(policy=policy, cache_frac=0.25, max_new_tokens=12, profile="h200-pcie5x16-graphed",
                       shape="deepseek-v2-lite", **kw)


def test_a_forced_run_is_fed_the_given_tokens_and_an_exact_one_reproduces_its_greedy_logits(mini):
    ids = mini.lm.tokenizer("Once upon a time", add_special_tokens=False)["input_ids"]
    greedy = mini.start_ids(ids, _settings("resident"))
    rows, toks = [], []
    for st in greedy:
        toks.append(st.token_id)
        rows.append(greedy.last_logits.float().clone())
    # Fed its own greedy tokens, an exact policy with a cache sees the same logits, bit for bit.
    again = forced_pass(mini, ids, _settings("lru"), toks)
    assert again.shape == (len(toks), rows[0].numel())
    assert torch.equal(again, torch.stack(rows))
    # Fed other tokens, the run follows them (its own picks are ignored): the logits change after the first step.
    other = [(t + 1) % mini.lm.model.config.vocab_size for t in toks]
    moved = forced_pass(mini, ids, _settings("resident"), other)
    assert torch.equal(moved[0], again[0]) and not torch.equal(moved[1:], again[1:])
    ref = ReferencePath(toks, again)
    exact = quality_totals(ref, toks, again)
    assert exact["tf_positions"] == len(toks) and exact["tf_top1"] == len(toks) == exact["tf_top1_ties"]
    assert exact["tf_kl_sum"] == 0.0 and exact["tf_nll_sum"] == exact["tf_nll_ref_sum"]
    assert exact["diverged_runs"] == 0 and exact["diverged_at_tie"] == 0


def test_ties_in_the_reference_are_told_apart_from_real_divergences():
    # Position 1: tokens 2 and 3 tie exactly for the top; position 2: token 0 leads clearly.
    logits = torch.tensor([[5.0, 1.0, 0.0, 0.0], [0.0, 1.0, 4.0, 4.0], [3.0, 1.0, 0.0, 0.0]])
    ref = ReferencePath([0, 2, 0], logits)
    at_tie = quality_totals(ref, [0, 3, 1], None)
    assert at_tie["diverged_runs"] == 1 and at_tie["diverged_at_tie"] == 1 and at_tie["ref_tie_positions"] == 1
    real = quality_totals(ref, [0, 2, 1], None)
    assert real["diverged_runs"] == 1 and real["diverged_at_tie"] == 0
    # Teacher forced: a policy that picks 3 at the tie and 1 where 0 leads: strict top-1 1/3, with ties 2/3.
    pol = torch.tensor([[5.0, 1.0, 0.0, 0.0], [0.0, 1.0, 4.0, 4.5], [1.0, 3.0, 0.0, 0.0]])
    q = quality_totals(ref, None, pol)
    assert "diverged_runs" not in q
    assert (q["tf_positions"], q["tf_top1"], q["tf_top1_ties"]) == (3, 1, 2)
    kl = sum(float((torch.softmax(r, 0) * (torch.log_softmax(r, 0) - torch.log_softmax(p, 0))).sum())
             for r, p in zip(logits, pol))
    assert math.isclose(q["tf_kl_sum"], kl, rel_tol=1e-5) and q["tf_nll_sum"] > q["tf_nll_ref_sum"]


def test_bench_records_quality_and_shards_merge_to_the_whole(tmp_path):
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "executor": "graphed", "prompts": {"heldout": 2},
           "policies": ["resident", "lru", "spice"], "budgets": [0.25], "links": ["native"], "max_new_tokens": 10,
           "profile": "h200-pcie5x16-graphed", "tau_approx": 0.1, "lore_rank": 4, "cpu_lane": False,
           "teacher_forced": ["spice"], "heldout_text_tokens": 40, "heldout_text_window": 20}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    whole = {r["policy"]: r for r in run_bench(_load_config(path), tmp_path / "whole", "cpu")}
    # The reference gets its tie share, every policy its divergence count; only the listed one a forced pass.
    assert whole["resident"]["divergences"] == 0 and whole["resident"]["tf_top1_agreement"] is None
    assert whole["lru"]["divergences"] == 0 and whole["lru"]["tf_top1_agreement"] is None
    sp = whole["spice"]
    assert sp["miss_split"]["approx"] > 0, "the setting should approximate something"
    assert sp["raw"]["tf_positions"] == 20 and 0.0 <= sp["tf_top1_agreement"] <= sp["tf_top1_agreement_ties"] <= 1.0
    assert sp["tf_kl_mean"] > 0.0 and sp["tf_ppl_delta_pct"] is not None
    assert 0 <= sp["divergences_at_tie"] <= sp["divergences"] <= 2
    assert "tf_top1_agreement_ties" in (tmp_path / "whole" / "results.md").read_text()
    # Held-out text: the exact policy against itself (its perplexity, no change), the forced policy on the same
    # windows, the others not at all.
    res = whole["resident"]
    assert 30 <= res["text_tokens"] <= 40 and res["text_tokens"] == sp["text_tokens"]
    assert res["text_ppl_delta_pct"] == 0.0 and res["text_kl_mean"] == 0.0 and res["text_top1_agreement"] == 1.0
    assert res["text_ppl"] > 1.0 and math.isfinite(res["text_ppl"])
    assert sp["text_kl_mean"] > 0.0 and sp["text_ppl_delta_pct"] is not None and 0 <= sp["text_top1_agreement"] <= 1
    assert whole["lru"]["text_tokens"] is None
    shards = []
    for k in (0, 1):
        shards += run_bench(_load_config(path), tmp_path / f"s{k}", "cpu", shard=(k, 2))
    merged = {r["policy"]: r for r in merge_records(shards, [f"s{i}" for i in range(len(shards))])}
    for key in ("tf_top1_agreement", "tf_top1_agreement_ties", "tf_kl_mean", "divergences", "ref_tie_share",
                "text_tokens", "text_ppl_delta_pct", "text_kl_mean", "text_top1_agreement"):
        assert merged["spice"][key] == pytest.approx(sp[key]), key      # the text pass ran in shard 0 only
    assert merged["resident"]["text_ppl"] == pytest.approx(res["text_ppl"])


def test_held_out_text_windows_score_the_next_token_as_stock_transformers_does(mini):
    from transformers import AutoModelForCausalLM

    windows, source = heldout_windows(mini.lm, None, 24, 12)
    assert windows and all(2 <= len(w) <= 12 for w in windows) and "held-out" in source
    stock = AutoModelForCausalLM.from_pretrained("assets/spice-mini", dtype=torch.float32).eval()
    for w in windows[:2]:
        rows = forced_pass(mini, w[:1], _settings("resident"), w[1:])
        assert rows.shape[0] == len(w) - 1          # row i is the logits that score token i + 1
        with torch.no_grad():
            want = stock(torch.tensor([w])).logits[0, :-1].float()
        assert torch.equal(rows.argmax(-1), want.argmax(-1))
        assert torch.allclose(rows, want, atol=1e-3, rtol=1e-4)
