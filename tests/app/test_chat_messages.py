"""What the chat holds: the visitor's and the model's text shown as it is, never as HTML (while the model, a retry, an
edit and a run's label get exactly what was typed), notes about the last action that do not pile up, the note a
token limit leaves, and what a page load brings back of what the browser kept. Unit tests of pages.messages and the
chat page's handlers, and API flows on the fake engine."""
from __future__ import annotations

import json
import random

import pytest

import gradio as gr

from app_helpers import chat_inputs, content, last_notes
from pages.chat import CURSOR, ChatPage, ChatSession
from pages.chat_settings import restored, settings_json
from pages.common import default_settings
from pages.limits import Limits
from pages.messages import engine_turns, note, restore_kept, run_of, shown_text, transient_note, typed_text
from fake_engine import FakeEngine

HOSTILE = "<img src=x onerror=alert(1)> <b>bold</b> a<b story about a cat."
# Markdown a visitor may well type, a backslash of their own among it (the chat holds it escaped).
MARKDOWN = "*x* and a_b, \\* [l](u) 2 > 1 & `c`\n1. one\n    code *as is*"


@pytest.mark.parametrize("text", [
    HOSTILE, "Tell me a story about a cat and a ball.", "1. one\n2) two\n- three\n+ four\nTitle\n===\n---",
    "**bold** _it_ `code` ~~gone~~ [link](https://example.com) ![img](x) <https://a.b> www.a.b c@d.ef",
    "$$x^2$$ | a | b |\n|---|---|", "# heading\n> quote\n\n    indented *code*\n\nback\\*slash\\\\", "&lt; &amp; &#42;",
])
def test_shown_text_gives_back_exactly_what_was_typed(text):
    assert typed_text(shown_text(text)) == text


def test_shown_text_round_trips_any_mix_of_markup_characters():
    rng = random.Random(7)
    alphabet = list("ab \n\t\\`*_[]<>&#|~$@-+=.):/w1!(")
    for _ in range(20_000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 16)))
        assert typed_text(shown_text(text)) == text, repr(text)


def test_an_ordinary_sentence_is_stored_unchanged():
    """Only what can start Markdown or HTML is escaped: copying or editing a sentence shows it as typed."""
    for text in ("Tell me a story about a fox and a drum.", "Why? Because, it's 3.5 km (about 2 miles) away!"):
        assert shown_text(text) == text


def test_a_hostile_message_reaches_the_model_as_typed_and_is_shown_as_text(served, client):
    """Regression (QA, defect 1): a message was rendered as HTML (a real <img> that requested /x on every reload,
    real bold). The chat holds it escaped, the model reads it as typed, also from the history the next time (the API
    gives and takes it as typed: test_app_api)."""
    shown = next(gen := ChatPage(served.ctx).chat_browser(HOSTILE, [], "", False, False, "0", ChatSession()))[1]
    gen.close()
    users = [m for m in shown if m["role"] == "user"]
    assert users[0]["content"] == shown_text(HOSTILE) and "<img" not in users[0]["content"].replace("\\<img", "")
    assert served.wait_idle(10)
    out = client.predict(*chat_inputs(HOSTILE, max_new_tokens=4), api_name="/chat")
    assert [content(m) for m in out[1] if m["role"] == "user"] == [HOSTILE]
    assert served.engine.generations[-1]._prompt.startswith(f"user: {HOSTILE}\nassistant:")
    client.predict(*chat_inputs("And another one.", out[1], max_new_tokens=4), api_name="/chat")
    assert f"user: {HOSTILE}\n" in served.engine.generations[-1]._prompt
    assert engine_turns([{"role": "assistant", "content": shown_text("a <b>reply</b>")}])[0]["content"] == \
        "a <b>reply</b>"        # the model's own text goes back to it as it was generated


def test_a_blank_message_sent_twice_leaves_one_note_and_the_next_message_replaces_it(served, client):
    """Regression (QA, defect 7): every empty or blank send added one more identical "⚠ Message not sent…", kept
    across reloads."""
    first = client.predict(*chat_inputs("hello", max_new_tokens=4), api_name="/chat")[1]
    history = first
    for blank in ("", "   ", ""):
        history = client.predict(*chat_inputs(blank, history), api_name="/chat")[1]
    notes = [n for n in last_notes(history) if "Message not sent" in n]
    assert len(notes) == 1 and len(history) == len(first) + 1, last_notes(history)
    after = client.predict(*chat_inputs("hello again", history, max_new_tokens=4), api_name="/chat")[1]
    assert not [n for n in last_notes(after) if "Message not sent" in n], last_notes(after)
    # A page reload brings back the conversation without it (a browser that kept one before).
    assert restore_kept(history, "▍") == restore_kept(first, "▍")
    assert not restore_kept([transient_note("⚠ Message not sent: empty")], "▍")


def test_a_reply_that_used_every_token_says_so_even_untrimmed(served, client):
    """Regression (QA, defect 4): the limit's note came only when the reply could be trimmed to a sentence."""
    out = client.predict(*chat_inputs("Tell me a story", max_new_tokens=6), api_name="/chat")
    notes = last_notes(out[1])
    assert any(n.startswith("ℹ Reached the 6-token limit") for n in notes), notes


def test_kept_settings_come_back_checked_as_typed_ones():
    """Defect 8: what a browser kept is the browser's; a stale or tampered value never applies out of range and
    never raises; the rest of what was kept applies."""
    info = FakeEngine().info()
    defaults = default_settings(info)
    kept = {"policy": "lru", "cache_frac": 0.5, "tau_prefetch": 0.6, "max_new_tokens": 64}
    settings, notes = restored(info, Limits(), defaults, kept)
    assert (settings.policy, settings.cache_frac, settings.tau_prefetch, settings.max_new_tokens, notes) == \
        ("lru", 0.5, 0.6, 64, [])
    assert restored(info, Limits(), defaults, json.loads(settings_json(settings)))[0] == settings
    tampered = {"policy": "turbo", "cache_frac": 7, "tau_prefetch": "0.6", "max_lookahead": [1], "lore_rank": 0,
                "cpu_lane": "yes", "profile": None, "temperature": float("nan"), "max_new_tokens": 10**12,
                "tau_approx": 0.0123, "evil": 1}
    settings, notes = restored(info, Limits(), defaults, tampered)
    assert settings == defaults.__class__(**{**defaults.__dict__, "tau_prefetch": 0.6, "tau_approx": 0.01})
    assert len(notes) == 8 and all(n.startswith("⚠ Not restored:") for n in notes), notes
    for junk in (None, [], "x", 3, {"h": []}):
        assert restored(info, Limits(), defaults, junk) == (defaults, [])


def _sent(text: str) -> list[dict]:
    """A conversation as the chat holds it after ``text`` was sent and answered."""
    return [{"role": "user", "content": shown_text(text)}, {"role": "assistant", "content": shown_text("a *reply*")},
            note("Run 1", "numbers")]


def test_retry_puts_the_message_back_in_the_box_as_typed(served):
    """Regression (defect 1): what goes back to the visitor is the text as typed, never the chat's escaped copy."""
    text, history = ChatPage(served.ctx).prepare_retry(_sent(MARKDOWN), ChatSession())
    assert text == MARKDOWN and history == []


def test_an_edit_is_sent_as_the_visitor_typed_it_backslashes_included(served):
    """The page's edit box holds the message as typed and gives the edit back with every punctuation mark escaped
    (the chat shows it until the server answers): the box gets what the visitor typed, their backslash included."""
    edited = "*new* <b>x</b> and a\\_b"
    escaped = "\\*new\\* \\<b\\>x\\<\\/b\\> and a\\\\\\_b"       # as the page's `escaped` gives it
    edit = gr.EditData(None, {"index": 0, "value": escaped, "previous_value": shown_text(MARKDOWN)})
    text, history = ChatPage(served.ctx).prepare_edit(_sent(MARKDOWN), ChatSession(), edit)
    assert text == edited and history == []


def test_a_markdown_message_reaches_the_model_and_its_runs_label_as_typed(served, client):
    """The model reads the message as typed, so do the run's label (the trace explorer, the exports), and the next
    message carries the model's reply back to it as it was generated."""
    out = client.predict(*chat_inputs(MARKDOWN, max_new_tokens=4), api_name="/chat")
    assert served.engine.generations[-1]._prompt.startswith(f"user: {MARKDOWN}\nassistant:")
    run_id = next(run_of(m) for m in reversed(out[1]) if run_of(m))
    assert served.ctx.runs.label(run_id).startswith("chat: *x* and a_b, \\* [l](u) 2 > 1 & `c` 1. one")
    assert engine_turns([{"role": "user", "content": shown_text(MARKDOWN)}])[0]["content"] == MARKDOWN


def test_a_page_load_brings_back_what_the_browser_kept_and_nothing_from_junk(served):
    """Page load (defect 2's store): the browser hands over JSON text {"h": history, "s": settings}; the kept
    conversation comes back as it was kept, and anything else (the browser's: not JSON, not an object) changes
    nothing and raises nothing."""
    page = ChatPage(served.ctx)
    kept = json.dumps({"h": _sent(MARKDOWN), "s": {"max_new_tokens": 64}})
    out = page.keep.restore(kept, ChatSession())
    assert [typed_text(m["content"]) for m in out[0][:2]] == [MARKDOWN, "a *reply*"]
    assert out[-1] == settings_json(restored(page.info, page.ctx.limits, page.defaults, {"max_new_tokens": 64})[0])
    for junk in ("", "{", "[]", "3", json.dumps({"h": "x", "s": [1]}), None):
        out = page.keep.restore(junk, ChatSession())
        assert all(isinstance(o, type(gr.skip())) for o in out), (junk, out)
    assert CURSOR.strip() == page.keep.cursor
