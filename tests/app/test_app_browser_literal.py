"""The chat shows what the visitor typed as text, in a real browser (the fake engine): no HTML of theirs is drawn or
loaded, now or after a reload; and a note about a message not sent does not pile up nor outlive a reload.

Waits are for the page's own marks (a reply's end, the browser's keep), never for a fixed time."""
from __future__ import annotations

import pytest

from chat_browser import ask_and_keep, open_chat, reload_chat
from page_js import text_js

pytestmark = pytest.mark.browser

HOSTILE = "<img src=x onerror=alert(1)> <b>bold</b> a<b story about a cat."
KEEPS_JS = "() => +(document.body.dataset.spiceKeeps || 0)"
# Counts the ends of the chat's events (Send comes back: pages.chat_js BUSY_OFF_JS), however short they were.
COUNT_ENDS_JS = """() => {
  window.spiceEnds = 0;
  new MutationObserver((records) => {
    for (const r of records) if (r.oldValue && r.oldValue.includes('spice-generating')
        && !document.body.classList.contains('spice-generating')) window.spiceEnds++;
  }).observe(document.body, {attributes: true, attributeFilter: ['class'], attributeOldValue: true});
}"""


def _literal_on_screen(page) -> None:
    user = page.locator("#spice-chat .message.user").first
    assert user.inner_text().strip() == HOSTILE, user.inner_text()
    assert page.locator("#spice-chat .message img").count() == 0, page.inner_html("#spice-chat")[:2000]
    assert page.locator("#spice-chat .message.user b, #spice-chat .message.user strong").count() == 0


def test_a_message_with_html_is_shown_as_typed_and_loads_nothing(browser, served):
    """Regression (QA, defect 1): the message drew a real <img> (the browser asked for /x at every reload; any
    https:// source would load from outside) and real bold. The model still gets exactly what was typed."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    asked = []
    page.on("request", lambda r: asked.append(r.url))
    open_chat(page, served.url)
    ask_and_keep(page, HOSTILE)
    _literal_on_screen(page)
    assert served.engine.generations[-1]._prompt.startswith(f"user: {HOSTILE}\nassistant:")
    reload_chat(page, "bold</b> a<b story")
    _literal_on_screen(page)
    assert not [u for u in asked if u.rstrip("/").endswith("/x")], [u for u in asked if "/x" in u]
    context.close()


def test_a_blank_message_leaves_one_note_that_a_reload_does_not_bring_back(browser, served):
    """Regression (QA, defect 7): sending an empty or blank message twice added two identical "⚠ Message not
    sent…" notes to the conversation, and a reload brought them back."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    open_chat(page, served.url)
    ask_and_keep(page, "Tell me a story about a cat and a ball.")
    page.evaluate(COUNT_ENDS_JS)
    chat = text_js("#spice-chat")
    for n, blank in enumerate(("", "   "), start=1):
        keeps = page.evaluate(KEEPS_JS)
        page.fill("#spice-msg textarea", blank)
        page.press("#spice-msg textarea", "Enter")
        page.wait_for_function(f"() => window.spiceEnds >= {n}", timeout=20_000, polling=50)
        page.wait_for_function(f"() => ({KEEPS_JS})() > {keeps}", timeout=20_000, polling=50)   # kept since
        said = page.evaluate(f"() => {chat}")
        assert said.count("Message not sent") == 1, said
    reload_chat(page, "Tell me a story about a cat and a ball.")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('Run ')", timeout=20_000, polling=100)
    assert "Message not sent" not in page.evaluate(f"() => {chat}")
    context.close()
