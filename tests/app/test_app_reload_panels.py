"""A reload brings back the last reply's panels and numbers row (regression: the conversation came back but the
heatmap, prefetch timeline, lane chart and numbers row started empty, although the server still held the run).

The panels are rebuilt from the run's stored steps through `LiveRun.add`, so they equal what was shown live; a
run the visitor may not open (another's, or gone) leaves the placeholders and one note, never the run.
"""
from __future__ import annotations

import json
import math
from collections import deque
from dataclasses import fields, replace
from types import SimpleNamespace

import gradio as gr
import numpy as np
import pytest

from app_helpers import SHIPPED, settings_inputs
from fake_engine import FakeEngine
from pages.chat import CURSOR, PANELS, PLACEHOLDERS, ChatPage, ChatSession
from pages.chat_reload import GONE_NOTE, last_reply_run
from pages.common import AppContext, as_plot
from pages.figures import empty_figure
from pages.live import LiveRun
from pages.messages import normalize_history, note, reply, restore_kept, run_note, run_of
from spice_core.api import RunSettings

ALICE = SimpleNamespace(cookies={"spice_owner": "a" * 32}, session_hash="alice-tab", query_params={})
BOB = SimpleNamespace(cookies={"spice_owner": "b" * 32}, session_hash="bob-tab", query_params={})


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, (list, tuple, deque)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_live(rebuilt: LiveRun, shown: LiveRun) -> None:
    for f in fields(LiveRun):
        assert _same(getattr(rebuilt, f.name), getattr(shown, f.name)), f"LiveRun.{f.name} differs"
    for number in ("ttft_ms", "tpot_ms", "tokens_per_s", "hit_rate", "late_rate", "bytes_per_token",
                   "shape_bytes_per_token", "stall_ms_per_token", "mean_lookahead"):
        assert getattr(rebuilt, number) == getattr(shown, number), number
    assert np.array_equal(rebuilt.totals_mode(), shown.totals_mode())
    assert np.array_equal(rebuilt.tokens_used(), shown.tokens_used())


def _engines():
    yield pytest.param(lambda: FakeEngine(token_delay_s=0), id="fake engine")
    yield pytest.param("shipped", id="shipped model")


@pytest.mark.parametrize("make", list(_engines()))
def test_a_live_run_rebuilt_from_a_finished_runs_steps_equals_the_one_shown_live(make):
    if make == "shipped":
        if not (SHIPPED / "config.json").exists():
            pytest.skip("the shipped model is not in assets/spice-mini")
        from spice_core.engine import SpiceEngine
        engine = SpiceEngine.load(None, device="cpu")        # tests/conftest.py: one torch thread
    else:
        engine = make()
    info = engine.info()
    shown = LiveRun.for_engine(info)
    run = engine.start_prompt("Tell me a story about a cat and a ball.",
                              RunSettings(policy="spice", max_new_tokens=24, cache_frac=0.25))
    for step in run:
        shown.add(step)
    assert shown.n_tokens > 2 and shown.prefetches_issued and shown.counts.sum()
    rebuilt = LiveRun.from_steps(info, engine.get_steps(run.run_id))
    assert_same_live(rebuilt, shown)


def _page(engine=None):
    ctx = AppContext.create(engine or FakeEngine(token_delay_s=0))
    return ctx, ChatPage(ctx)


def _reply(page, request, session=None, **settings):
    """One whole reply through the chat page (figures at its end): (history, numbers row, figures) as it ended."""
    session = session or ChatSession()
    outputs = list(page.chat("a story about a fox", [], *settings_inputs(**({"max_new_tokens": 20} | settings)),
                             False, False, session, request=request))
    last = outputs[-1]
    return last[1], last[2], last[3:6], session


def _plot(value) -> dict:
    return json.loads(value.plot)


def _is_placeholder(name: str, value) -> bool:
    return _plot(value) == _plot(as_plot(empty_figure(PLACEHOLDERS[name])))


def test_a_reload_brings_back_the_numbers_row_and_panels_as_the_reply_ended():
    ctx, page = _page()
    history, stats, figures, ended = _reply(page, ALICE)
    kept = json.loads(json.dumps(history))        # what the browser keeps and hands back
    restored = ChatSession(settings=ended.settings)   # the controls say what the reply ran with
    out = page.reload.restore(restore_kept(kept, CURSOR.strip()), restored, ALICE)
    assert out[0] == stats, "the numbers row differs from the one the reply ended with"
    for name, got, want in zip(PANELS, out[1:], figures):
        assert _plot(got) == _plot(want), f"the {name} panel differs from the one the reply ended with"
    assert restored.last_run_id == last_reply_run(history) != ""
    assert restored.last_view["live"].n_tokens == restored.last_view["summary"].n_tokens
    # Controls back at their defaults after the reload: the row says so, over the same cards.
    fresh = page.reload.restore(kept, ChatSession(), ALICE)[0]
    assert "Next message" in fresh and fresh.split("<div class='cards'>")[1] == stats.split("<div class='cards'>")[1]


def test_a_reply_with_an_exact_check_comes_back_with_its_agreement():
    ctx, page = _page()
    session = ChatSession()
    outputs = list(page.chat("a story about a fox", [], *settings_inputs(max_new_tokens=12, tau_approx=0.1),
                             False, True, session, request=ALICE))
    history, stats = outputs[-1][1], outputs[-1][2]
    assert "greedy agreement" in stats and "measured:" in stats
    out = page.reload.restore(history, ChatSession(settings=session.settings), ALICE)
    assert out[0] == stats


def test_another_visitors_run_is_refused_with_the_placeholders_and_one_note():
    ctx, page = _page()
    history, stats, _, _ = _reply(page, ALICE)
    run_id = last_reply_run(history)
    bobs = ChatSession()
    out = page.reload.restore(history, bobs, BOB)
    assert GONE_NOTE.replace("'", "&#x27;") in out[0]
    assert run_id not in out[0] and "TPOT" not in out[0], "another visitor's numbers were shown"
    for name, got in zip(PANELS, out[1:]):
        assert _is_placeholder(name, got), f"the {name} panel is not its placeholder"
    assert bobs.last_view == {} and bobs.last_run_id == ""
    # Shared, it opens as in the trace explorer (its link works for anyone who has it).
    assert ctx.runs.set_shared(run_id, "browser:" + "a" * 32, True)
    assert "TPOT" in page.reload.restore(history, ChatSession(), BOB)[0]


def test_a_visitor_without_an_identity_gets_no_run():
    ctx, page = _page()
    history, _, _, _ = _reply(page, ALICE)
    assert GONE_NOTE.replace("'", "&#x27;") in page.reload.restore(history, ChatSession(), None)[0]


def test_an_expired_run_leaves_the_placeholders_one_note_and_the_conversation():
    engine = FakeEngine(token_delay_s=0, max_runs=1)
    ctx, page = _page(engine)
    history, _, _, _ = _reply(page, ALICE)
    _reply(page, ALICE)                      # the engine keeps one run: the first reply's is gone
    kept = list(history)
    out = page.reload.restore(history, ChatSession(), ALICE)
    assert out[0].count("<li>") == 1 and GONE_NOTE.replace("'", "&#x27;") in out[0]
    assert all(_is_placeholder(n, p) for n, p in zip(PANELS, out[1:]))
    assert history == kept


def test_a_conversation_without_a_reply_changes_nothing():
    ctx, page = _page()
    history = [{"role": "user", "content": "hello"}, note("⚠ Message not sent: too long")]
    out = page.reload.restore(history, ChatSession(), ALICE)
    assert out == (gr.skip(),) * 4, "a row or panel was drawn for a conversation without a reply"


def test_a_reply_cut_short_by_a_reload_gets_the_panels_of_what_it_generated():
    """The page went away mid-reply: its run is being stopped when the page comes back; the panels wait for it."""
    ctx, page = _page(FakeEngine(token_delay_s=0.01))
    session = ChatSession()
    gen = page.chat("a story about a fox", [], *settings_inputs(max_new_tokens=400), False, False, session,
                    request=ALICE)
    streaming = next(out[1] for out in gen if isinstance(out[1], list) and len(out[1][-1]["content"]) > 40)
    kept = restore_kept(json.loads(json.dumps(streaming)), CURSOR.strip())
    gen.close()                               # what Gradio does when the page goes: the stream is cancelled
    out = page.reload.restore(kept, ChatSession(settings=session.settings), ALICE)
    run_id = last_reply_run(kept)
    steps = ctx.engine.get_steps(run_id)
    assert 0 < len(steps) < 400 and f">{len(steps)}<" in out[0] and run_id in out[0]
    assert_same_live(LiveRun.from_steps(ctx.info, steps), session_live(page, run_id))


def session_live(page, run_id):
    """What a second restore rebuilds for ``run_id`` (the same steps, folded again)."""
    s = ChatSession()
    page.reload.restore([reply("x", run_id)], s, ALICE)
    return s.last_view["live"]


def test_the_last_replys_run_is_found_in_tagged_and_older_kept_conversations():
    ended = [{"role": "user", "content": "hi"}, reply("Once upon a time"), run_note("Run abc123 · 3 tokens", "", "abc123")]
    assert last_reply_run(ended) == "abc123"
    in_flight = [{"role": "user", "content": "hi"}, reply("Once upon", "d00d")]
    assert last_reply_run(in_flight) == "d00d"
    # Kept before run notes were tagged: the run note's link names the run.
    older = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"},
             note("Run f00d · 3 tokens · TPOT 1.00 ms", "…\n\n[Open this run in the trace explorer](trace?run=f00d)")]
    assert last_reply_run(older) == "f00d"
    # Only the reply to the last message counts: a newer message without a reply has no run.
    assert last_reply_run(ended + [{"role": "user", "content": "more"}]) == ""
    assert last_reply_run([reply("x", "bad id!"), {"role": "assistant", "content": "y", "metadata": {"id": 3}}]) == ""
    assert last_reply_run("not a list") == "" and last_reply_run([]) == ""


def test_an_ended_reply_is_a_plain_message_and_its_run_note_names_the_run():
    """The API's history keeps its shape: a reply has no metadata once it ended (only the app's notes have)."""
    ctx, page = _page()
    history, _, _, _ = _reply(page, ALICE)
    replies = [m for m in history if m["role"] == "assistant" and "metadata" not in m]
    notes = [run_of(m) for m in history if m.get("metadata", {}).get("title", "").startswith("Run ")]
    assert replies and notes == [last_reply_run(history)] != [""]


def test_a_reply_in_flight_keeps_its_run_tag_through_the_chat_and_nothing_else_does():
    history = normalize_history([
        reply("Once", "r1"),
        {"role": "assistant", "content": "x", "metadata": {"id": "other"}},
        {"role": "user", "content": "u", "metadata": {"id": "run:r2"}},
        {"role": "assistant", "content": [{"type": "text", "text": "y"}], "metadata": {"id": "run:r3", "log": "z"}},
    ])
    assert [m.get("metadata") for m in history] == [{"id": "run:r1"}, None, None, {"id": "run:r3"}]


def test_the_views_book_stays_bounded():
    from pages.chat_reload import ReplyViews
    views = ReplyViews(size=3)
    for i in range(5):
        views.remember(SimpleNamespace(run_id=f"r{i}", settings=replace(RunSettings(), max_new_tokens=i + 1),
                                       changes=[]))
    assert [views.get(f"r{i}") is not None for i in range(5)] == [False, False, True, True, True]
