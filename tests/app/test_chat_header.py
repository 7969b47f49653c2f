"""What the numbers row says about the settings and the lookahead, and the note a token limit leaves (pages.chat_text):
plain functions, checked without an app."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from fake_engine import FakeEngine
from pages import chat_text
from pages.common import POLICY_LABELS
from pages.live import LiveRun
from spice_core.api import POLICIES, PrefetchRecord, RunSettings, StepStats
from spice_core.policy.spec import POLICY_SPECS

INFO = FakeEngine().info()


def _words(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_header_names_the_policy_as_the_menu_does_and_only_the_settings_it_reads(policy):
    """Regression (QA, defect 6): "spice_no_cpu · … CPU lane on", "LoRE r4" beside spice_no_lore, τ_prefetch, lookahead
    and LoRE beside resident, lru and on_demand, and internal ids instead of the menu's labels."""
    settings = RunSettings(policy=policy, cache_frac=0.5, tau_prefetch=0.6, tau_approx=0.05, max_lookahead=3,
                           lore_rank=4, cpu_lane=False)
    line = _words(chat_text.settings_line(settings, INFO))
    spec = POLICY_SPECS[policy]
    assert line.startswith(POLICY_LABELS[policy]) and f"{policy} " not in line + " ", line
    assert ("cache 50%" in line) == (not spec.preload_all and (spec.keep_misses or spec.static_cache)), line
    assert ("prefetch 0.6" in line) == ("lookahead ≤ 3" in line) == spec.prefetches, line
    assert ("approx 0.05" in line) == ("LoRE r4" in line) == spec.use_lore, line
    assert ("CPU lane off" in line) == spec.use_cpu and "CPU lane on" not in line, line


def test_a_model_without_lore_factors_shows_no_lore_setting():
    info = replace(INFO, has_lore=False)
    line = _words(chat_text.settings_line(RunSettings(policy="spice", tau_approx=0.05), info))
    assert "approx" not in line and "LoRE r" not in line and "CPU lane on" in line, line


def test_the_lore_rank_shown_is_the_one_the_run_uses():
    """Regression (review): rank 16 (the default, "up to 16") on a model whose factors stop at 4 showed "LoRE r16"
    while the run used rank 4."""
    info = replace(INFO, has_lore=True, lore_ranks=(1, 2, 4))
    line = _words(chat_text.settings_line(RunSettings(policy="spice", lore_rank=16), info))
    assert "LoRE r4 (r16 asked" in line and "LoRE r16" not in line, line
    assert "LoRE r2" in _words(chat_text.settings_line(RunSettings(policy="spice", lore_rank=2), info))


def test_the_numbers_row_for_the_next_message_uses_the_menus_labels():
    """Regression (QA, defect 8's screen): "Next message: spice · cache 25%…"."""
    ran = RunSettings(policy="spice")
    html = chat_text.stats_html(_live([0.0]), ran, INFO, next_settings=replace(ran, policy="lru", cache_frac=0.5))
    assert f"Next message: <b>{POLICY_LABELS['lru']}</b> · cache 50%</span>" in html, html


def _live(depths, reasons=("time",), prefetches=1) -> LiveRun:
    live = LiveRun(layers=(1, 2), n_experts=4)
    for i, depth in enumerate(depths):
        pf = tuple(PrefetchRecord(2, e, 1, 0.0, 2.0, 1.0, 0.9) for e in range(prefetches))
        live.add(StepStats(i, i, "x", 10.0, "modeled", 3, 1, 100, 1.0, depth, prefetches=pf,
                           lookahead_stops=reasons))
    return live


def test_the_lookahead_note_says_what_the_card_says():
    """Regression (QA, defect 5): the card said "0.1 of 4", the depth chart went up to 0.2, and the note under them
    "the lookahead stopped at depth 0 (100% of layers)": 100% was the share of layer plans stopped because copies could
    not arrive in time, not a share of layers at depth 0."""
    live = _live([0.0, 0.1, 0.2, 0.1])
    settings = RunSettings(policy="spice", max_lookahead=4)
    html = chat_text.stats_html(live, settings, INFO)
    words = _words(html)
    assert "0.1 of 4" in words and "stop: copies too slow (100%)" in words, words
    (note,) = chat_text.why_lines(live, settings)
    assert "depth 0" not in note and "0.1 layers ahead on average (of 4 allowed)" in note, note
    assert "100% of the layers planned stopped the lookahead because copies could not arrive in time" in note, note


def test_a_policy_that_never_prefetches_has_no_lookahead_card():
    """The header shows no lookahead for LRU (defect 6): a card saying "0.0 of 4" beside it contradicted it."""
    words = _words(chat_text.stats_html(_live([0.0], reasons=(), prefetches=0), RunSettings(policy="lru"), INFO))
    assert "lookahead" not in words.lower(), words


def test_the_copied_card_says_per_token():
    html = chat_text.stats_html(_live([0.0, 0.0]), RunSettings(), INFO)
    assert "<div class='k'>copied per token</div><div class='v'>100 B</div>" in html, html


@pytest.mark.parametrize("reply, n_tokens, limit, trimmed, says", [
    ("Once upon a time a cat sat. It was happy.", 24, 24, "Once upon a time a cat sat. It was happy.",
     "Reached the 24-token limit: the reply may be unfinished"),
    ("Once upon a time a cat sat. It was happy. Then the", 24, 24, "Once upon a time a cat sat. It was happy.",
     "Reached the 24-token limit: the reply ends at its last full sentence"),
    ("Once upon a time a cat sat on a very long mat and then the", 24, 24,
     "Once upon a time a cat sat on a very long mat and then the", "Reached the 24-token limit: the reply may be"),
    ("The end of it all. And then", 10, 24, "The end of it all.", "Reached the model's context (512 tokens): the reply "
                                                                  "ends at its last full sentence"),
])
def test_a_reply_that_a_token_limit_ended_always_says_so(reply, n_tokens, limit, trimmed, says):
    """Regression (QA, defect 4): the note came only when the reply was trimmed, so a reply that used all its tokens
    and happened to end on a full stop (or could not be trimmed) looked finished."""
    shown, note = chat_text.at_limit(reply, n_tokens, limit, 512)
    assert shown == trimmed and says in note, (shown, note)


def _step(index: int, step_ms: float, stall_ms: float) -> StepStats:
    return StepStats(index, 5, "x", step_ms, "modeled", 1, 1, 0, stall_ms, 1.0)


def _card_of(html: str, key: str) -> tuple[str, str]:
    m = re.search(rf"<div class='k'>{key}</div><div class='v'>([^<]*)</div><div class='s'[^>]*>([^<]*)<", html)
    assert m, html
    return m.group(1), m.group(2)


def test_the_stall_share_is_the_decode_times_stalled_share_not_a_mean_over_a_median():
    """Regression (review): the card divided the mean stall per token by the median TPOT, so a run whose slow steps
    stalled most (a τ change mid-reply) read 72% where 45% of its decode time was stalled. The prefill's step and
    stall are left out, as TPOT leaves them out."""
    live = LiveRun(layers=(1,), n_experts=4)
    for i, (step_ms, stall_ms) in enumerate([(500.0, 400.0), (10.0, 1.0), (10.0, 1.0), (10.0, 1.0), (90.0, 80.0)]):
        live.add(_step(i, step_ms, stall_ms))
    share = (1 + 1 + 1 + 80) / (10 + 10 + 10 + 90)
    assert live.stall_share == pytest.approx(share)
    assert live.stall_ms_per_token / live.tpot_ms > 2 * share       # what the card used to show
    value, sub = _card_of(chat_text.stats_html(live, RunSettings(), INFO), "stall")
    assert value == f"{83 / 4:.2f} ms" and sub == f"per token ({100 * share:.0f}% of decode time)", (value, sub)


def test_a_one_token_reply_shows_no_tpot_rate_or_share_rather_than_zeros():
    """Regression (review): a reply stopped after its first token read "TPOT 0.00 ms", "tokens/s 0.0" and "stall
    439.58 ms per token (0% of TPOT)"; one token has no decode step to time."""
    live = LiveRun(layers=(1,), n_experts=4)
    live.add(_step(0, 500.0, 439.58))
    html = chat_text.stats_html(live, RunSettings(), INFO)
    assert _card_of(html, "TPOT")[0] == "–" and _card_of(html, "tokens/s")[0] == "–"
    assert _card_of(html, "stall") == ("439.58 ms", "in the first token (the prefill)")
    assert live.stall_share is None
    from types import SimpleNamespace

    summary = SimpleNamespace(run_id="r1", n_tokens=1, tpot_ms_median=0.0, tpot_ms_p90=0.0, tokens_per_s=0.0,
                              timing="modeled")
    assert "TPOT n/a (no decode step)" in chat_text.run_title(summary, live)
    assert "0.00" not in chat_text.decode_words(summary) and "n/a" in chat_text.decode_words(summary)


def test_the_header_marks_every_change_the_reply_took_and_the_next_messages_profile():
    """Regression (review): τ_approx 0 → 0.2 from token 5, then a deferred change: the header showed "τapprox 0.2"
    with no mark, as if the whole reply had run so (it marked the last request only). And after a profile change the
    "Next message" line did not name the profile the next reply is timed for."""
    from types import SimpleNamespace

    from pages.runner import SettingsChange

    ran = RunSettings(policy="spice", tau_approx=0.0)
    after = replace(ran, tau_approx=0.2)
    stream = SimpleNamespace(run_id="r1", settings=after, changes=[
        SettingsChange(("tau_approx",), (), 5, settings_after=after),
        SettingsChange((), ("max_new_tokens",), 11, settings_after=after)])
    html = chat_text.stats_html(_live([0.0]), after, INFO, stream=stream)
    assert "changed tau_approx from token 5" in _words(html), html
    nxt = replace(ran, profile="h200-pcie5x16")
    html = chat_text.stats_html(_live([0.0]), ran, INFO, next_settings=nxt)
    assert "Next message:" in html and "modeled (h200-pcie5x16, " in html.split("<br>")[0], html
