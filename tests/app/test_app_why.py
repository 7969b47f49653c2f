"""Settings that do nothing visible say why, in words on the page (issue 24, defect 8): at the defaults the
lookahead stops at depth 0 because copies outlast a layer, so max lookahead and τ_prefetch change little;
the numbers row says so under its cards, not only in a tooltip (touch has no hover), and says why τ_approx
can be modeled faster than resident."""
import re

import pytest

from app_helpers import SHIPPED, chat_inputs, close, serve_shipped


def _visible_text(stats_html: str) -> str:
    return re.sub(r"<[^>]+>", " ", stats_html)       # attribute text (tooltips) goes with the tags


def test_the_numbers_row_says_why_lookahead_settings_change_little_at_the_defaults():
    from gradio_client import Client

    if not (SHIPPED / "config.json").exists():
        pytest.skip("needs the shipped model")
    served = serve_shipped()
    try:
        client = Client(served.url, verbose=False)
        exact, lossy = (client.predict(*chat_inputs("Tell me a story about a cat.", max_new_tokens=16,
                                                    live_panels=False, tau_approx=tau), api_name="/chat")
                        for tau in (0.0, 0.2))
        client.close()
    finally:
        close(served)
    text = _visible_text(exact[2])
    assert re.search(r"lookahead\s+0\.0 of 4", text), text           # the defaults' profile: copies outlast layers
    assert "Max lookahead and τ_prefetch change little here" in text and "hardware profile" in text, text
    assert "computes less than the expert itself" not in text
    assert "computes less than the expert itself" in _visible_text(lossy[2])
