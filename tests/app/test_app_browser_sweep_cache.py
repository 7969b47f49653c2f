"""The sweep's GPU cache size in a real browser (the fake engine, a model that needs 0.25 of its experts on the GPU):
the slider starts at the model's smallest size, and a number typed beyond it is said under its label, with the value
the box went to, which is the one a sweep then uses.

Waits are for the page's own state, never for a fixed time."""
from __future__ import annotations

import pytest

from app_helpers import close, serve
from fake_engine import FakeEngine
from sweep_browser import WAIT_MS, SweepBox

expect = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed").expect
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def wide():
    s = serve(FakeEngine(token_delay_s=0.004, n_layers=3, n_experts=8, top_k=4))       # 4 of 16 experts: 0.25
    yield s
    close(s)


def test_a_cache_typed_below_the_models_smallest_is_said_under_the_slider_and_swept_at_it(browser, wide):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    cache = SweepBox(page, wide.url, "sweep-cache")
    assert cache.box.get_attribute("min") == "0.25"
    expect(cache.slider).to_contain_text("from 0.25 for this model")
    for typed, went in (("0", "0.25"), ("5", "1")):
        cache.says_it_went(expect, typed, f"{typed} is out of range; it takes 0.25 to 1", went)
    cache.leave("0.5")       # a number it takes: the slider's own line comes back
    expect(cache.slider).to_contain_text("from 0.25 for this model", timeout=WAIT_MS)
    runs = cache.sweep_typed(expect, wide.engine, "0.1", "0.1 is out of range")
    assert runs and {g.settings_log[0][1].cache_frac for g in runs} == {0.25}
    page.close()
