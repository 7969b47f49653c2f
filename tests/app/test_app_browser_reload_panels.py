"""A reload brings back the last reply's panels and numbers row, in a real browser (regression: the conversation
came back but the heatmap, prefetch timeline, lane chart and numbers row started empty). Another browser given the
same kept conversation gets the conversation, the placeholders and a note: never the other visitor's run."""
from __future__ import annotations

import json

import pytest

from chat_browser import ask_and_keep, open_chat, reload_chat
from page_js import text_js

pytestmark = pytest.mark.browser
ASK = "Tell me about the green heron."
# Per panel: how many traces it draws and the heatmap's grids (the per-layer expert outcomes), as Plotly holds them.
PANELS_JS = """() => {
  const gd = (id) => document.querySelector(`#${id} .js-plotly-plot`);
  const out = {};
  for (const id of ['spice-heatmap', 'spice-prefetch', 'spice-gantt']) {
    const g = gd(id);
    out[id] = g && g.data ? g.data.length : -1;
  }
  const heat = gd('spice-heatmap');
  out.heat_z = heat && heat.data ? JSON.stringify(heat.data.map((t) => t.z || null)) : '';
  return out;
}"""
CARDS_JS = "() => (document.querySelector('#spice-stats .cards') || {}).innerText || ''"


def _numbers_back(page, run_id: str) -> None:
    page.wait_for_function(f"() => {text_js('#spice-stats')}.includes({run_id!r})", timeout=30_000, polling=100)
    page.wait_for_function(f"() => {{ const p = ({PANELS_JS})(); return p['spice-gantt'] > 0 && p['spice-prefetch'] > 0; }}",
                           timeout=30_000, polling=100)


def test_a_reload_brings_back_the_last_replys_panels_and_numbers(browser, shipped_served):
    served = shipped_served         # the real engine on the shipped model (the fake where it is absent)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30_000)
    try:
        page = context.new_page()
        open_chat(page, served.url)
        ask_and_keep(page, ASK)
        run_id = _newest_run(served, context)
        cards, panels = page.evaluate(CARDS_JS), page.evaluate(PANELS_JS)
        assert run_id in cards and "TPOT" in cards and panels["heat_z"], (cards, panels)

        reload_chat(page, ASK)
        _numbers_back(page, run_id)
        assert page.evaluate(CARDS_JS) == cards, "the numbers row differs from the one the reply ended with"
        again = page.evaluate(PANELS_JS)
        assert again["heat_z"] == panels["heat_z"], "the heatmap's grids differ from those the reply ended with"
        assert min(again[k] for k in ("spice-heatmap", "spice-prefetch", "spice-gantt")) > 0, again

        # Another browser (another visitor) that gets this conversation gets the placeholders and a note.
        kept = page.evaluate("() => Object.fromEntries(Object.keys(localStorage)"
                             ".filter((k) => k !== 'spice_owner').map((k) => [k, localStorage.getItem(k)]))")
        other = browser.new_context(viewport={"width": 1400, "height": 1000})
        other.set_default_timeout(30_000)
        try:
            other.add_init_script(f"""(() => {{ const kept = {json.dumps(kept)};
              if (!sessionStorage.getItem('copied')) {{ sessionStorage.setItem('copied', '1');
                for (const [k, v] of Object.entries(kept)) localStorage.setItem(k, v); }} }})()""")
            stranger = other.new_page()
            open_chat(stranger, served.url)
            stranger.wait_for_function(f"() => {text_js('#spice-chat')}.includes({ASK!r})", timeout=20_000,
                                       polling=100)
            stranger.wait_for_function(f"() => {text_js('#spice-stats')}.includes('no longer available')",
                                       timeout=30_000, polling=100)
            stats = stranger.inner_text("#spice-stats")
            assert run_id not in stats and "TPOT" not in stats, stats
            assert stranger.evaluate(PANELS_JS)["heat_z"] in ("", "[]"), "another visitor's heatmap was drawn"
        finally:
            other.close()
    finally:
        context.close()


def _owner(context) -> str:
    token = next(c["value"] for c in context.cookies() if c["name"] == "spice_owner")
    return "browser:" + token


def _newest_run(served, context) -> str:
    """The newest run of this browser's visitor (the reply just sent)."""
    return served.ctx.runs.list_for(_owner(context))[0].run_id
