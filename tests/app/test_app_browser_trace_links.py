"""The trace explorer's links and bounds, the status words read to screen readers, and a wrong address, in a real
browser (regressions from exploratory QA):
- "From token" had no maximum: 100000 drew "no intervals for tokens 100000–100015";
- `/trace?run=<malformed>` said nothing about the link;
- the share note gave a relative `trace?run=<id>` in code style instead of a link;
- the screen-reader status region on /sweep, /about and /trace announced the untranslated key "common.complete"
  (page loads now say nothing; a sweep says "Complete");
- an unknown address showed raw `{"detail":"Not Found"}`.
"""
from __future__ import annotations

import pytest

from page_js import text_js, value_js

pytestmark = pytest.mark.browser

# Every text the page's screen-reader status regions (role=status) take, in order.
RECORD_STATUS_JS = """
window.__spiceStatus = [];
new MutationObserver((changes) => {
  for (const m of changes) {
    const node = m.target.nodeType === 3 ? m.target.parentElement : m.target;
    const region = node && node.closest && node.closest('[role=status]');
    const text = region && region.textContent.trim();
    if (text) window.__spiceStatus.push(text);
  }
}).observe(document, {subtree: true, childList: true, characterData: true});
"""


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = context.new_page()
    p.set_default_timeout(30_000)
    yield p
    context.close()


def test_a_sweep_says_complete_in_words_not_the_translation_key(served, browser):
    """Page loads say nothing at all now (`test_app_browser_announce`); a sweep the visitor starts still says its
    progress, and in words."""
    context = browser.new_context()
    try:
        p = context.new_page()
        p.add_init_script(RECORD_STATUS_JS)
        p.goto(served.url.rstrip("/") + "/sweep", wait_until="load")
        p.locator("#sweep-prompts textarea").fill("Once upon a time")
        for policy in ("spice_prefetch", "spice"):
            p.locator("#sweep-policies label", has_text=policy).first.click()       # untick: lru stays
        p.locator("#sweep-run").click()
        p.wait_for_function("() => window.__spiceStatus.includes('Complete')", timeout=60_000, polling=50)
        said = p.evaluate("window.__spiceStatus")
        assert not [t for t in said if "common." in t], said
    finally:
        context.close()


def _open_a_run_in_the_trace_explorer(page, base: str) -> str:
    """Chat once in this browser, open /trace (which picks that run) and wait for its window; the run's id."""
    page.goto(base + "/", wait_until="load")
    page.locator("#spice-msg textarea").fill("Tell me a story about a trace.")
    page.locator("#spice-msg textarea").press("Enter")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('Run ')", polling=100)
    page.goto(base + "/trace", wait_until="load")
    page.wait_for_function(f"() => {text_js('#trace-summary')}.trim() !== ''", polling=100)
    return page.input_value("#trace-run input").split(" · ")[0]


def test_from_token_past_the_run_is_bounded_and_the_box_says_so(served, page):
    _open_a_run_in_the_trace_explorer(page, served.url.rstrip("/"))
    page.wait_for_function(f"() => {text_js('#trace-first')}.includes('this run has tokens 0–')", polling=100)
    last = int(page.inner_text("#trace-first").split("tokens 0–")[1].split()[0].replace(",", ""))
    box = page.locator("#trace-first input")
    assert box.get_attribute("max") == str(last)
    box.fill("100000")
    box.press("Enter")
    page.wait_for_function(f"() => {text_js('#trace-first')}.includes('past this run')", polling=100)
    assert box.input_value() == str(max(0, last + 1 - 16))
    assert "no intervals" not in page.inner_text("#trace-timeline")


def test_the_share_note_links_the_run_in_full(served, page):
    base = served.url.rstrip("/")
    run_id = _open_a_run_in_the_trace_explorer(page, base)
    page.locator("#trace-share input[type=checkbox]").check()
    link = page.locator("#trace-share-note a")
    link.wait_for()
    assert link.get_attribute("href") == f"{base}/trace?run={run_id}"
    assert link.inner_text() == f"{base}/trace?run={run_id}"


def test_a_link_with_a_malformed_run_id_says_so(served, page):
    page.goto(served.url.rstrip("/") + "/trace?run=bo%20gus!", wait_until="load")
    page.wait_for_function(f"() => {text_js('.spice-note')}.includes('not a run id')", polling=100)
    page.wait_for_function(f"() => ({value_js('#trace-run input')} || '').includes('from the link: not a run id')",
                           polling=100)


def test_an_unknown_address_shows_the_apps_pages(served, page):
    base = served.url.rstrip("/")
    response = page.goto(base + "/qwen2", wait_until="load")
    assert response.status == 404 and page.title().startswith("Page not found")
    page.get_by_role("link", name="Sweep").click()
    page.wait_for_url(base + "/sweep")
