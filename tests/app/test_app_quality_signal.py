"""The app's quality signal is the project's one greedy agreement (issue 24, defect 3): the chat's card, the
sweep's y-axis and table, and About's headline all say greedy agreement and mean
spice_core.api.greedy_agreement (positions with the same token over the longer sequence, pooled over prompts
by summing matches first); the identical prefix is named as what it is."""
from types import SimpleNamespace

import pytest

from spice_core.api import RunSettings, greedy_agreement, identical_prefix_share


def test_the_chat_card_is_greedy_agreement_not_the_identical_prefix():
    """Regression: the card showed identical_prefix_share: one early difference in 64 tokens read as 2%."""
    from pages.chat_text import agreement_value

    exact = list(range(64))
    reply = [0, 99] + exact[2:]
    value, detail = agreement_value(exact, reply)
    assert value == f"{100 * greedy_agreement(exact, reply):.0f}%" == "98%"
    assert identical_prefix_share(exact, reply) < 0.05
    # The token index the heatmap, trace explorer and settings notes show (from 0); it said "token 2" (review).
    assert "63 of 64" in detail and "first differs at token 1 (counted from 0" in detail
    assert agreement_value(exact, exact) == ("100%", "measured: 64 of 64 tokens match · identical")
    # A reply that stops early disagrees on the rest (the longer length counts).
    assert agreement_value(exact, exact[:32])[0] == "50%"


def test_the_sweep_pools_matching_positions_and_names_the_prefix_apart():
    from pages.sweep_table import TABLE_COLUMNS, setting_row, settings_table
    from spice_core.api import matching_tokens

    summary = SimpleNamespace(tpot_ms_median=5.0, tokens_per_s=200.0, hit_rate=0.5, bytes_per_token=1e6,
                              shape_bytes_per_token=0.0, stall_ms_per_token=0.1)
    pairs = [([1, 2, 3, 4], [1, 2, 3, 4]), ([1, 2, 3, 4, 5, 6, 7, 8], [9, 2, 3, 4, 5, 6, 7, 8])]
    per_prompt = [((matching_tokens(r, t), identical_prefix_share(r, t)), summary) for r, t in pairs]
    row = setting_row(RunSettings(policy="spice", tau_approx=0.05), per_prompt, "modeled")
    assert row["agreement"] == pytest.approx(11 / 12)                 # pooled: (4 + 7) / (4 + 8)
    assert row["identical_prefix"] == pytest.approx(0.5)              # (1.0 + 0.0) / 2
    table = settings_table([row])
    assert "greedy agreement %" in TABLE_COLUMNS and "identical prefix %" in TABLE_COLUMNS
    assert table["greedy agreement %"][0] == pytest.approx(91.7) and table["identical prefix %"][0] == 50.0


def test_a_sweep_rows_tokens_per_second_is_of_its_own_tpot():
    """Regression (review): a row's tokens/s was the mean of its prompts' rates while TPOT was the mean of their
    medians, so a row could read "TPOT 40 ms · 33.3 tokens/s"."""
    from pages.sweep_table import setting_row, settings_table

    def run(tpot):
        return SimpleNamespace(tpot_ms_median=tpot, tokens_per_s=1000 / tpot, hit_rate=0.5, bytes_per_token=1e6,
                               shape_bytes_per_token=0.0, stall_ms_per_token=0.1)

    row = setting_row(RunSettings(policy="spice"), [(((4, 4), 1.0), run(20.0)), (((4, 4), 1.0), run(60.0))], "modeled")
    table = settings_table([row])
    assert table["TPOT ms"][0] == 40.0 and table["tokens/s"][0] == 25.0


def test_the_about_headline_gives_quality_at_a_glance(tmp_path):
    import json

    from pages.about import headline_markdown

    rec = lambda pol, ms, **kw: {"link": "native", "policy": pol, "budget_frac": 0.25, "workload": "prompts",  # noqa: E731
                                 "timing": "measured", "tpot_ms_median": ms, "n_decode_tokens": 504, **kw}
    path = tmp_path / "r.json"
    path.write_text(json.dumps([rec("on_demand", 60.0), rec("spice", 20.0, ppl_delta_pct=0.29, greedy_agreement=0.8047)]))
    text = headline_markdown(path)
    assert "perplexity +0.29%" in text and "greedy agreement with `resident` 80%" in text, text


def test_about_cites_the_paper_and_the_model_cards_and_defines_agreement():
    """Regression (issue 24, defect 11): About cited no paper, repository or model card."""
    from pages.about import ABOUT

    assert "arXiv:2608.21240" in ABOUT and "assets/spice-mini" in ABOUT and "model card" in ABOUT
    assert "Greedy agreement" in ABOUT and "longer of the two" in ABOUT
