"""The conversation outlives a reload and a visit to another page, in a real browser on the real engine.

The page keeps the chat in the browser's storage as it changes (and an empty one after New chat); a reload,
or About and back, must show it again, and the next message must carry it to the model. A reload mid-reply
keeps the message and the reply so far, with a note that it ended there, and the reply's panels and numbers.
"""
from __future__ import annotations

import time

import pytest

from chat_browser import KEPT_RUNS_JS
from page_js import text_js

pytestmark = pytest.mark.browser

ASK = "Tell me a story about a fox."


def _chat(page) -> str:
    return page.evaluate("() => " + text_js("#spice-chat"))


def _replies(page) -> list[str]:
    """The model's replies on screen (the app's own notes, and Gradio's "Loading content" dots while an event
    that updates the chat is pending, left out)."""
    return page.evaluate("""() => [...document.querySelectorAll('#spice-chat .message.bot:not(.pending)')]
        .map(m => m.innerText.trim()).filter(t => t && !t.startsWith('Run ') && !/^[ℹ⚠■]/.test(t))""")


def _wait_for(page, condition_js: str, timeout_s: float = 60.0) -> None:
    page.wait_for_function(condition_js, timeout=timeout_s * 1000, polling=100)


def _open(page, url: str) -> None:
    page.goto(url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")


def _cap(page, max_new_tokens: int) -> None:
    """Replies capped at ``max_new_tokens``, set on the page ("Timing model and generation" is folded when the
    page loads; the settings are the page's own: a reload starts from the defaults again)."""
    page.get_by_text("Timing model and generation").click()
    page.fill("#ctl-max-new input[type=number]", str(max_new_tokens))
    page.press("#ctl-max-new input[type=number]", "Tab")


def _new_page(browser, url: str, max_new_tokens: int):
    """A fresh browser context on the chat page, replies capped at ``max_new_tokens``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(60_000)
    page = context.new_page()
    _open(page, url)
    _cap(page, max_new_tokens)
    return context, page


def _send(page, text: str, runs_before: int) -> None:
    page.fill("#spice-msg textarea", text)
    page.press("#spice-msg textarea", "Enter")
    _wait_for(page, f"() => ({text_js('#spice-chat')}.match(/Run \\S+ ·/g) || []).length"
                    f" > {runs_before}", 120)


def test_the_conversation_survives_a_reload_and_another_page(browser, shipped_served):
    context, page = _new_page(browser, shipped_served.url, max_new_tokens=16)
    _send(page, ASK, 0)
    reply = _replies(page)
    assert len(reply) == 1, _chat(page)
    time.sleep(0.5)                 # the save follows the reply's last update

    for where in ("reload", "about and back"):
        if where == "reload":
            page.reload(wait_until="load")
        else:
            page.goto(shipped_served.url + "about", wait_until="load")
            page.get_by_text("What SPICE does").wait_for()
            page.goto(shipped_served.url, wait_until="load")
        page.locator("#spice-msg textarea").wait_for(state="visible")
        try:
            _wait_for(page, f"() => {text_js('#spice-chat')}.includes({ASK!r})", 20)
        except Exception:  # noqa: BLE001 - the assertion below says what was on screen
            pass
        assert ASK in _chat(page), f"after {where}, the chat lost the conversation: {_chat(page)[:300]!r}"
        assert _replies(page) == reply, f"after {where}: {_replies(page)} != {reply}"

    # The restored conversation is what the next message carries: the chat the server sends back is built
    # from the history the browser sent, so both exchanges on screen mean the first one reached the model.
    _cap(page, 16)
    _send(page, "And then?", 1)
    text = _chat(page)
    assert text.index(ASK) < text.index("And then?"), text[:400]
    assert len(_replies(page)) == 2, text[:600]

    # New chat empties what the browser keeps too.
    assert page.evaluate(KEPT_RUNS_JS) > 0, "the kept conversation holds no run note before New chat"
    page.click("#spice-new")
    _wait_for(page, f"() => !{text_js('#spice-chat')}.includes({ASK!r})", 20)
    _wait_for(page, f"() => ({KEPT_RUNS_JS})() === 0", 20)      # the empty conversation is kept
    page.reload(wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    page.wait_for_timeout(2000)              # restore runs on load: give it the time it took above
    assert ASK not in _chat(page), "New chat's empty conversation was not kept: a reload brought the old one back"
    context.close()


def test_a_reload_mid_reply_keeps_the_message_and_the_reply_so_far(browser, shipped_served):
    context, page = _new_page(browser, shipped_served.url, max_new_tokens=512)
    ask = "1, 2, 3, 4, 5, 6, 7, 8,"            # the shipped model counts on for hundreds of tokens
    page.fill("#spice-msg textarea", ask)
    page.press("#spice-msg textarea", "Enter")
    _wait_for(page, "() => { const b = document.querySelectorAll('#spice-chat .message.bot:not(.pending)');"
                    " return b.length && b[b.length - 1].innerText.replace('▍', '').trim().length > 12; }", 120)
    page.reload(wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    _wait_for(page, f"() => {text_js('#spice-chat')}.includes('ended when the page was left')",
              30)
    text = _chat(page)
    assert ask in text and "▍" not in text, text[:400]
    reply = _replies(page)
    assert len(reply) == 1 and len(reply[0]) > 12, (reply, text[:400])
    # Its panels and numbers come back too, for the tokens its run generated before the engine let it go.
    _wait_for(page, f"() => {text_js('#spice-stats')}.includes('TPOT')", 30)
    _wait_for(page, "() => ((document.querySelector('#spice-heatmap .js-plotly-plot') || {}).data || []).length > 0", 30)
    # The engine let go of the reply nobody reads, and the restored conversation goes on.
    assert shipped_served.ctx.runner.wait_idle(30)
    _cap(page, 16)
    _send(page, "Go on.", 0)
    assert len(_replies(page)) == 2, _chat(page)[:600]
    context.close()
