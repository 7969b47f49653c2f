"""Two tabs of one browser keep a conversation each (regression: the browser kept one conversation for all its tabs,
the last to write winning, so a reload of one tab brought back the other's and its own was gone)."""
from __future__ import annotations

import pytest

from chat_browser import ask_and_keep, open_chat, reload_chat
from page_js import text_js

pytestmark = pytest.mark.browser
ASK_A, ASK_B = "Tell me about the red kite.", "Tell me about the blue boat."


def _chat(page) -> str:
    return page.evaluate("() => " + text_js("#spice-chat"))


def test_each_tab_gets_its_own_conversation_back_after_a_reload(browser, served):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})     # one browser: one storage
    context.set_default_timeout(30_000)
    try:
        a, b = context.new_page(), context.new_page()
        open_chat(a, served.url)
        ask_and_keep(a, ASK_A)
        open_chat(b, served.url)             # a new tab starts from the newest kept conversation: A's
        b.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        b.click("#spice-new")
        b.wait_for_function(f"() => !{text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        ask_and_keep(b, ASK_B)

        reload_chat(a, ASK_A)
        assert ASK_B not in _chat(a), "tab A came back with tab B's conversation"
        reload_chat(b, ASK_B)
        assert ASK_A not in _chat(b), "tab B came back with tab A's conversation"
        # A tab opened now starts from the newest kept conversation, B's (the one written last).
        c = context.new_page()
        open_chat(c, served.url)
        c.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_B!r})", timeout=20_000, polling=100)
    finally:
        context.close()
