"""The trace explorer's "From token" stays within the run. Regression: it had no maximum, so 100000 drew an empty
timeline titled "no intervals for tokens 100000–100015"; now a first token past the run's end shows its last
tokens, and the box says the run's range and what it moved."""
from __future__ import annotations

import json

from app_helpers import chat_inputs
from pages.trace_explorer import fit_window


def test_fit_window_keeps_a_first_token_inside_the_run_and_moves_one_past_its_end():
    assert fit_window(3, 16, 23) == (3, 16, "this run has tokens 0–23")
    first, count, note = fit_window(100000, 16, 23)
    assert (first, count) == (8, 16)                      # the run's last 16 tokens
    assert note.startswith("⚠") and "100,000" in note and "last token (23)" in note and "8–23" in note
    assert fit_window(100000, 64, 23)[:2] == (0, 64)      # a window longer than the run starts at its first token
    assert fit_window(5, 16, None) == (5, 16, "")         # a run without per-token events: nothing to bound


def test_from_token_past_the_end_of_a_run_draws_its_last_tokens_and_says_so(served, client):
    client.predict(*chat_inputs("a window", max_new_tokens=10), api_name="/chat")
    run_id = served.engine.generations[-1].run_id
    out = client.predict(run_id, 100000, 16, api_name="/trace_run")
    timeline, first, count = out[3], out[-2], out[-1]
    assert "no intervals" not in json.loads(timeline["plot"])["layout"].get("title", {}).get("text", "")
    assert any(t["type"] == "bar" for t in json.loads(timeline["plot"])["data"])
    assert first["value"] == 0 and first["maximum"] == 9 and count == 16, first
    assert "past this run's last token (9)" in first["info"], first
    inside = client.predict(run_id, 4, 16, api_name="/trace_run")[-2]
    assert inside["value"] == 4 and inside["info"] == "this run has tokens 0–9", inside
