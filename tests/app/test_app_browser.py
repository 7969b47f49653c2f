"""The app in a real browser (Debian's chromium through Playwright), used the way a person would.

Two flows:
- with the fake engine (long, steady replies, so every mid-reply action has time to land): send a
  message and watch it stream, move a slider mid-reply and see the numbers panel say it applied,
  send a second message mid-reply (a note; the text stays in the box), stop the reply, send an
  empty message, close a tab mid-reply while a new tab's message waits for the engine (what is typed
  into its box meanwhile stays when its reply starts);
- with the shipped model (``assets/spice-mini/``; the fake when it is absent): a long reply with the
  window resized while its panels update, Stop, New chat, a story, then every page: the trace explorer
  with its Chrome-trace download, a small sweep (its shape menu read whole on a desktop and a phone),
  About. This flow saves a screenshot of every page into a temporary folder, or into
  ``SPICE_SCREENSHOTS_DIR``: ``python scripts/screenshots.py`` refreshes the committed
  ``docs/screenshots/`` that way.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from app_helpers import serve, serve_shipped
from fake_engine import FakeEngine

pytestmark = pytest.mark.browser


def _context(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
    context.set_default_timeout(60_000)           # generous: CI machines may be busy
    return context


@pytest.fixture
def fake_app():
    served = serve(FakeEngine(token_delay_s=0.2), orphan_after_s=1.5)   # 512 tokens: 100 s; stopped early
    yield served
    served.demo.close()
    served.ctx.exports.cleanup()


@pytest.fixture
def shipped_app(tmp_path):
    served = serve_shipped()
    shots = Path(os.environ.get("SPICE_SCREENSHOTS_DIR") or tmp_path)     # scripts/screenshots.py sets it
    shots.mkdir(parents=True, exist_ok=True)
    yield served, shots
    served.demo.close()
    served.ctx.exports.cleanup()


# The numbers row's values that do not fit their card on one line: [text, lines, overflow px].
_BROKEN_STAT_VALUES_JS = """() => [...document.querySelectorAll('#spice-stats .card .v')].map(v => {
  const lh = parseFloat(getComputedStyle(v).lineHeight) || v.getBoundingClientRect().height;
  return [v.innerText, Math.round(v.getBoundingClientRect().height / lh), v.scrollWidth - v.clientWidth];
}).filter(([_, lines, over]) => lines > 1 || over > 1)"""

# Words of the trace table's headers drawn over two lines (a Range over one word gives one rectangle per line).
_WORDS_SPLIT_IN_HEADERS_JS = r"""() => {
  const out = [];
  for (const th of document.querySelectorAll('#trace-table th')) {
    const walker = document.createTreeWalker(th, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      const re = /\S+/g; let m;
      while ((m = re.exec(node.textContent))) {
        const r = document.createRange(); r.setStart(node, m.index); r.setEnd(node, m.index + m[0].length);
        const tops = new Set([...r.getClientRects()].filter(b => b.width > 0).map(b => Math.round(b.top)));
        if (tops.size > 1) out.push(m[0]);
      }
    }
  }
  return out;
}"""


# Which of the sweep's buttons shows ("run" / "stop"), recorded at each change of the page's classes.
_RECORD_SWEEP_BUTTONS_JS = """() => {
  window.spiceSweepButtons = [];
  const seen = () => ['run', 'stop'].filter(b => {
    const el = document.querySelector('#sweep-' + b); return el && el.offsetParent !== null; }).join('+');
  new MutationObserver(() => window.spiceSweepButtons.push(seen()))
    .observe(document.body, {attributes: true, attributeFilter: ['class']});
}"""


def _wait(predicate, timeout_s=10.0, interval_s=0.05):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def _type(page, selector: str, text: str, then: str = "") -> None:
    """Focus, replace the text and press ``then``, through the keyboard.

    While a reply streams, the page redraws its charts twice a second; on a busy machine Playwright's
    actionability checks (which wait for quiet animation frames) then take many seconds, so the
    streaming steps type the way a person does instead of using ``fill()``.
    """
    page.evaluate("s => document.querySelector(s).focus()", selector)
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(text)
    if then:
        page.keyboard.press(then)


def _click(page, selector: str) -> None:
    page.evaluate("s => document.querySelector(s).click()", selector)


def _send(page, text: str) -> None:
    _type(page, "#spice-msg textarea", text, "Enter")


# Records the first reply's text length each time the chat changes (into window.spiceReplyLengths).
_RECORD_REPLY_LENGTHS_JS = """() => {
  window.spiceReplyLengths = [];
  const chat = document.querySelector('#spice-chat');
  new MutationObserver(() => {
    const row = chat.querySelector('.bot-row');
    if (row) window.spiceReplyLengths.push(row.innerText.length);
  }).observe(chat, {subtree: true, childList: true, characterData: true});
}"""


# Every 100 ms, the drawn height of each live panel once its reply's figure is up (into window.spicePanelHeights;
# a second call starts the record afresh).
_RECORD_PANEL_HEIGHTS_JS = """() => {
  window.spicePanelHeights = {};
  window.spiceRecording = window.spiceRecording || setInterval(() => {
    for (const name of ['gantt', 'prefetch', 'heatmap']) {
      const gd = document.querySelector(`#spice-${name} .js-plotly-plot`);
      if (!gd || !gd.layout || !gd.layout.meta) continue;      // the placeholder, before the reply's figure
      (window.spicePanelHeights[name] = window.spicePanelHeights[name] || [])
        .push(Math.round(gd.getBoundingClientRect().height));
    }
  }, 100);
}"""


# The drawn height of each panel's placeholder (null where a reply's figure is up, or nothing is drawn yet).
_PLACEHOLDER_HEIGHTS_JS = """() => Object.fromEntries(['gantt', 'prefetch', 'heatmap'].map(name => {
  const gd = document.querySelector(`#spice-${name} .js-plotly-plot`);
  return [name, gd && !(gd.layout && gd.layout.meta) ? Math.round(gd.getBoundingClientRect().height) : null];
}))"""

# Whether every panel was updated in place (assets/static/spice_live.js) after the page's clock read `t` ms.
_UPDATED_SINCE_JS = """(t) => ['gantt', 'prefetch', 'heatmap'].every(name => {
  const panel = ((window.__spiceLive || {}).panels || {})[name];
  return !!panel && panel.lastEnd > t;
})"""

# Whether a dropdown's whole label is in sight: it neither scrolls in its box nor runs under the menu's arrow.
_LABEL_IN_SIGHT_JS = """(selector) => {
  const input = document.querySelector(`${selector} input`), arrow = document.querySelector(`${selector} .icon-wrap`);
  const style = getComputedStyle(input), box = input.getBoundingClientRect();
  const pen = document.createElement('canvas').getContext('2d');
  pen.font = style.font;
  const room = (arrow ? arrow.getBoundingClientRect().left : box.right) - box.left - parseFloat(style.paddingLeft);
  const width = pen.measureText(input.value).width;
  return {label: input.value, width: Math.ceil(width), room: Math.floor(room),
          whole: input.scrollWidth <= input.clientWidth && width <= room};
}"""


def _chat_text(page) -> str:
    return page.locator("#spice-chat").inner_text()


def _assert_panels_stayed_drawn(page, when: str, samples: int = 5) -> None:
    heights = page.evaluate("() => window.spicePanelHeights")
    for name in ("gantt", "prefetch", "heatmap"):
        seen = heights.get(name, [])
        assert len(seen) > samples and min(seen) > 100, f"the {name} panel collapsed {when}: {seen[-40:]}"


def _assert_label_in_sight(page, selector: str) -> None:
    shown = page.evaluate(_LABEL_IN_SIGHT_JS, selector)
    assert shown["whole"], f"{selector} cuts its label off at {page.viewport_size['width']} px: {shown}"


def test_a_person_chats_tunes_stops_and_recovers(browser, fake_app):
    served = fake_app
    context = _context(browser)
    page = context.new_page()
    page.goto(served.url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible", timeout=60_000)     # a hang fails, a slow machine not
    assert "Timing:" in page.locator("#spice-banner").inner_text()

    # 1. ask for a long reply, type a message and watch it stream
    page.get_by_text("Timing model and generation").click()
    page.locator("#ctl-max-new input[type=number]").wait_for(state="visible")
    _type(page, "#ctl-max-new input[type=number]", "512", "Tab")   # the most it allows; stopped below
    page.evaluate(_RECORD_PANEL_HEIGHTS_JS)
    _send(page, "Tell me a story about a lighthouse keeper.")
    bot = page.locator("#spice-chat .bot-row").first
    bot.wait_for(state="visible", timeout=60_000)
    lengths = []
    assert _wait(lambda: lengths.append(len(bot.inner_text())) or len({n for n in lengths if n > 2}) >= 3, 15), \
        f"the reply did not stream: {lengths[-5:]}"

    # 2. move a slider mid-reply: the settings note, then the numbers panel, say it applied
    _type(page, "#ctl-tau-prefetch input[type=number]", "0.85", "Tab")   # the slider takes its box on blur
    note = page.locator("#spice-settings-note")
    assert _wait(lambda: "sent to the running reply" in note.inner_text(), 90), note.inner_text()
    stats = page.locator("#spice-stats")
    assert _wait(lambda: "changed tau_prefetch" in stats.inner_text(), 90), stats.inner_text()
    assert page.locator("#spice-heatmap .js-plotly-plot").count() > 0
    assert page.locator("#spice-gantt .js-plotly-plot").count() > 0

    # 2b. the window is resized mid-reply: the panels keep updating and stay drawn (a resize used to clear
    # their height, and the next update collapsed them to 0 px)
    page.set_viewport_size({"width": 1180, "height": 1000})
    page.wait_for_timeout(2500)
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.wait_for_timeout(2500)
    heights = page.evaluate("() => window.spicePanelHeights")
    for name in ("gantt", "prefetch", "heatmap"):
        seen = heights.get(name, [])
        assert len(seen) > 20 and min(seen[-40:]) > 100, f"the {name} panel collapsed after a resize: {seen[-40:]}"

    # 3. a second message while the reply streams: a note, and the text stays in the box
    box = page.locator("#spice-msg textarea")
    assert _wait(lambda: box.input_value() == "", 60), "the sent message never left the box"
    _send(page, "wait for me")
    assert _wait(lambda: "Still answering your previous message" in _chat_text(page), 60)
    assert box.input_value() == "wait for me"

    # 4. Stop ends the reply between tokens
    _click(page, "#spice-stop")
    assert _wait(lambda: "Stopped after" in _chat_text(page), 60), _chat_text(page)[-300:]
    assert "Settings changed during this reply" in _chat_text(page)
    # Stop's "Stopping after the current token…" goes once the reply has ended (it stayed for good)
    assert _wait(lambda: "Stopping" not in page.inner_text("#spice-settings-note"), 30), \
        page.inner_text("#spice-settings-note")
    page.wait_for_timeout(500)
    assert box.input_value() == "wait for me", "the end of a reply must not wipe what was typed meanwhile"

    # 5. an empty message gets a note, nothing is sent
    _send(page, "   ")
    assert _wait(lambda: "Message not sent" in _chat_text(page), 60)

    # 6. a tab closed mid-reply frees the engine: a message waiting in a new tab starts at once, and what was typed
    # into its box while it waited stays (the reply's first update used to empty the box, typing and all)
    other = context.new_page()
    other.goto(served.url, wait_until="load")
    other.locator("#spice-msg textarea").wait_for(state="visible")
    _send(other, "A very long answer, please.")
    other.locator("#spice-chat .bot-row").first.wait_for(state="visible", timeout=60_000)
    fresh = context.new_page()
    fresh.goto(served.url, wait_until="load")
    fresh.locator("#spice-msg textarea").wait_for(state="visible")
    fresh.get_by_text("Timing model and generation").click()
    fresh.locator("#ctl-max-new input[type=number]").wait_for(state="visible")
    _type(fresh, "#ctl-max-new input[type=number]", "40", "Tab")
    _send(fresh, "Tell me a short story about a lighthouse keeper.")
    fresh.wait_for_function("() => !!window.spiceSent")          # sent: it waits for the engine
    fresh.keyboard.press("End")
    fresh.keyboard.insert_text("And then?")
    runs = _chat_text(fresh).count("Run ")          # the conversation this browser kept may hold a run already
    other.close()
    assert _wait(lambda: _chat_text(fresh).count("Run ") > runs, 90), "the engine stayed busy"
    fresh_box = fresh.locator("#spice-msg textarea")
    assert fresh_box.input_value() == "And then?", fresh_box.input_value()
    fresh.close()
    assert served.engine.concurrent_violations == 0
    context.close()


def test_every_page_with_the_shipped_model(browser, shipped_app):
    served, shots = shipped_app
    context = _context(browser)
    page = context.new_page()
    page.goto(served.url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    page.get_by_text("Timing model and generation").click()
    page.locator("#ctl-max-new input[type=number]").wait_for(state="visible")
    assert _wait(lambda: all(page.evaluate(_PLACEHOLDER_HEIGHTS_JS).values()), 60), "the panels were never drawn"
    fresh = page.evaluate(_PLACEHOLDER_HEIGHTS_JS)

    # A long reply, the window resized while its panels update in place: they stay drawn (the update after a
    # resize drew the lane chart and the prefetch timeline 0 px high). The model counts on for ~480 tokens, so
    # it still streams after both resizes whatever the machine's speed; then Stop.
    _type(page, "#ctl-max-new input[type=number]", "512", "Tab")
    page.evaluate(_RECORD_PANEL_HEIGHTS_JS)
    sent_at = page.evaluate("() => performance.now()")
    _send(page, "1, 2, 3, 4, 5, 6, 7, 8,")
    assert _wait(lambda: page.evaluate(_UPDATED_SINCE_JS, sent_at), 120), "the panels were never updated in place"
    for width in (1180, 1440):
        resized_at = page.evaluate("() => performance.now()")
        page.set_viewport_size({"width": width, "height": 1000})
        assert _wait(lambda: page.evaluate(_UPDATED_SINCE_JS, resized_at), 60), \
            f"the panels got no update after the window was resized to {width} px"
    _click(page, "#spice-stop")
    assert _wait(lambda: "Run " in _chat_text(page), 60), "the reply never ended"
    _assert_panels_stayed_drawn(page, "after a resize")

    # New chat: an empty chat, and the panels' placeholders as a fresh page draws them
    _click(page, "#spice-new")
    rows = page.locator("#spice-chat .message-row")
    assert _wait(lambda: rows.count() == 0 and page.evaluate(_PLACEHOLDER_HEIGHTS_JS) == fresh, 30), \
        f"after New chat: {rows.count()} messages, panels {page.evaluate(_PLACEHOLDER_HEIGHTS_JS)} (fresh: {fresh})"

    # A story, as a first visitor asks for one
    _type(page, "#ctl-max-new input[type=number]", "96", "Tab")
    # The page itself records the reply's length at every change: polling from here can miss a fast
    # reply whole while the browser is busy drawing the panels (it did on a fast CI machine).
    page.evaluate(_RECORD_REPLY_LENGTHS_JS)
    page.evaluate(_RECORD_PANEL_HEIGHTS_JS)
    _send(page, "Tell me a short story about a lighthouse keeper.")
    page.locator("#spice-chat .bot-row").first.wait_for(state="visible", timeout=60_000)
    assert _wait(lambda: "Run " in _chat_text(page), 120), "the reply never finished"
    lengths = page.evaluate("() => window.spiceReplyLengths")
    assert len({n for n in lengths if n > 2}) >= 3, f"the reply did not stream: lengths seen {lengths[:12]}"
    page.get_by_text("Timing model and generation").click()      # fold it again for the screenshot
    page.wait_for_timeout(1000)
    # The live panels stayed drawn while they updated and after the reply (they used to collapse to 0 px).
    _assert_panels_stayed_drawn(page, "while updating")
    # Every number in the numbers row reads on one line, whole (a value broke in two at this width).
    broken = page.evaluate(_BROKEN_STAT_VALUES_JS)
    assert not broken, f"numbers broken over lines or cut: {broken}"
    page.screenshot(path=str(shots / "chat.png"), full_page=True)

    # trace explorer: a run is picked, its timeline drawn, the Chrome trace downloads
    page.locator("a.nav-button, nav a", has_text="Trace explorer").first.click()
    page.wait_for_url("**/trace**")
    assert _wait(lambda: page.locator("#trace-summary").inner_text().strip() != "", 60)
    page.locator("#trace-timeline .js-plotly-plot").wait_for(timeout=60_000)
    page.locator("#dl-chrome").wait_for(state="visible")
    assert _wait(lambda: page.locator("#dl-chrome").is_enabled(), 60)
    page.locator("#dl-chrome").click()               # writes this export only, then offers the file
    link = page.locator("#trace-file a").first
    link.wait_for(timeout=60_000)
    with page.expect_download(timeout=60_000) as info:
        link.click()
    trace = json.loads(Path(info.value.path()).read_text())
    assert trace["traceEvents"] and info.value.suggested_filename.endswith(".json")
    # The per-layer table's headers wrap between words, never inside one ("laye|r", "selection|s").
    page.locator("#trace-table th").first.wait_for()
    split = page.evaluate(_WORDS_SPLIT_IN_HEADERS_JS)
    assert not split, f"header words broken across lines: {split}"
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "trace-explorer.png"), full_page=True)

    # sweep: a small grid, progress, then the Pareto plot
    page.locator("a.nav-button, nav a", has_text="Sweep").first.click()
    page.wait_for_url("**/sweep**")
    page.locator("#sweep-shape input").wait_for(state="visible")
    _assert_label_in_sight(page, "#sweep-shape")            # it was cut off, beside the hardware profile
    page.locator("#sweep-prompts textarea").fill("Once upon a time, a little cat\nOnce upon a time, there was a girl")
    page.locator("#sweep-policies label", has_text="spice_prefetch").click()      # untick: lru and spice stay
    page.locator("#sweep-tp input, #sweep-tp textarea").first.fill("0.2, 0.6")
    page.locator("#sweep-ta input, #sweep-ta textarea").first.fill("0, 0.2")
    tokens = page.locator("#sweep-tokens input[type=number]")
    tokens.fill("8")
    tokens.press("Tab")
    # Stop shows only while the sweep runs, in the place of "Run sweep" (the page records what it showed).
    assert not page.locator("#sweep-stop").is_visible(), "Stop showed with no sweep running"
    page.evaluate(_RECORD_SWEEP_BUTTONS_JS)
    page.locator("#sweep-run").click()
    status = page.locator("#sweep-status")
    assert _wait(lambda: status.inner_text().startswith(("Done", "⚠")), 120), status.inner_text()
    assert status.inner_text().startswith("Done"), status.inner_text()
    assert _wait(lambda: page.locator("#sweep-run").is_visible() and not page.locator("#sweep-stop").is_visible(),
                 10), "Run sweep did not come back after the sweep"
    assert "stop" in page.evaluate("() => window.spiceSweepButtons"), "Stop never showed while the sweep ran"
    page.locator("#sweep-pareto .js-plotly-plot").wait_for(timeout=60_000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "sweep.png"), full_page=True)
    page.set_viewport_size({"width": 390, "height": 844})   # a phone
    _wait(lambda: page.evaluate(_LABEL_IN_SIGHT_JS, "#sweep-shape")["whole"], 10)     # while the layout settles
    _assert_label_in_sight(page, "#sweep-shape")
    page.set_viewport_size({"width": 1440, "height": 1000})

    # about
    page.locator("a.nav-button, nav a", has_text="About").first.click()
    page.wait_for_url("**/about**")
    page.get_by_text("What SPICE does").wait_for()
    assert _wait(lambda: page.locator("#about-bench").inner_text().strip() != "", 60)
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "about.png"), full_page=True)
    assert getattr(served.engine, "concurrent_violations", 0) == 0
    context.close()
