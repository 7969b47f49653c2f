"""Tabs of one browser keep a conversation each (assets/static/spice_keep.js), in a real browser on the fake engine.

Regressions: the browser kept one conversation for all its tabs, the last to write winning, so a reload of one tab
brought back the other's and its own was gone; then one value held every tab's entry, and each tab wrote back the
others' entries as they were when its page loaded, so two tabs open together dropped each other's (and a tab
duplicated by the browser, which copies its id, wrote the same entry); and a prune kept only the 8 newest entries,
another live tab's among those it dropped. Waits are for the page's own marks, never for a fixed time."""
from __future__ import annotations

import json

import pytest

from chat_browser import ask_and_keep, open_chat, reload_chat
from page_js import text_js

pytestmark = pytest.mark.browser
ASK_A, ASK_B = "Tell me about the red kite.", "Tell me about the blue boat."
DAY_MS = 24 * 3600 * 1000
# A duplicated tab: the browser copies the tab's sessionStorage, its id in the chat's store with it.
TWIN_JS = "if (!sessionStorage.getItem('spice-tab')) sessionStorage.setItem('spice-tab', 'twin');"


def _chat(page) -> str:
    return page.evaluate("() => " + text_js("#spice-chat"))


def _context(browser, init_js: str = ""):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})     # one browser: one storage
    context.set_default_timeout(30_000)
    if init_js:
        context.add_init_script(init_js)
    return context


def _start_afresh(page, gone: str) -> None:
    page.click("#spice-new")
    page.wait_for_function(f"() => !{text_js('#spice-chat')}.includes({gone!r})", timeout=20_000, polling=100)


def _each_gets_its_own_back(a, b) -> None:
    reload_chat(a, ASK_A)
    assert ASK_B not in _chat(a), "tab A came back with tab B's conversation"
    reload_chat(b, ASK_B)
    assert ASK_A not in _chat(b), "tab B came back with tab A's conversation"


def test_each_tab_gets_its_own_conversation_back_after_a_reload(browser, served):
    context = _context(browser)
    try:
        a, b = context.new_page(), context.new_page()
        open_chat(a, served.url)
        ask_and_keep(a, ASK_A)
        open_chat(b, served.url)             # a new tab starts from the newest kept conversation: A's
        b.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        _start_afresh(b, ASK_A)
        ask_and_keep(b, ASK_B)
        _each_gets_its_own_back(a, b)
        # A tab opened now starts from the newest kept conversation, B's (the one written last).
        c = context.new_page()
        open_chat(c, served.url)
        c.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_B!r})", timeout=20_000, polling=100)
    finally:
        context.close()


def test_two_tabs_open_together_keep_each_ones_conversation(browser, served):
    """Both pages load before either keeps anything; then each keeps its own (B's keep used to write back the
    store as B's page had read it, empty, and A's conversation was gone)."""
    context = _context(browser)
    try:
        a, b = context.new_page(), context.new_page()
        open_chat(a, served.url)
        open_chat(b, served.url)
        ask_and_keep(a, ASK_A)
        ask_and_keep(b, ASK_B)
        ask_and_keep(a, "And then?")        # A writes again after B: B's entry stays
        _each_gets_its_own_back(a, b)
        assert "And then?" in _chat(a)
    finally:
        context.close()


def test_a_duplicated_tab_takes_an_id_of_its_own(browser, served):
    """A duplicate starts with its original's conversation (a copy of the tab), then keeps its own apart."""
    context = _context(browser, TWIN_JS)
    try:
        a = context.new_page()
        open_chat(a, served.url)
        ask_and_keep(a, ASK_A)
        b = context.new_page()
        open_chat(b, served.url)
        b.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        b.wait_for_function("() => (document.body.dataset.spiceTab || 'twin') !== 'twin'", polling=50)
        assert a.evaluate("() => document.body.dataset.spiceTab") == "twin"      # the original keeps its id
        _start_afresh(b, ASK_A)
        ask_and_keep(b, ASK_B)
        _each_gets_its_own_back(a, b)
    finally:
        context.close()


def test_a_page_load_prunes_only_entries_nobody_wrote_for_a_month(browser, served):
    """Nine other tabs' entries written a day ago stay (the prune kept 8 at most, live or not); one written 31
    days ago, an unreadable one and the value of before (`spice-chat-v1`) go."""
    context = _context(browser)
    try:
        page = context.new_page()
        open_chat(page, served.url)
        ask_and_keep(page, ASK_A)
        page.evaluate("""([day]) => {
          const now = Date.now(), entry = (t) => JSON.stringify({h: [], s: null, t});
          for (let i = 0; i < 9; i++) localStorage.setItem(`spice-chat-v2:recent${i}`, entry(now - day));
          localStorage.setItem('spice-chat-v2:old', entry(now - 31 * day));
          localStorage.setItem('spice-chat-v2:unreadable', '{');
          localStorage.setItem('spice-chat-v1', 'encrypted');
        }""", [DAY_MS])
        reload_chat(page, ASK_A)            # this tab's own entry, though older than the others', comes back
        keys = page.evaluate("() => Object.keys(localStorage).filter((k) => k.startsWith('spice-chat')).sort()")
        own = "spice-chat-v2:" + page.evaluate("() => sessionStorage.getItem('spice-tab')")
        assert keys == sorted([own, *(f"spice-chat-v2:recent{i}" for i in range(9))]), keys
        kept = json.loads(page.evaluate(f"() => localStorage.getItem({own!r})"))
        assert any(ASK_A in json.dumps(m) for m in kept["h"]) and kept["s"] is not None
    finally:
        context.close()
