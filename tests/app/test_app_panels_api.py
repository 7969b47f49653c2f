"""The chat's panels through the API (gradio_client against the app launched in-process, fake engine): each
figure goes out once and then only its changes while a reply streams, an API client gets every figure whole at
the end, and a new reply takes the last reply's panels down at once."""
from __future__ import annotations

import json
import time

import pytest

from app_helpers import chat_inputs, plot_json


def test_panels_send_each_figure_once_then_only_changes(served, client):
    """Regression: whole figures re-sent at 2 Hz kept the browser busy 31 of 33 s (typing and Stop lagged)."""
    served.engine.token_delay_s = 0.02
    try:
        t_start = time.monotonic()
        job = client.submit(*chat_inputs("A long one", max_new_tokens=200), api_name="/chat")
        figures_sent, last, deltas = [0, 0, 0], [None, None, None], []
        for update in job:                 # each update repeats the latest value of every output
            for i in range(3):
                plot = update[3 + i].get("plot") if isinstance(update[3 + i], dict) else None
                if plot is not None and not json.loads(plot)["data"]:    # the placeholder the reply starts with
                    continue
                if plot is not None and plot != last[i]:
                    figures_sent[i], last[i] = figures_sent[i] + 1, plot
            if isinstance(update[6], str) and update[6] and (not deltas or json.loads(update[6]) != deltas[-1][1]):
                deltas.append((time.monotonic(), json.loads(update[6])))
        job.result()
    finally:
        served.engine.token_delay_s = 0.004
    # ~4 s of streaming: each figure once (the client sees the last value per update), then changes, and each whole
    # again in the last update (an API client cannot apply the changes)
    assert all(1 <= n <= 2 for n in figures_sent), figures_sent
    assert len(deltas) >= 2, "panel changes kept coming while the reply streamed"
    assert set(deltas[0][1]["panels"]) == {"heatmap", "prefetch", "gantt"}
    # At most one change a second (the last, at the reply's end, aside), counted rather than timed between arrivals:
    # a busy client receives updates in bunches, but it cannot receive more than the server sent.
    from pages.chat import DELTA_INTERVAL_S
    streamed_s = deltas[-1][0] - t_start
    assert len(deltas) - 1 <= streamed_s / DELTA_INTERVAL_S + 1, (len(deltas), streamed_s)


def test_an_api_client_gets_every_panel_whole_at_the_end_of_a_live_reply(served, client, monkeypatch):
    """Regression (review): with live panels on, /chat's last update sent the heatmap whole but the prefetch
    timeline and lane chart only as changes the page's script applies, so an API client kept the figures of the
    reply's first tokens. The last update carries all three, drawn from every token."""
    monkeypatch.setattr(served.engine, "token_delay_s", 0.02)      # long enough for the live figures to go out
    final = client.predict(*chat_inputs("A long one", max_new_tokens=120, live_panels=True), api_name="/chat")
    figs = [plot_json(final[i]) for i in (3, 4, 5)]
    assert "token 119" in json.dumps(figs[0]["layout"]), "the heatmap is not the last token's"
    # The token axis (the lookahead depth per token, the lower plot), not the upper plot's ms (review).
    tokens = [x for t in figs[1]["data"] if t.get("xaxis") == "x2" for x in t.get("x") or []]
    assert max(tokens, default=-1) == 119, "the prefetch timeline is not the whole reply's"


@pytest.mark.parametrize("live_panels", [False, True])
def test_a_new_reply_replaces_the_last_replys_panels_at_once(served, client, live_panels):
    """Regression (review): a new reply's first update left the last reply's panels up (with live panels off, for
    the whole reply), beside a numbers row already showing the new run; nothing said they were old."""
    client.predict(*chat_inputs("first", max_new_tokens=4, live_panels=live_panels), api_name="/chat")
    job = client.submit(*chat_inputs("second", max_new_tokens=4, live_panels=live_panels), api_name="/chat")
    first = next(iter(job))
    job.result()
    for i in (3, 4, 5):
        fig = plot_json(first[i])
        assert fig["data"] == [] and "this reply's panel is drawn" in json.dumps(fig["layout"]), fig
