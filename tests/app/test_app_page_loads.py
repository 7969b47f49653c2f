"""A page load says nothing to screen readers, on every page (regression: Gradio's status tracker read "Loading",
then "Complete" out at every load of the trace explorer, the sweep and About), while what a visitor starts (a reply,
Auto, a sweep, a tune, a pick of a run or a benchmark) still shows and says its progress. Checked on the app's
Blocks config, as the browser gets it: Gradio announces an event unless its progress is hidden."""
from __future__ import annotations

import pytest

import app
from fake_engine import FakeEngine


@pytest.fixture(scope="module")
def config():
    demo, ctx = app.build_app(FakeEngine())
    yield demo.get_config_file(), demo
    ctx.exports.cleanup()


def _chained(deps: list[dict], started: list[dict]) -> list[dict]:
    """``started`` and every dependency chained after them (``.then``, ``.success``), in turn."""
    out = list(started)
    while more := [d for d in deps if d not in out and d["trigger_after"] in {o["id"] for o in out}]:
        out += more
    return out


def _set_off_by_loads(deps: list[dict]) -> list[dict]:
    """The dependencies a page load runs: the load listeners, what they chain, and the change listeners of the
    components they fill, in turn."""
    quiet = [d for d in deps if any(event == "load" for _, event in d["targets"])]
    while True:
        ids = {d["id"] for d in quiet}
        filled = {o for d in quiet for o in d["outputs"]}
        more = [d for d in deps if d["id"] not in ids and (
            d["trigger_after"] in ids or any(e == "change" and t in filled for t, e in d["targets"]))]
        if not more:
            return quiet
        quiet += more


def test_every_event_a_page_load_runs_hides_its_progress(config):
    cfg, demo = config
    loaded = _set_off_by_loads(cfg["dependencies"])
    names = {demo.fns[d["id"]].name for d in loaded}
    # The loads of the trace explorer, the sweep and About, and the views the trace explorer's load fills in turn.
    assert {"on_load", "list_others", "compare", "show_drawn", "restore"} <= names, names
    loud = [(d["id"], demo.fns[d["id"]].name, d["show_progress"]) for d in loaded if d["show_progress"] != "hidden"]
    assert not loud, f"these run at a page load and announce their progress: {loud}"


def test_what_a_visitor_starts_still_shows_and_says_its_progress(config):
    cfg, demo = config
    shown = {demo.fns[d["id"]].name for d in cfg["dependencies"] if d["show_progress"] != "hidden"}
    assert {"chat_browser", "auto", "run"} <= shown, shown      # a reply, Auto, the sweep's and the tune's run
    runs = [d for d in cfg["dependencies"] if demo.fns[d["id"]].name == "run"]
    assert len(runs) == 2 and all(d["show_progress"] != "hidden" for d in runs)


# The pickers whose views a visitor's pick draws: the trace explorer's run and second run, About's benchmark file.
PICKERS = ("trace-run", "trace-compare-run", "about-bench-pick")


@pytest.mark.parametrize("picker", PICKERS)
def test_a_visitors_pick_shows_and_says_its_progress(config, picker):
    """Regression: the trace explorer's run pick and About's benchmark pick showed no progress while their views
    were drawn. The views hung on the picker's change, which a page load sets off too, so `quiet_page_loads`
    silenced them for a visitor's pick as well. Whatever a pick sets off (its change and input listeners, and what
    they chain) now shows its progress, and draws the views."""
    cfg, demo = config
    elem = {c["id"]: c["props"].get("elem_id") for c in cfg["components"]}
    deps = cfg["dependencies"]
    started = [d for d in deps if any(elem.get(t) == picker and e in ("change", "input", "select")
                                      for t, e in d["targets"])]
    chain = _chained(deps, started)
    names = [demo.fns[d["id"]].name for d in chain]
    assert set(names) & {"show", "show_drawn", "compare"}, names       # About's view; the trace explorer's two
    silent = [demo.fns[d["id"]].name for d in chain if d["show_progress"] == "hidden"]
    assert not silent, f"a pick on {picker} sets off these without progress: {silent}"
