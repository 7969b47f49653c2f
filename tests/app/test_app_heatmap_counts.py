"""The heatmap's hover counts arrive when a reply ends with live panels on (issue 24, defect 7): the reply's
end sent only a change, which carries no counts, so "hover for counts" (About) showed "mostly prefetched"."""
import json

from app_helpers import settings_inputs


def _plot(value) -> dict | None:
    if value is None or not hasattr(value, "plot"):
        return None
    return json.loads(value.plot)


def test_the_last_heatmap_of_a_live_reply_carries_its_counts(served, monkeypatch):
    from pages import chat
    from pages.chat import PANELS, ChatPage, ChatSession

    monkeypatch.setattr(chat, "BASE_DELAY_S", 0.01)      # the live figures go out at once, then only changes
    monkeypatch.setattr(chat, "DELTA_INTERVAL_S", 0.05)
    page = ChatPage(served.ctx)
    outputs = list(page.chat("a story", [], *settings_inputs(max_new_tokens=300), True, False, ChatSession()))
    assert any(out[6] not in ("", None) and not hasattr(out[6], "plot") and "panels" in str(out[6])
               for out in outputs[:-1]), "no live changes were sent: the reply ended before its figures were drawn"
    heatmaps = [_plot(out[3 + PANELS.index("heatmap")]) for out in outputs]
    last = next(h for h in reversed(heatmaps) if h is not None)
    right = last["data"][1]
    assert "customdata" in right and "hit %{customdata[0]}" in right["hovertemplate"], right.get("hovertemplate")
    assert sum(map(sum, (map(sum, row) for row in right["customdata"]))) > 0
