"""The chat page's numbered settings requests (pages.chat_settings): each field's requests apply once, in
order, whichever event reads the box first; refused ones never apply."""
import json
from dataclasses import replace

import pytest

from fake_engine import FakeEngine
from pages.chat_settings import Requests, parse
from pages.common import (FIELD_CONTROLS, SETTING_FIELDS, default_settings, settings_from_values, slider_ranges,
                          spice_error_text)
from pages.limits import Limits
from spice_core.errors import ConfigError

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
    why = req.pop_notes()
    assert "τ_approx" in why["tau_approx"] and "0 to 0.2" in why["tau_approx"], why
    assert req.pop_notes() == {}
    _, _, refused = _take(req, _box(cache_frac=("", 2)))
    assert refused == ["cache_frac"] and "empty" in req.pop_notes()["cache_frac"]


@pytest.mark.parametrize("field, typed, kept, words", [
    ("cache_frac", "5", "0.25", "0.05 to 1"), ("cache_frac", "-1", "0.25", "0.05 to 1"),
    ("cache_frac", "1e9", "0.25", "0.05 to 1"), ("cache_frac", "0", "0.25", "0.05 to 1"),
    ("cache_frac", "nan", "0.25", "0.05 to 1"), ("max_lookahead", "0", "4", "1 to 16"),
    ("max_lookahead", "100", "4", "1 to 16"), ("max_new_tokens", "0", "192", "1 to 512"),
    ("max_new_tokens", "100000", "192", "1 to 512"), ("temperature", "50", "0", "0 to 2"),
])
def test_every_out_of_range_number_says_what_stays_and_the_range(field, typed, kept, words):
    """Regression (QA, defect 3): cache 5, -1 or 1e9, lookahead 0 or 100, max new tokens 0 or 100000 were refused
    where the visitor could not see it; temperature 50 said so. Each now has one note naming the control, what was
    typed, the value that stays and the slider's range."""
    req = Requests()
    settings, applied, refused = _take(req, _box(**{field: (typed, 1)}))
    assert settings == default_settings(INFO) and refused == [field] and applied == []
    note = req.pop_notes()[field]
    assert note.startswith("⚠ Not applied: " + FIELD_CONTROLS[field]) and f"{typed} " in note, note
    assert f"stays at {kept} " in note and words in note, note


@pytest.mark.parametrize("field, typed, applied_value, words", [
    ("cache_frac", "0.333333", 0.35, "steps of 0.05"), ("max_lookahead", "2.5", 3, "whole numbers"),
    ("tau_approx", "0.0123", 0.01, "steps of 0.005"), ("temperature", "0.73", 0.75, "steps of 0.05"),
    ("max_new_tokens", "100.5", 101, "whole numbers"),
])
def test_a_number_between_steps_applies_the_nearest_step_and_says_so(field, typed, applied_value, words):
    """Regression (QA, defect 3): 0.333333 for the cache left "0.333333" in the box, 0.35 on the slider and 33% in
    the numbers row; lookahead 2.5 was refused without a word the visitor could see. The slider's nearest step applies
    (what the slider itself shows), and a note says so."""
    req = Requests()
    settings, applied, refused = _take(req, _box(**{field: (typed, 1)}))
    assert getattr(settings, field) == applied_value and type(getattr(settings, field)) is type(applied_value)
    assert applied == [field] and refused == []
    note = req.pop_notes()[field]
    assert typed in note and f"so {applied_value:g} applies" in note and words in note, note
    _take(req, _box(**{field: (str(applied_value), 2)}))
    assert req.pop_notes() == {}            # on a step: applied as typed, nothing to say


def test_the_cache_slider_starts_at_the_smallest_size_each_model_runs_with():
    """Regression (QA, defect 2): GPU cache size 0 was on the slider and the engine refused it, whatever the model
    (one layer's top-k experts must fit). The slider starts at the first step that holds them, per model."""
    small = FakeEngine(n_layers=8, n_experts=16, top_k=4).info()         # 4 of 112 experts: 3.6%
    large_k = FakeEngine(n_layers=3, n_experts=8, top_k=4).info()        # 4 of 16: 25%
    assert slider_ranges(small)["cache_frac"] == (0.05, 1.0, 0.05)
    assert slider_ranges(large_k)["cache_frac"] == (0.25, 1.0, 0.05)
    assert default_settings(large_k).cache_frac >= 0.25
    for info in (small, large_k):
        low = slider_ranges(info)["cache_frac"][0]
        assert low * len(info.moe_layers) * info.n_experts >= info.top_k          # holds one layer's top-k
        assert (low - 0.05) * len(info.moe_layers) * info.n_experts < info.top_k   # the step below does not
    with pytest.raises(ConfigError, match=r"GPU cache size: cache_frac=0.0 is out of range: use a value in \[0.05, 1\]"):
        settings_from_values(small, {f: getattr(default_settings(small), f) for f in SETTING_FIELDS} | {"cache_frac": 0})


def test_the_engines_cache_refusal_reads_in_the_sliders_terms(engines):
    """Regression (QA, defect 2): "cache budget 0.0000 GB is smaller than one layer's top-6 experts (0.0001 GB):
    raise GPU cache size to >= 0.0036". The refusal is the engine's own, so a change of its wording that the page
    no longer reads fails here (it did once: the sizes became "1.11 kB")."""
    from spice_core.api import RunSettings

    eng = engines["deepseek_v2"]
    with pytest.raises(ConfigError) as refused:
        eng.start_ids([1, 2, 3], RunSettings(policy="lru", cache_frac=0.01))
    need = float(str(refused.value).split("--cache-frac to >= ")[1].split()[0])
    said = spice_error_text(refused.value)
    assert said.startswith("GPU cache size is too small for this model"), said
    assert "B" not in said and f"{need:.2%} of all experts" in said and f"at least {need:g}" in said, said
    other = spice_error_text(ConfigError("cache budget 0.0012 GB leaves room for 3 experts after 0.0400 GB of "
                                         "draft/LoRE memory, fewer than top-6: raise --cache-frac"))
    assert "1.20 MB" in other and "40.0 MB" in other and "GPU cache size" in other, other


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
