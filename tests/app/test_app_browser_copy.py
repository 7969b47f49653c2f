"""What the chat gives back as text is what was typed, in a real browser (the fake engine). Regression (defect 1): the
chat holds the visitor's text escaped so that it shows literally (`*x*` as `*x*`, not in italics), and its copy
button, its edit box and each message's aria-label gave that stored text, backslashes and all. A reply's copy gives
the reply alone, not the app's notes beside it in its bubble.

The page's script (assets/static/spice_chat_text.js) gives them the text as typed through its own `typed`, the twin
of pages.messages.typed_text, and hands an edit back to Gradio escaped again (`escaped`), so that the chat never
draws the visitor's markup: the last test checks both against the server's. Waits are for the page's own marks,
never for a fixed time."""
from __future__ import annotations

import random

import pytest

import fake_engine
from chat_browser import ask_and_keep, open_chat
from page_js import value_js
from pages.messages import shown_text, typed_text

pytestmark = pytest.mark.browser

# Markdown and HTML a visitor may well type, a backslash of their own among it.
TEXT = "*x* <b>y</b> a_b \\* [l](u) 2 > 1 & www.example.com\n1. `c`\n\n    code *as is*"
EDIT_BOX = "#spice-chat textarea.edit-textarea"
# Polled: reads the clipboard (a promise, which a wait's predicate cannot await) and says whether the last read found
# text in it.
CLIPBOARD_JS = """() => {
  navigator.clipboard.readText().then((t) => { window.spiceClipboard = t; });
  return !!window.spiceClipboard;
}"""
# Without the Clipboard API (a page served over plain http from another host), Gradio copies through a selected
# textarea and execCommand("copy"): what that copy put on the clipboard, as the page's last `copy` listener sees it.
NO_CLIPBOARD_JS = """delete Navigator.prototype.clipboard;
window.addEventListener('copy', (e) => { window.spiceCopied = e.clipboardData.getData('text/plain'); });"""
# Records whether any markup of the visitor's was ever drawn in their messages (Gradio puts an edit into the chat
# itself until the server answers, for a moment that no wait could catch).
DRAWN_JS = """new MutationObserver(() => {
  const drawn = '#spice-chat [data-testid="user"] :is(b, strong, em, a, img, :not(pre) > code)';
  if (document.querySelector(drawn)) window.spiceDrawn = true;
}).observe(document, {childList: true, subtree: true});"""


def _page(browser, served, init_js: str = ""):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.url.rstrip("/"))
    if init_js:
        context.add_init_script(init_js)
    page = context.new_page()
    open_chat(page, served.url)
    ask_and_keep(page, TEXT)
    return context, page


def _user_message(page):
    return page.locator('#spice-chat [data-testid="user"]').first


def test_copy_gives_the_message_as_typed_and_so_does_its_label(browser, served):
    context, page = _page(browser, served)
    try:
        page.evaluate("() => navigator.clipboard.writeText('')")
        page.locator("#spice-chat").get_by_role("button", name="Copy message").first.click()   # the user's, first
        page.wait_for_function(CLIPBOARD_JS, polling=50)
        assert page.evaluate("() => window.spiceClipboard") == TEXT
        assert _user_message(page).get_attribute("aria-label") == "user's message: " + TEXT
        assert _user_message(page).locator("b, strong, em, a").count() == 0       # still shown literally
    finally:
        context.close()


def test_copy_without_the_clipboard_api_gives_the_message_as_typed(browser, served):
    context, page = _page(browser, served, NO_CLIPBOARD_JS)
    try:
        page.locator("#spice-chat").get_by_role("button", name="Copy message").first.click()   # the user's, first
        page.wait_for_function("() => window.spiceCopied !== undefined", polling=50)
        assert page.evaluate("() => window.spiceCopied") == TEXT
    finally:
        context.close()


@pytest.mark.parametrize("init_js, copied_js", [("", None), (NO_CLIPBOARD_JS, "() => window.spiceCopied")],
                         ids=["clipboard-api", "no-clipboard-api"])
def test_copy_of_a_reply_gives_the_reply_as_generated_without_the_apps_notes(browser, served, monkeypatch, init_js,
                                                                            copied_js):
    """Regression: a reply's copy button copied its whole bubble, the app's notes in it too (the run note with its
    numbers and link; a note about the message before the reply). It gives the reply alone, as generated (here with
    markup of its own, which the chat holds escaped). And the reply's aria-label is the reply as generated: a note
    first in its bubble made the page take the note for the message and the reply for a note."""
    monkeypatch.setattr(fake_engine, "WORDS", fake_engine.WORDS + ("*tea*", "<b>cat</b>", "a_b", "[x](y)"))
    monkeypatch.setattr(served.engine, "eos_after", 30)      # the reply ends by itself: no note that trims it
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=served.url.rstrip("/"))
    if init_js:
        context.add_init_script(init_js)
    try:
        page = context.new_page()
        open_chat(page, served.url)
        ask_and_keep(page, "Tell me a story\x07")        # a control character: a note before the reply says so
        reply = served.engine.get_summary(served.engine.generations[-1].run_id).text
        assert any(mark in reply for mark in "*<_["), f"the reply must hold markup to test this: {reply}"
        bubble = page.locator("#spice-chat .bot-row").last
        assert bubble.locator(".thought-group").count() == 2, "the note about the message and the run note"
        labels = [el.get_attribute("aria-label") for el in bubble.locator('[data-testid="bot"]').all()]
        assert f"bot's message: {reply}" in labels, labels
        if copied_js is None:
            page.evaluate("() => navigator.clipboard.writeText('')")
        page.locator("#spice-chat").get_by_role("button", name="Copy message").last.click()      # the reply's
        if copied_js is None:
            page.wait_for_function(CLIPBOARD_JS, polling=50)
            copied_js = "() => window.spiceClipboard"
        else:
            page.wait_for_function("() => window.spiceCopied !== undefined", polling=50)
        assert page.evaluate(copied_js) == reply
    finally:
        context.close()


def test_an_edit_starts_from_the_message_as_typed_and_sends_what_was_typed(browser, served):
    context, page = _page(browser, served, DRAWN_JS)
    try:
        page.locator("#spice-chat").get_by_role("button", name="Edit").first.click()
        page.wait_for_function(f"() => {value_js(EDIT_BOX)} === {TEXT!r}", polling=50)
        edited = TEXT + " and \\_ more"         # a backslash the visitor types stays theirs
        page.fill(EDIT_BOX, edited)
        runs = len(served.engine.generations)
        page.locator("#spice-chat").get_by_role("button", name="Submit").click()
        page.wait_for_function("() => document.body.classList.contains('spice-generating')", polling=50)
        page.wait_for_function("() => !document.body.classList.contains('spice-generating')", polling=100)
        assert len(served.engine.generations) > runs
        assert served.engine.generations[-1]._prompt.startswith(f"user: {edited}\nassistant:")
        assert _user_message(page).inner_text().strip().startswith("*x* <b>y</b> a_b \\* [l](u)")
        assert not page.evaluate("() => window.spiceDrawn"), "the chat drew the edit's markup"
    finally:
        context.close()


def test_the_pages_typed_text_is_the_servers(browser, served):
    """The page's `typed` and pages.messages.typed_text give the same text for any stored text: the chat's own
    (escaped by shown_text) and whatever else a history may hold (an API client's), tabs, carriage returns and
    Unicode white space in the indentation included; and typed_text gives back exactly what the page's `escaped`
    (an edit handed back) was given."""
    context = browser.new_context()
    try:
        page = context.new_page()
        open_chat(page, served.url)
        page.wait_for_function("() => typeof window.spiceTyped === 'function'", polling=50)
        rng = random.Random(11)
        alphabet = list("ab \n\t\r\\`*_[]<>&#|~$@-+=.):/w1!(\u3000\u00a0\ufeff\x1c\x85é😀")
        texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24))) for _ in range(3000)]
        stored = [shown_text(t) for t in texts] + texts + [TEXT, shown_text(TEXT), "\t  \\*", "\r    \\*", "\u3000" * 4]
        got = page.evaluate("(xs) => xs.map(window.spiceTyped)", stored)
        wrong = [(s, g, typed_text(s)) for s, g in zip(stored, got) if g != typed_text(s)]
        assert not wrong, wrong[:5]
        edits = page.evaluate("(xs) => xs.map(window.spiceEscaped)", texts)
        wrong = [(t, e) for t, e in zip(texts, edits) if typed_text(e) != t]
        assert not wrong, wrong[:5]
    finally:
        context.close()
