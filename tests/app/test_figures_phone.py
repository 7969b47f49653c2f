"""The chat page's live charts read on a phone (390 x 844): their text stays inside each chart, and the
prefetch chart's two plots keep apart however many rows its legend takes.

Regression (QA on a phone): subtitles and notes ran off the right edge ("526 of 5793 prefetches wasted
(9%) this reply", the heatmap's "all 96 tokens: most frequent outcome" over half the chart's width), and
the prefetch legend, wrapped onto six rows, squeezed the plots until the upper x-axis title covered the
lower plot's "per token". Drawn by the browser from the figures of a short reply of the shipped model.
"""
from __future__ import annotations

import pytest

from app_helpers import ROOT, serve
from page_js import text_js

pytestmark = pytest.mark.browser

SHIPPED = ROOT / "assets" / "spice-mini"
PANELS = ("gantt", "heatmap", "prefetch")
REPLY_TOKENS = 8

# For each panel's chart: every annotation's text box that leaves the chart's SVG, and for the prefetch
# chart whether the upper x-axis title and the lower plot's subtitle overlap. Rectangles in CSS px.
GEOMETRY_JS = """(panels) => {
  const box = (r) => ({left: Math.round(r.left), right: Math.round(r.right), top: Math.round(r.top),
                       bottom: Math.round(r.bottom)});
  const out = {};
  for (const name of panels) {
    const gd = document.querySelector(`#spice-${name} .js-plotly-plot`);
    const svg = gd && gd.querySelector('svg.main-svg');
    if (!svg) { out[name] = {missing: true}; continue; }
    const s = svg.getBoundingClientRect();
    const outside = [];
    for (const t of gd.querySelectorAll('.annotation text, .annotation-text, .infolayer .g-gtitle text')) {
      const r = t.getBoundingClientRect();
      if (!r.width) continue;
      if (r.left < s.left - 1 || r.right > s.right + 1 || r.top < s.top - 1 || r.bottom > s.bottom + 1)
        outside.push({text: t.textContent, text_box: box(r), svg: box(s)});
    }
    const res = {outside, texts: [...gd.querySelectorAll('.annotation text')].map((t) => t.textContent)};
    if (name === 'prefetch') {
      const title = gd.querySelector('.g-xtitle text');
      const sub = [...gd.querySelectorAll('.annotation')].find((a) => a.textContent.trim() === 'per token');
      if (title && sub) {
        const a = title.getBoundingClientRect(), b = sub.querySelector('text').getBoundingClientRect();
        res.x_title = box(a); res.lower_subtitle = box(b);
        res.overlap = a.left < b.right && b.left < a.right && a.top < b.bottom && b.top < a.bottom;
      } else res.overlap = 'x-axis title or "per token" subtitle not drawn';
    }
    out[name] = res;
  }
  return out;
}"""

# The panels hold this reply's last charts and no live update waits to be drawn: the heatmap's subtitle
# counts the tokens the stats card counts (both come with the reply's last update), and the browser's
# live-panel queue is empty.
SETTLED_JS = """(panels) => {
  const card = document.querySelector('#spice-stats .card .v');
  const n = card ? parseInt(card.innerText, 10) : NaN;
  if (!(n > 0)) return false;
  return panels.every((name) => {
    const gd = document.querySelector(`#spice-${name} .js-plotly-plot`);
    if (!gd || !gd.data || !gd.data.length || !gd.querySelector('svg.main-svg')) return false;
    const live = window.__spiceLive && window.__spiceLive.panels && window.__spiceLive.panels[name];
    if (live && (live.pending || live.timer)) return false;
    return name !== 'heatmap' || gd.textContent.includes(`all ${n} tokens`);
  });
}"""


@pytest.fixture(scope="module")
def shipped_app():
    if not (SHIPPED / "config.json").exists():
        pytest.skip("the shipped model (assets/spice-mini) is not in this checkout")
    import torch
    from spice_core.engine import SpiceEngine
    torch.set_num_threads(1)
    served = serve(SpiceEngine.load(None, device="cpu"))
    yield served
    served.demo.close()


def _assert_inside(geometry: dict, when: str) -> None:
    for name in PANELS:
        assert not geometry[name].get("missing"), f"{when}: the {name} chart is not drawn"
        assert not geometry[name]["outside"], f"{when}: {name} text runs out of its chart: {geometry[name]['outside']}"


def _set_max_new_tokens(page, n: int) -> None:
    """Through the side bar, as a phone visitor would: open it, set the field, close it again."""
    closed = "() => !document.querySelector('#spice-controls').classList.contains('open')"
    page.wait_for_function(closed)          # a narrow screen's page closes it once loaded
    toggle = page.locator("#spice-controls .toggle-button")
    field = page.locator("#ctl-max-new input[type=number]")
    toggle.click()
    if not field.is_visible():
        page.get_by_text("Timing model and generation").click()
    field.fill(str(n))
    field.press("Tab")
    toggle.click()
    page.wait_for_function(closed)


def test_phone_charts_keep_their_text_inside_and_prefetch_plots_apart(browser, shipped_app):
    context = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(shipped_app.url, wait_until="load")
        page.wait_for_selector("#spice-msg textarea")
        page.wait_for_function("(panels) => panels.every((n) => document.querySelector("
                               "`#spice-${n} .js-plotly-plot .annotation`))", arg=list(PANELS))
        _assert_inside(page.evaluate(GEOMETRY_JS, list(PANELS)), "before a message (placeholders)")

        _set_max_new_tokens(page, REPLY_TOKENS)
        page.fill("#spice-msg textarea", "Tell me a story about a dog and a kite.")
        page.press("#spice-msg textarea", "Enter")
        page.wait_for_function(f"() => {text_js('#spice-chat')}.includes('TPOT')",
                               timeout=120_000)
        page.wait_for_function(SETTLED_JS, arg=list(PANELS), timeout=30_000)

        geometry = page.evaluate(GEOMETRY_JS, list(PANELS))
        _assert_inside(geometry, f"after a {REPLY_TOKENS}-token reply")
        prefetch = geometry["prefetch"]
        assert prefetch["overlap"] is False, f"the upper x-axis title covers the lower plot's subtitle: {prefetch}"
    finally:
        context.close()
