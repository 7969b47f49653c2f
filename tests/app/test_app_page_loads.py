"""A page load says nothing to screen readers, on every page (regression: Gradio's status tracker read "Loading",
then "Complete" out at every load of the trace explorer, the sweep and About), while what a visitor starts (a reply,
Auto, a sweep, a tune) still shows and says its progress. Checked on the app's Blocks config, as the browser gets
it: Gradio announces an event unless its progress is hidden."""
from __future__ import annotations

import pytest

import app
from fake_engine import FakeEngine


@pytest.fixture(scope="module")
def config():
    demo, ctx = app.build_app(FakeEngine())
    yield demo.get_config_file(), demo
    ctx.exports.cleanup()


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
    assert {"on_load", "list_others", "compare", "show", "restore"} <= names, names
    loud = [(d["id"], demo.fns[d["id"]].name, d["show_progress"]) for d in loaded if d["show_progress"] != "hidden"]
    assert not loud, f"these run at a page load and announce their progress: {loud}"


def test_what_a_visitor_starts_still_shows_and_says_its_progress(config):
    cfg, demo = config
    shown = {demo.fns[d["id"]].name for d in cfg["dependencies"] if d["show_progress"] != "hidden"}
    assert {"chat_browser", "auto", "run"} <= shown, shown      # a reply, Auto, the sweep's and the tune's run
    runs = [d for d in cfg["dependencies"] if demo.fns[d["id"]].name == "run"]
    assert len(runs) == 2 and all(d["show_progress"] != "hidden" for d in runs)
