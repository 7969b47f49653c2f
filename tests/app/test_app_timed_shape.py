"""Every byte count is at the shape its time is for (issue 24, defect 5). Regression: the numbers row said
"copied 1.8 MB per token, own sizes" beside a TPOT modeled for DeepSeek-V2-Lite, whose copies the run note put
at 1.6 GB and the trace explorer's table at the timed shape. Now the cards, the run note, the explorer's cards,
its comparison and the sweep show the timed shape's bytes, the native figure as secondary."""
import re
from types import SimpleNamespace

import pytest

from app_helpers import SHIPPED
from pages.chat_text import run_body, stats_html
from pages.live import LiveRun
from pages.sweep_table import setting_row
from pages.trace_explorer import compare_html, per_token_series, summary_html
from spice_core.api import RunSettings, format_bytes

SHAPE = "deepseek-v2-lite"


@pytest.fixture(scope="module")
def shipped_run():
    if not SHIPPED.exists():
        pytest.skip("the shipped model is not in assets/spice-mini")
    from spice_core.engine import SpiceEngine

    engine = SpiceEngine.load(None, device="cpu")
    settings = RunSettings(policy="lru", cache_frac=0.25, max_new_tokens=8, shape=SHAPE)
    run = engine.start_prompt("Tell me a story about a cat and a ball", settings)
    live = LiveRun.for_engine(engine.info())
    for step in run:
        live.add(step)
    summary = engine.get_summary(run.run_id)
    assert summary.timing == "modeled" and summary.shape == SHAPE
    assert summary.shape_bytes_per_token > 100 * summary.bytes_per_token > 0, "the shapes must differ to test this"
    return engine, settings, live, summary, engine.get_events(run.run_id)


def _card(html: str, key: str) -> tuple[str, str]:
    m = re.search(rf"<div class='k'>{key}</div><div class='v'>([^<]*)</div><div class='s'[^>]*>([^<]*)<", html)
    assert m, html
    return m.group(1), m.group(2)


def test_the_copied_card_shows_the_timed_shapes_bytes_and_the_native_ones_under_them(shipped_run):
    engine, settings, live, summary, _ = shipped_run
    value, sub = _card(stats_html(live, settings, engine.info(), summary=summary), "copied per token")
    assert value == format_bytes(summary.shape_bytes_per_token)
    assert f"native {format_bytes(summary.bytes_per_token)}" in sub
    assert live.shape_bytes_per_token == pytest.approx(summary.shape_bytes_per_token)


def test_the_run_note_puts_the_timed_shapes_bytes_first(shipped_run):
    _, _, _, summary, _ = shipped_run
    body = run_body(summary, SimpleNamespace(cancel_reason=""))
    assert (f"{format_bytes(summary.shape_bytes_per_token)} copied per token at {SHAPE} "
            f"({format_bytes(summary.bytes_per_token)} at its own sizes)") in body


def test_the_trace_explorer_cards_and_comparison_agree_with_its_per_token_chart(shipped_run):
    _, _, _, summary, events = shipped_run
    value, sub = _card(summary_html(summary), "copied")
    assert value == format_bytes(summary.shape_bytes_per_token) and format_bytes(summary.bytes_per_token) in sub
    # The explorer's per-token chart (trace events, timed shape): its decode tokens' mean is the card's value.
    tokens, _, _, mb = per_token_series(events)
    assert sum(mb[1:]) / (len(tokens) - 1) == pytest.approx(summary.shape_bytes_per_token / 1e6)
    rows = re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td>", compare_html(summary, summary))
    assert ("copied / token (timed shape)", format_bytes(summary.shape_bytes_per_token)) in rows
    assert ("copied / token (native)", format_bytes(summary.bytes_per_token)) in rows


def test_the_per_token_csv_gives_both_byte_counts_in_named_columns(shipped_run, tmp_path):
    import pandas as pd

    engine, _, _, summary, _ = shipped_run
    csv = pd.read_csv(engine.export_csv(summary.run_id, tmp_path))
    decode = csv[csv["index"] >= 1]
    assert decode["shape_bytes_copied"].mean() == pytest.approx(summary.shape_bytes_per_token)
    assert decode["bytes_copied"].mean() == pytest.approx(summary.bytes_per_token)


def test_the_sweeps_megabytes_per_token_are_the_timed_shapes(shipped_run):
    _, settings, _, summary, _ = shipped_run
    row = setting_row(settings, [(((8, 8), 1.0), summary)], "modeled")
    assert row["mb_per_token"] == pytest.approx(summary.shape_bytes_per_token / 1e6)
