"""The sweep's GPU cache size in a real browser (the fake engine, a model that needs 0.25 of its experts on the GPU):
the slider starts at the model's smallest size, and a number typed beyond it is said under its label, with the value
the box went to, which is the one a sweep then uses.

Waits are for the page's own state, never for a fixed time."""
from __future__ import annotations

import pytest

from app_helpers import close, serve
from fake_engine import FakeEngine

expect = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed").expect
pytestmark = pytest.mark.browser
NUMBER = "#sweep-cache input[type=number]"
WAIT_MS = 20_000


@pytest.fixture(scope="module")
def wide():
    s = serve(FakeEngine(token_delay_s=0.004, n_layers=3, n_experts=8, top_k=4))       # 4 of 16 experts: 0.25
    yield s
    close(s)


def _leave(page, value: str, by: str) -> None:
    """Write ``value`` into the cache's box, then leave it: Tab, or a click on the element ``by`` names."""
    box = page.locator(NUMBER)
    box.fill(value)
    if by == "Tab":
        box.press("Tab")
    else:
        page.locator(by).click()


def test_a_cache_typed_below_the_models_smallest_is_said_under_the_slider_and_swept_at_it(browser, wide):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(wide.url.rstrip("/") + "/sweep", wait_until="load")
    cache, box = page.locator("#sweep-cache"), page.locator(NUMBER)
    box.wait_for(state="visible")
    assert box.get_attribute("min") == "0.25"
    expect(cache).to_contain_text("from 0.25 for this model")
    for typed, went in (("0", "0.25"), ("5", "1")):
        _leave(page, typed, "Tab")
        expect(cache).to_contain_text(f"{typed} is out of range; it takes 0.25 to 1", timeout=WAIT_MS)
        expect(cache).to_contain_text(f"The box went to {went}.", timeout=WAIT_MS)
        expect(box).to_have_value(went, timeout=WAIT_MS)
    _leave(page, "0.5", "Tab")       # a number it takes: the slider's own line comes back
    expect(cache).to_contain_text("from 0.25 for this model", timeout=WAIT_MS)
    # Typed and straight on to Run: the click leaves the box, and the sweep runs at the value the note gives.
    page.locator("#sweep-prompts textarea").fill("Once upon a time")
    for policy in ("spice_prefetch", "spice"):
        page.locator("#sweep-policies label", has_text=policy).first.click()       # untick: lru stays
    before = len(wide.engine.generations)
    _leave(page, "0.1", "#sweep-run")
    expect(cache).to_contain_text("0.1 is out of range", timeout=WAIT_MS)
    expect(page.locator("#sweep-status")).to_contain_text("Done", timeout=60_000)
    runs = wide.engine.generations[before:]
    assert runs and {g.settings_log[0][1].cache_frac for g in runs} == {0.25}
    page.close()
