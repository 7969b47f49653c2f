"""A first visitor in chromium: responsive while streaming, usable on a phone, dark plots in dark mode.

Bounds are relative to the run's own pace (any machine speed); benchmarks/app_stream.py measures the precise figures
(docs/benchmarks/app/README.md). ``SPICE_SCREENSHOTS_DIR`` saves desktop, phone and dark screenshots.
"""
from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest

from app_helpers import ROOT, close, serve_shipped
from page_js import text_js, value_js

pytestmark = pytest.mark.browser


def _bench():
    spec = importlib.util.spec_from_file_location("app_stream", ROOT / "benchmarks" / "app_stream.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def shots(tmp_path):
    path = Path(os.environ.get("SPICE_SCREENSHOTS_DIR") or tmp_path)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def app_server():
    served = serve_shipped(fake_delay_s=0.08)
    yield served
    close(served)


def test_streaming_with_panels_on_stays_responsive_and_fast(browser, app_server, shots):
    bench = _bench()
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(60_000)
    page.goto(app_server.url, wait_until="load")
    page.wait_for_selector("#spice-msg textarea")
    bench.set_max_tokens(page, 64)
    off = bench.one_reply(page, panels=False)
    page.click("#spice-new")
    on = bench.one_reply(page, panels=True)
    page.screenshot(path=str(shots / "chat.png"))
    text = bench.chat_text(page)
    assert "dog" in text.lower() or "kite" in text.lower(), "the story stays on topic"
    bench.set_max_tokens(page, 512)         # a reply long enough to still be streaming when Stop is pressed
    stopped = bench.one_reply(page, panels=True, stop_after_s=1.5)
    # The precise targets (lag < 1 s, rate >= 80%) are measured by the benchmark. Here every bound is relative to
    # this run's own pace, so a slow or loaded machine passes and a page that freezes while streaming fails:
    # typing goes through again and again while the reply streams, no key waits half the reply,
    # and Stop cuts the reply short.
    assert on["probes"] >= 3 and off["probes"] >= 3, (on, off)
    assert on["lag_max_s"] < 0.5 * on["streamed_s"], on
    assert on["lag_median_s"] < max(1.0, 3 * off["lag_median_s"]), (on, off)
    assert on["streamed_tps"] >= 0.5 * off["streamed_tps"], (on, off)
    assert stopped["stop_s"] is not None, f"the reply ended before Stop was pressed: {stopped}"
    assert stopped["tokens"] < 512, stopped
    left_s = (512 - stopped["tokens"]) / max(stopped["streamed_tps"], 1e-9)   # what the reply had left at its pace
    assert stopped["stop_s"] < max(5.0, 0.5 * left_s), stopped


def test_phone_first_load_shows_chat_and_examples(browser, app_server, shots):
    # The shipped model (the fake without it): this picture is the README's.
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page.goto(app_server.url, wait_until="load")
    page.wait_for_selector("#spice-msg textarea")
    assert page.wait_for_function("() => { const s = document.querySelector('#spice-controls')"
                                  ".closest('.sidebar'); return s && !s.classList.contains('open'); }",
                                  timeout=30_000)
    page.get_by_text("Tell me a story about a cat and a ball.").click(timeout=30_000)
    # The example fills the box through the app's event queue: wait for it (a loaded machine is slow).
    assert page.wait_for_function(f"() => {value_js('#spice-msg textarea')} === "
                                  "'Tell me a story about a cat and a ball.'", timeout=20_000)
    page.screenshot(path=str(shots / "phone.png"))


def test_dark_mode_draws_dark_plots(browser, app_server, shots):
    # The shipped model (the fake without it): this picture is the README's.
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    page.goto(app_server.url + "?__theme=dark", wait_until="load")
    page.wait_for_selector("#spice-msg textarea")
    page.fill("#spice-msg textarea", "Tell me a story about a cat.")
    page.press("#spice-msg textarea", "Enter")
    page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('TPOT')",
                           timeout=60_000)
    time.sleep(1.0)
    colours = page.evaluate("""() => {
        const gd = document.querySelector('#spice-gantt .js-plotly-plot');
        const tick = gd && gd.querySelector('.xtick text');
        const bg = getComputedStyle(document.body).backgroundColor;
        return {paper: gd && gd.layout.paper_bgcolor, tick: tick && getComputedStyle(tick).fill, bg};
    }""")
    assert colours["paper"].replace(" ", "") == "rgba(0,0,0,0)", colours         # the page's dark background shows through

    def brightness(css):
        nums = [float(x) for x in css[css.index("(") + 1:css.index(")")].split(",")[:3]]
        return sum(nums) / 3
    assert brightness(colours["bg"]) < 80 and brightness(colours["tick"]) > 150, colours
    page.screenshot(path=str(shots / "dark.png"))
