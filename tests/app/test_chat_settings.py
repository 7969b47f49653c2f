"""The chat page's numbered settings requests (pages.chat_settings): each field's requests apply once, in
order, whichever event reads the box first; refused ones never apply."""
import json
from dataclasses import replace

from fake_engine import FakeEngine
from pages.chat_settings import Requests, parse
from pages.common import default_settings
from pages.limits import Limits

INFO = FakeEngine().info()


def _box(**entries) -> str:
    return json.dumps({name: {"v": v, "seq": seq} for name, (v, seq) in entries.items()})


def _take(req: Requests, raw, current=None):
    return req.take(INFO, Limits(), current or default_settings(INFO), raw)


def test_each_request_applies_once_in_number_order():
    req = Requests()
    settings, applied, refused = _take(req, _box(cache_frac=("0.5", 2), tau_approx=("0.05", 1)))
    assert (settings.cache_frac, settings.tau_approx, applied, refused) == (0.5, 0.05, ["tau_approx", "cache_frac"], [])
    # A later read holds the same requests: nothing applies twice (a value changed since by the API stays).
    again, applied, _ = _take(req, _box(cache_frac=("0.5", 2), tau_approx=("0.05", 1)),
                              current=replace(settings, cache_frac=0.75))
    assert again.cache_frac == 0.75 and applied == []


def test_an_older_read_arriving_late_never_undoes_a_newer_one():
    req = Requests()
    newer, _, _ = _take(req, _box(cache_frac=("0.7", 5)))
    older, applied, _ = _take(req, _box(cache_frac=("0.65", 4)), current=newer)
    assert older.cache_frac == 0.7 and applied == []


def test_a_refused_value_never_applies_and_is_reported_once():
    """Regression (issue 24, defect 1): a refused number clamped by the browser to the slider's end applied later."""
    req = Requests()
    settings, applied, refused = _take(req, _box(tau_approx=("0.9", 1)))
    assert settings.tau_approx == default_settings(INFO).tau_approx and refused == ["tau_approx"]
    why = req.pop_refusals()
    assert "τ_approx" in why["tau_approx"] and "[0, 0.2]" in why["tau_approx"], why
    assert req.pop_refusals() == {}
    _, _, refused = _take(req, _box(cache_frac=("", 2)))
    assert refused == ["cache_frac"] and "empty" in req.pop_refusals()["cache_frac"]


def test_malformed_boxes_and_unknown_fields_are_left_out():
    for raw in ("", "not json", "[1, 2]", json.dumps({"evil": {"v": 1, "seq": 1}}),
                json.dumps({"cache_frac": {"v": 0.5, "seq": "1"}}), json.dumps({"cache_frac": {"v": 0.5, "seq": True}}),
                None, 12, "x" * 10_000):
        assert parse(raw) == [], raw


def test_the_settings_api_names_its_parameters(client):
    """Regression (issue 24, defect 11): /settings took param_0 … param_10."""
    from pages.common import SETTING_FIELDS

    api = client.view_api(return_format="dict", print_info=False)["named_endpoints"]
    names = [p["parameter_name"] for p in api["/settings"]["parameters"]]
    assert names == list(SETTING_FIELDS), names
    chat = [p["parameter_name"] for p in api["/chat"]["parameters"]]
    assert chat[2:13] == list(SETTING_FIELDS), chat
