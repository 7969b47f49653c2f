"""Two tabs of one browser keep a conversation each (regression: the browser kept one conversation for all its tabs,
the last to write winning, so a reload of one tab brought back the other's and its own was gone)."""
from __future__ import annotations

import pytest

from page_js import text_js

pytestmark = pytest.mark.browser
ASK_A, ASK_B = "Tell me about the red kite.", "Tell me about the blue boat."


def _chat(page) -> str:
    return page.evaluate("() => " + text_js("#spice-chat"))


def _open(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")


def _ask(page, text: str) -> None:
    """Send ``text`` and wait until its reply has ended and the browser has kept the conversation."""
    page.fill("#spice-msg textarea", text)
    page.press("#spice-msg textarea", "Enter")
    page.wait_for_function("() => document.body.classList.contains('spice-generating')", timeout=20_000, polling=50)
    page.wait_for_function("() => !document.body.classList.contains('spice-generating')", timeout=60_000,
                           polling=100)
    page.wait_for_timeout(500)           # the keep follows the reply's end


def _restored(page, text: str) -> None:
    page.reload(wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes({text!r})", timeout=20_000, polling=100)


def test_each_tab_gets_its_own_conversation_back_after_a_reload(browser, served):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})     # one browser: one storage
    context.set_default_timeout(30_000)
    try:
        a, b = context.new_page(), context.new_page()
        _open(a, served.url)
        _ask(a, ASK_A)
        _open(b, served.url)             # a new tab starts from the newest kept conversation: A's
        b.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        b.click("#spice-new")
        b.wait_for_function(f"() => !{text_js('#spice-chat')}.includes({ASK_A!r})", timeout=20_000, polling=100)
        _ask(b, ASK_B)

        _restored(a, ASK_A)
        assert ASK_B not in _chat(a), "tab A came back with tab B's conversation"
        _restored(b, ASK_B)
        assert ASK_A not in _chat(b), "tab B came back with tab A's conversation"
        # A tab opened now starts from the newest kept conversation, B's (the one written last).
        c = context.new_page()
        _open(c, served.url)
        c.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK_B!r})", timeout=20_000, polling=100)
    finally:
        context.close()
