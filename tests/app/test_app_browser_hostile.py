"""Visitor text stays inert on every page, in a real browser (Debian's chromium through Playwright).

A chat message carrying markup becomes the run's label; the same browser then opens the trace
explorer (which shows the label), the sweep (whose errors quote what was typed) and About. The
payload would retitle the page if it ran.
"""
from __future__ import annotations

import pytest

from app_helpers import serve
from fake_engine import FakeEngine
from app_helpers import ARGS, CHROMIUM
from page_js import text_js

pytestmark = pytest.mark.browser
XSS = "<img src=x onerror=document.title='XSS-FIRED'>"


def test_markup_typed_by_a_visitor_never_runs_on_any_page():
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    served = serve(FakeEngine(token_delay_s=0.002))
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
            page.set_default_timeout(60_000)
            base = served.url.rstrip("/")
            page.goto(base + "/", wait_until="load")
            page.locator("#spice-msg textarea").fill(XSS)
            page.locator("#spice-msg textarea").press("Enter")
            page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('Run ')")
            assert page.title() != "XSS-FIRED"
            page.goto(base + "/trace", wait_until="load")
            page.wait_for_function(f"() => {text_js('#trace-summary')}.includes('onerror')")
            assert page.title() != "XSS-FIRED"
            assert page.locator("#trace-summary img").count() == 0
            page.goto(base + "/sweep", wait_until="load")
            page.locator("#sweep-ta textarea").fill(XSS)
            page.locator("#sweep-run").click()
            page.wait_for_function(f"() => {text_js('#sweep-status')}.includes('not started')")
            assert page.title() != "XSS-FIRED" and page.locator("#sweep-status img").count() == 0
            page.goto(base + "/about", wait_until="load")
            page.wait_for_timeout(500)
            assert page.title() != "XSS-FIRED"
            browser.close()
    finally:
        served.demo.close()
        served.ctx.exports.cleanup()
