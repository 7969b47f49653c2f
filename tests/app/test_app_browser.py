"""The app in a real browser (Debian's chromium through Playwright), used the way a person would.

One flow, in order: open the chat, send a message and watch it stream, move a slider mid-reply
and see the panel say so, send a second message mid-reply (a note, the text stays), stop a reply,
send an empty message, close a tab mid-reply and chat from a new tab, open the trace explorer
and download the Chrome trace, run a small sweep, open About. Screenshots of every page go to
``docs/screenshots/`` when the shipped model serves (or ``SPICE_SCREENSHOTS_DIR`` is set),
otherwise to the test's temporary folder.

Engine: the shipped model when ``assets/spice-mini/`` exists, else the fake engine
(``SPICE_APP_TEST_ENGINE=fake|shipped`` forces one).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from app_helpers import ROOT, serve
from fake_engine import FakeEngine

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
SHIPPED = ROOT / "assets" / "spice-mini"


def _engine():
    choice = os.environ.get("SPICE_APP_TEST_ENGINE", "auto")
    if choice == "shipped" or (choice == "auto" and (SHIPPED / "config.json").exists()):
        from spice_core.engine import SpiceEngine
        return SpiceEngine.load(None, device="cpu"), True
    return FakeEngine(token_delay_s=0.05), False


@pytest.fixture(scope="module")
def browser_app(tmp_path_factory):
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    engine, shipped = _engine()
    served = serve(engine, orphan_after_s=1.5)
    override = os.environ.get("SPICE_SCREENSHOTS_DIR")
    shots = Path(override) if override else (ROOT / "docs" / "screenshots" if shipped
                                             else tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 1000}, accept_downloads=True)
        yield served, context, shots
        context.close()
        browser.close()
    served.demo.close()
    served.ctx.exports.cleanup()


def _wait(predicate, timeout_s=10.0, interval_s=0.05):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def _send(page, text: str) -> None:
    box = page.locator("#spice-msg textarea")
    box.fill(text)
    box.press("Enter")


def _chat_text(page) -> str:
    return page.locator("#spice-chat").inner_text()


def test_a_person_chats_tunes_explores_and_sweeps(browser_app):
    served, context, shots = browser_app
    context.set_default_timeout(60_000)           # generous: CI machines may be busy
    page = context.new_page()
    started = time.perf_counter()
    page.goto(served.url, wait_until="load")
    page.locator("#spice-msg textarea").wait_for(state="visible")
    assert time.perf_counter() - started < 20
    assert "Timing:" in page.locator("#spice-banner").inner_text()

    # 1. ask for a long reply, type a message and watch it stream
    page.get_by_text("Timing model and generation").click()
    longer = page.locator("#ctl-max-new input[type=number]")
    longer.wait_for(state="visible")
    longer.fill("512")             # the longest the slider allows: this reply is stopped below
    longer.press("Tab")
    _send(page, "Tell me a story about a lighthouse keeper.")
    bot = page.locator("#spice-chat .bot-row").first
    bot.wait_for(state="visible", timeout=15_000)
    lengths = []
    assert _wait(lambda: lengths.append(len(bot.inner_text())) or len({n for n in lengths if n > 2}) >= 3, 15), \
        f"the reply did not stream: {lengths[-5:]}"

    # 2. move a slider mid-reply: the settings note, then the numbers panel, say it applied
    number = page.locator("#ctl-tau-prefetch input[type=number]")
    number.fill("0.85")
    number.press("Tab")            # the slider takes its number box on blur
    note = page.locator("#spice-settings-note")
    assert _wait(lambda: "sent to the running reply" in note.inner_text(), 30), note.inner_text()
    stats = page.locator("#spice-stats")
    assert _wait(lambda: "changed tau_prefetch" in stats.inner_text(), 30), stats.inner_text()
    assert page.locator("#spice-heatmap .js-plotly-plot").count() > 0
    assert page.locator("#spice-gantt .js-plotly-plot").count() > 0

    # 3. a second message while the reply streams: a note, and the text stays in the box
    page.locator("#spice-msg textarea").fill("wait for me")
    page.locator("#spice-msg textarea").press("Enter")
    assert _wait(lambda: "Still answering your previous message" in _chat_text(page), 15)
    assert page.locator("#spice-msg textarea").input_value() == "wait for me"

    # 4. Stop ends the reply between tokens
    page.locator("#spice-stop").click()
    assert _wait(lambda: "Stopped after" in _chat_text(page), 15), _chat_text(page)[-300:]
    assert "Settings changed during this reply" in _chat_text(page)

    # 5. an empty message gets a note, nothing is sent
    page.locator("#spice-msg textarea").fill("   ")
    page.locator("#spice-msg textarea").press("Enter")
    assert _wait(lambda: "Message not sent" in _chat_text(page), 10)

    # 6. a tab closed mid-reply frees the engine: a new tab chats at once
    other = context.new_page()
    other.goto(served.url, wait_until="load")
    other.locator("#spice-msg textarea").wait_for(state="visible")
    _send(other, "A very long answer, please.")
    other.locator("#spice-chat .bot-row").first.wait_for(state="visible", timeout=15_000)
    other.close()
    fresh = context.new_page()
    fresh.goto(served.url, wait_until="load")
    fresh.locator("#spice-msg textarea").wait_for(state="visible")
    fresh.get_by_text("Timing model and generation").click()
    shorter = fresh.locator("#ctl-max-new input[type=number]")
    shorter.fill("40")
    shorter.press("Tab")
    _send(fresh, "Tell me a short story about a lighthouse keeper.")
    assert _wait(lambda: "Run " in fresh.locator("#spice-chat").inner_text(), 90), "the engine stayed busy"
    fresh.get_by_text("Timing model and generation").click()     # fold it again for the screenshot
    fresh.wait_for_timeout(800)
    fresh.screenshot(path=str(shots / "chat.png"), full_page=True)
    fresh.close()

    # 7. trace explorer: a run is picked, its timeline drawn, the Chrome trace downloads
    page.locator("a.nav-button, nav a", has_text="Trace explorer").first.click()
    page.wait_for_url("**/trace**")
    assert _wait(lambda: page.locator("#trace-summary").inner_text().strip() != "", 15)
    page.locator("#trace-timeline .js-plotly-plot").wait_for(timeout=15_000)
    page.locator("#dl-chrome").wait_for(state="visible")
    assert _wait(lambda: page.locator("#dl-chrome").is_enabled(), 10)
    with page.expect_download(timeout=15_000) as info:
        page.locator("#dl-chrome").click()
    trace = json.loads(Path(info.value.path()).read_text())
    assert trace["traceEvents"] and info.value.suggested_filename.endswith(".json")
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "trace-explorer.png"), full_page=True)

    # 8. sweep: a small grid, progress, then the Pareto plot
    page.locator("a.nav-button, nav a", has_text="Sweep").first.click()
    page.wait_for_url("**/sweep**")
    page.locator("#sweep-prompts textarea").fill("Once upon a time\nThe best way to learn is")
    page.locator("#sweep-policies label", has_text="spice_prefetch").click()      # untick: lru and spice stay
    page.locator("#sweep-tp input, #sweep-tp textarea").first.fill("0.2, 0.6")
    page.locator("#sweep-ta input, #sweep-ta textarea").first.fill("0, 0.3")
    tokens = page.locator("#sweep-tokens input[type=number]")
    tokens.fill("8")
    tokens.press("Tab")
    page.locator("#sweep-run").click()
    status = page.locator("#sweep-status")
    assert _wait(lambda: status.inner_text().startswith(("Done", "⚠")), 120), status.inner_text()
    assert status.inner_text().startswith("Done"), status.inner_text()
    page.locator("#sweep-pareto .js-plotly-plot").wait_for(timeout=10_000)
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "sweep.png"), full_page=True)

    # 9. about
    page.locator("a.nav-button, nav a", has_text="About").first.click()
    page.wait_for_url("**/about**")
    page.get_by_text("What SPICE does").wait_for()
    assert _wait(lambda: page.locator("#about-bench").inner_text().strip() != "", 10)
    page.wait_for_timeout(300)
    page.screenshot(path=str(shots / "about.png"), full_page=True)
    assert getattr(served.engine, "concurrent_violations", 0) == 0
