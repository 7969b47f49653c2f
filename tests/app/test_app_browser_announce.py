"""Page loads are silent for screen readers, in a real browser on the fake engine (regression: Gradio's status
tracker wrote "Loading", then "Complete" into its live region at every load of the trace explorer, the sweep and
About); a reply the visitor asks for still says its progress, and so does a pick of a run in the trace explorer or of a
benchmark file on About (regression: their views hung on a change listener, which the load sets off too, so a pick
was as silent as the load).

Every text the live region is given is recorded from the page's start. A load's "Loading" would come as its first
event starts, before any of its outputs arrive, so each page is checked once what its load fills is on screen."""
from __future__ import annotations

import pytest

from chat_browser import ask_and_keep, open_chat, reload_chat
from page_js import text_js

pytestmark = pytest.mark.browser
ASK = "Tell me a story about a cat and a ball."
RECORD_JS = """window.spiceSaid = [];
document.addEventListener('DOMContentLoaded', () => {
  const watch = () => document.querySelectorAll('.sr-only[role="status"][aria-live]').forEach((el) => {
    if (el.dataset.spiceHeard) return;
    el.dataset.spiceHeard = '1';
    new MutationObserver(() => { const t = el.textContent.trim(); if (t) window.spiceSaid.push(t); })
      .observe(el, {childList: true, subtree: true, characterData: true});
  });
  watch();
  new MutationObserver(watch).observe(document.documentElement, {childList: true, subtree: true});
});"""
SAID_JS = "() => window.spiceSaid"


def _loaded(page, url: str, shown_js: str) -> list[str]:
    """What the live region said while ``url`` loaded, once ``shown_js`` (what its load fills) holds."""
    page.goto(url, wait_until="load")
    page.wait_for_function(shown_js, timeout=30_000, polling=100)
    return page.evaluate(SAID_JS)


@pytest.fixture
def recorded(browser):
    """A browser context whose pages record what their live regions say (``window.spiceSaid``)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    context.add_init_script(RECORD_JS)
    yield context
    context.close()


def test_page_loads_say_nothing_and_a_reply_still_says_its_progress(recorded, served):
    page = recorded.new_page()
    base = served.url.rstrip("/")
    assert _loaded(page, base + "/about", f"() => {text_js('#about-bench')}.trim() !== ''") == []
    assert _loaded(page, base + "/trace", "() => document.body.innerText.includes('No finished runs yet')") == []
    open_chat(page, served.url)
    ask_and_keep(page, ASK)
    page.wait_for_function("() => window.spiceSaid.includes('Complete')", timeout=30_000, polling=100)
    assert page.evaluate(SAID_JS)[0] == "Loading", page.evaluate(SAID_JS)
    # A reload brings the conversation, then its last reply's numbers back: all without a word.
    reload_chat(page, ASK)
    page.wait_for_function(f"() => {text_js('#spice-stats')}.includes('TPOT')", timeout=30_000, polling=100)
    assert page.evaluate(SAID_JS) == []


def _pick(page, picker: str, index: int) -> str:
    """Pick the ``index``-th option of the menu ``picker`` as a visitor does (open it, click the option); its text."""
    page.locator(f"{picker} input").click()
    option = page.locator(picker).get_by_role("option").nth(index)
    text = option.inner_text().strip()
    option.click()
    return text


def _said_on_pick(page, picker: str, index: int, shown_js: str) -> list[str]:
    """What the live region said from a pick of the ``index``-th option of ``picker`` until the view shows it
    (``shown_js``, given the option's text) and the status has said "Complete"."""
    page.evaluate("() => { window.spiceSaid = []; }")
    text = _pick(page, picker, index)
    page.wait_for_function(shown_js, arg=text, timeout=30_000, polling=100)
    page.wait_for_function("() => window.spiceSaid.includes('Complete')", timeout=30_000, polling=100)
    return page.evaluate(SAID_JS)


def test_a_pick_of_a_run_or_a_benchmark_says_its_progress_and_the_load_still_says_nothing(recorded, served):
    page = recorded.new_page()
    base = served.url.rstrip("/")
    open_chat(page, served.url)
    for ask in (ASK, "Tell me a story about a fox and a drum."):       # two runs of this browser's to pick from
        ask_and_keep(page, ask)
    assert _loaded(page, base + "/trace", f"() => {text_js('#trace-summary')}.trim() !== ''") == []
    said = _said_on_pick(page, "#trace-run", 1,
                         f"(option) => {text_js('#trace-summary')}.includes(option.split(' · ')[0])")
    assert said[0] == "Loading", said
    assert _loaded(page, base + "/about", f"() => {text_js('#about-bench')}.trim() !== ''") == []
    said = _said_on_pick(page, "#about-bench-pick", 1,
                         f"(option) => {text_js('#about-bench')}.includes('Source: ' + option.split(' (')[0])")
    assert said[0] == "Loading", said
