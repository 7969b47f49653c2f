"""Two models in one app, on the real engine (spice_core.engine.SpiceEngine) on CPU: a random miniature of
Qwen2-57B-A14B's topology (28 MoE layers, 64 experts top-8, saved as `spice-mini-qwen2`) beside a tiny
DeepSeek-V2, each with its own chat and sweep pages, a picker between them, and one trace explorer."""
from __future__ import annotations

import urllib.request

import pytest
from gradio_client import Client

from app_helpers import HeldReply, chat_inputs, last_notes, serve

engine_mod = pytest.importorskip("spice_core.engine", reason="the engine (spice_core/engine.py) is not in this tree")
from tiny_models import build_qwen2_miniature, build_tiny


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-models")
    first = engine_mod.SpiceEngine.load(build_tiny("deepseek_v2", root / "tiny-deepseek"), device="cpu")
    qwen2 = engine_mod.SpiceEngine.load(build_qwen2_miniature(root / "spice-mini-qwen2", hidden_size=32,
                                                              moe_intermediate_size=8,
                                                              shared_expert_intermediate_size=16), device="cpu")
    s = serve([first, qwen2])
    yield s
    s.demo.close()
    s.ctx.exports.cleanup()


def _component(demo, elem_id: str, nth: int = 0) -> dict:
    found = [c["props"] for c in demo.config["components"] if c.get("props", {}).get("elem_id") == elem_id]
    return found[nth]


def _run_id(history) -> str:
    return next(n for n in last_notes(history) if n.startswith("Run ")).split()[1]


def test_each_model_answers_on_its_own_page_and_both_runs_reach_the_one_trace_explorer(two):
    c = Client(two.url, verbose=False)
    out_a = c.predict(*chat_inputs("tell me a story about the cat", max_new_tokens=4, policy="lru",
                                   cache_frac=0.5), api_name="/chat")
    out_b = c.predict(*chat_inputs("tell me a story about the dog", max_new_tokens=4, policy="lru", cache_frac=0.5,
                                   shape="qwen2-57b-a14b"), api_name="/chat_spice_mini_qwen2")
    a, b = _run_id(out_a[1]), _run_id(out_b[1])
    runs = dict((v, label) for label, v in c.predict(None, api_name="/runs")["choices"])
    assert a in runs and b in runs
    assert "tiny-deepseek · chat" in runs[a] and "spice-mini-qwen2 · chat" in runs[b]
    table = c.predict(b, 0, 16, api_name="/trace_run")[4]
    assert [row[0] for row in table["data"]] == list(range(28))          # the Qwen2 miniature's 28 MoE layers
    assert c.predict(a, "csv", api_name="/export") and c.predict(b, "csv", api_name="/export")
    c.close()


def test_the_picker_names_each_models_routing_and_opens_its_pages(two):
    picker = _component(two.demo, "chat-model")
    assert [tuple(c) for c in picker["choices"]] == [("tiny-deepseek", "tiny-deepseek"),
                                                     ("spice-mini-qwen2 · qwen2-57b-a14b routing", "spice-mini-qwen2")]
    assert _component(two.demo, "sweep-model")["choices"] == picker["choices"]
    for path in ("spice-mini-qwen2", "sweep-spice-mini-qwen2"):
        with urllib.request.urlopen(two.url + path) as page:
            assert page.status == 200


def test_the_shape_menu_says_whose_routing_each_shape_times(two):
    """On the Qwen2 miniature's page its own shape is the default and the DeepSeek shape is "sizes only";
    the tiny DeepSeek-V2 (no real model's topology) has no own shape, so both are sizes only."""
    tiny, qwen2 = _component(two.demo, "ctl-shape", 0), _component(two.demo, "ctl-shape", 1)
    assert qwen2["value"] == "qwen2-57b-a14b"
    labels = dict((v, label) for label, v in qwen2["choices"])
    assert labels["qwen2-57b-a14b"] == "qwen2-57b-a14b · full model"
    assert labels["deepseek-v2-lite"] == "deepseek-v2-lite · sizes only"
    assert labels["native"] == "native · own sizes"
    assert qwen2["info"] == ("“full model”: qwen2-57b-a14b, which spice-mini-qwen2 is a miniature of, routing and "
                             "all; “sizes only”: that model's sizes on spice-mini-qwen2's routing")
    assert all("sizes" in label for label, _ in tiny["choices"]) and "full model" not in tiny["info"]


def test_about_says_which_routing_each_shapes_times_come_from(two):
    text = _component(two.demo, "about-routing")["value"]
    assert "| qwen2-57b-a14b | **spice-mini-qwen2**: its own routing" in text
    assert "| deepseek-v2-lite | tiny-deepseek, spice-mini-qwen2: deepseek-v2-lite's sizes on that model's" in text


def test_one_model_has_no_picker_and_keeps_its_paths(tmp_path):
    engine = engine_mod.SpiceEngine.load(build_tiny("deepseek_v2", tmp_path / "tiny"), device="cpu")
    import app

    demo, ctx = app.build_app(engine)
    try:
        ids = {c.get("props", {}).get("elem_id") for c in demo.config["components"]}
        assert "chat-model" not in ids and "sweep-model" not in ids and ctx.models == ()
        names = {d.get("api_name") for d in demo.config["dependencies"]}
        assert {"chat", "sweep", "settings", "stop", "new_chat", "engine_status", "sweep_stop"} <= names
        assert not any("tiny" in str(n) for n in names)
    finally:
        ctx.exports.cleanup()


@pytest.mark.browser
def test_picking_the_other_model_in_the_browser_opens_its_chat(browser, two):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    page.goto(two.url, wait_until="load")
    page.wait_for_selector("#chat-model input")
    page.click("#chat-model input")
    page.click("#chat-model [role=option]:has-text('spice-mini-qwen2')")
    page.wait_for_url("**/spice-mini-qwen2")
    page.wait_for_selector("#spice-msg textarea")
    assert "Chat with spice-mini-qwen2" in page.inner_text("body")
    assert page.input_value("#chat-model input").startswith("spice-mini-qwen2")
    page.close()


def test_switching_model_keeps_what_the_visitor_set_where_the_other_model_takes_it(two):
    """Regression (issue 24, defect 11): the picker opened the other model's chat with every setting at its
    default. Now what the visitor changed travels, a value the model lacks is brought to the nearest it has or
    refused with a note naming the control, and what was left at the default takes the new page's default."""
    from dataclasses import replace

    from pages.chat_switch import Handoff, carried
    from pages.common import default_settings

    tiny, qwen2 = (e.info() for e in two.ctx.engine.engines)
    old_defaults = default_settings(tiny)
    changed = replace(old_defaults, cache_frac=0.5, tau_approx=0.05, lore_rank=16, policy="lru", temperature=0.7)
    # The Qwen2 page as a shipped model has it: LoRE ranks 1, 2, 4, and (here) no lru.
    target = replace(qwen2, lore_ranks=(1, 2, 4), policies=tuple(p for p in qwen2.policies if p != "lru"))
    new_defaults = replace(default_settings(target), lore_rank=4)
    settings, kept, notes = carried(Handoff(tiny.model_name, old_defaults, changed), target, new_defaults,
                                    two.ctx.limits)
    assert (settings.cache_frac, settings.tau_approx, settings.temperature, settings.lore_rank) == (0.5, 0.05, 0.7, 4)
    assert settings.policy == new_defaults.policy and settings.shape == "qwen2-57b-a14b"     # its own, the default
    assert kept == ["cache_frac", "tau_approx", "temperature"]
    assert any(n.startswith("⚠ Not kept: Policy") for n in notes), notes
    assert not any("LoRE" in n for n in notes)       # 16 is the old default: the new page's default stands
    settings, kept, notes = carried(Handoff(tiny.model_name, old_defaults, replace(old_defaults, lore_rank=8)),
                                    target, new_defaults, two.ctx.limits)
    assert settings.lore_rank == 4 and kept == ["lore_rank"] and "LoRE rank: 8 is not one of" in notes[0]


@pytest.mark.browser
def test_picking_the_other_model_keeps_the_settings_and_the_navigation_stays_on_it(browser, two):
    """Regression (issue 24, defect 11): after the picker the cache was back at its default, and the navigation
    bar's Home and Sweep still opened the first model's pages, on its own pages and on the shared ones."""
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(30_000)
    try:
        page.goto(two.url, wait_until="load")
        box = page.locator("#ctl-cache input[type=number]")
        box.click()
        box.press("Control+A")
        box.press_sequentially("0.5", delay=40)
        box.press("Enter")
        page.click("#chat-model input")
        page.click("#chat-model [role=option]:has-text('spice-mini-qwen2')")
        page.wait_for_url("**/spice-mini-qwen2")
        page.wait_for_function("() => (document.querySelector('#spice-settings-note') || {innerText: ''})"
                               ".innerText.includes('Kept from')")
        assert page.input_value("#ctl-cache input[type=number]") == "0.5"
        assert "cache 50%" in page.inner_text("#spice-stats")
        links = "() => Object.fromEntries([...document.querySelectorAll('nav a')].map(a => [a.innerText, a.href]))"
        for path in ("spice-mini-qwen2", "trace"):
            page.goto(two.url + path, wait_until="load")
            page.wait_for_function(f"() => (({links})()['Sweep'] || '').endsWith('/sweep-spice-mini-qwen2')")
            assert page.evaluate(links)["Home"] == two.url + "spice-mini-qwen2"
    finally:
        page.close()


@pytest.mark.browser
def test_the_engine_busy_line_sits_under_the_message_box_on_a_desktop(browser, two):
    """Regression (issue 24, defect 11): the line saying the engine works for another visitor was the page's
    last element (1,400 px down at 1440x900), below the fold, where nobody looks when they press Send."""
    from spice_core.api import RunSettings

    held = HeldReply()
    two.ctx.runner.start("another visitor", RunSettings(max_new_tokens=100), lambda: held)
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(30_000)
    try:
        page.goto(two.url, wait_until="load")
        page.wait_for_function("() => (document.querySelector('#engine-status') || {innerText: ''})"
                               ".innerText.includes('engine is busy')")
        status, message = page.locator("#engine-status").bounding_box(), page.locator("#spice-msg").bounding_box()
        assert status["y"] >= 0 and status["y"] + status["height"] <= 900, status
        assert 0 <= status["y"] - (message["y"] + message["height"]) < 40, (status, message)
    finally:
        held.release.set()
        page.close()
        assert two.ctx.runner.wait_idle(10)


# Whether the option list of the menu at `sel` is drawn.
_MENU_JS = """(sel) => {
  const input = document.querySelector(`${sel} input[role=combobox]`);
  return {open: !!document.getElementById(input.getAttribute('aria-controls')),
          expanded: input.getAttribute('aria-expanded')};
}"""
# Every element the focus lands on from now, into window.spiceStops.
_RECORD_STOPS_JS = """() => {
  window.spiceStops = [];
  document.addEventListener('focusin', (e) => window.spiceStops.push({
    name: e.target.getAttribute('aria-label') || e.target.id || e.target.tagName,
    modebar: !!e.target.closest('.modebar'), box: !!e.target.closest('#spice-msg')}));
}"""


@pytest.mark.browser
def test_tab_closes_the_menu_it_leaves_and_skips_the_charts_toolbars(browser, two):
    """Regression (issue 24, defect 10): Tab out of the Model or Policy menu left its option list open over the
    controls below (Gradio's keydown handler reopened it after the blur), and each chart's modebar put its eight
    buttons in the tab order (24 stops on the chat page before the footer)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    try:
        page.goto(two.url, wait_until="load")
        page.wait_for_selector("#spice-heatmap .modebar-btn", state="attached")
        for menu, key in (("#chat-model", "Tab"), ("#ctl-policy", "Tab"), ("#ctl-policy", "Shift+Tab")):
            page.focus(f"{menu} input")
            assert page.evaluate(_MENU_JS, menu)["open"], f"{menu} opens when it takes the focus"
            page.keyboard.press(key)
            page.wait_for_timeout(300)               # Gradio's handler reopened it a tick after the blur
            state = page.evaluate(_MENU_JS, menu)
            assert not state["open"] and state["expanded"] == "false", (menu, key, state)
        page.focus("#spice-msg textarea")
        page.evaluate(_RECORD_STOPS_JS)
        for _ in range(8):                           # once round the page (about 40 stops), back to the box
            for _ in range(10):
                page.keyboard.press("Tab")
            if page.evaluate("() => window.spiceStops.some((s) => s.box)"):
                break
        stops = page.evaluate("() => window.spiceStops")
        assert any(s["box"] for s in stops), " > ".join(s["name"] for s in stops)
        assert not [s for s in stops if s["modebar"]], " > ".join(s["name"] for s in stops)
        # Still there for the mouse: the toolbars' buttons, on every chart.
        for chart in ("#spice-heatmap", "#spice-prefetch", "#spice-gantt"):
            assert page.locator(f"{chart} .modebar-btn").count() >= 6, chart
    finally:
        page.close()
