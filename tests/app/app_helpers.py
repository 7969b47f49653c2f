"""Helpers for the app tests: serving the app in-process, endpoint inputs, reading chat notes.

`chat_inputs()` lists the /chat endpoint's inputs in order, so a test only names what it changes.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

# Heartbeats every 0.2 s (default 15 s): a closed client is noticed, and closes, at once.
os.environ.setdefault("GRADIO_HEARTBEAT_INTERVAL", "0.2")

ROOT = Path(__file__).resolve().parents[2]
# The system's chromium, launched the way FACTS.md says works offline (never a downloaded browser).
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

import app  # noqa: E402
from fake_engine import FakeEngine  # noqa: E402
from pages.common import AppContext  # noqa: E402

CHAT_DEFAULTS = dict(policy="spice", cache_frac=0.25, tau_prefetch=0.2, tau_approx=0.0, max_lookahead=4,
                     lore_rank=16, cpu_lane=True, profile="rtx4090-pcie4x16", shape="deepseek-v2-lite",
                     max_new_tokens=24, temperature=0.0, live_panels=True, check_exact=False)


def chat_inputs(message, history=None, **overrides) -> list:
    values = CHAT_DEFAULTS | overrides
    return [message, history or [], *values.values()]


def settings_inputs(**overrides) -> list:
    values = CHAT_DEFAULTS | overrides
    return list(values.values())[:11]


@dataclass
class Served:
    demo: object
    ctx: AppContext
    engine: FakeEngine
    url: str

    def wait_idle(self, timeout_s: float = 10.0) -> bool:
        return self.ctx.runner.wait_idle(timeout_s)


def serve(engine: FakeEngine, **kwargs) -> Served:
    demo, ctx = app.build_app(engine, orphan_after_s=kwargs.pop("orphan_after_s", 1.0), **kwargs)
    demo.launch(server_name="127.0.0.1", server_port=None, prevent_thread_lock=True, quiet=True,
                **app.launch_kwargs())
    return Served(demo, ctx, engine, demo.local_url)


SHIPPED = ROOT / "assets" / "spice-mini"
# The tuner's evaluation in the app tests, far smaller than the app's (pages.tuning.APP_EVAL): what they test is
# the pages around a tune (its progress, plot, table, pick and hand-off to the chat), not the pick's statistics.
# Each of its 19 settings is still measured; a tune of the shipped model takes 10-20 s on 2 cores (45-60 s with 32
# teacher-forced tokens, 6 greedy and 12 timed), and its pick is still a lossy one that meets the budget.
TUNE_EVAL = {"max_tokens": 8, "n_prompts": 1, "new_tokens": 2, "speed_tokens": 4}


def serve_shipped(fake_delay_s: float = 0.02) -> Served:
    """The app on the shipped model (the real engine), or on the fake engine where the model is absent."""
    if (SHIPPED / "config.json").exists():
        from spice_core.engine import SpiceEngine
        return serve(SpiceEngine.load(None, device="cpu"))
    return serve(FakeEngine(token_delay_s=fake_delay_s))


def close(served: Served) -> None:
    served.demo.close()
    served.ctx.exports.cleanup()


def last_notes(history) -> list[str]:
    """Titles and texts of the app's notes in a chat history returned by the API."""
    out = []
    for m in history:
        meta = m.get("metadata") or {}
        if meta.get("title"):
            out.append(f"{meta['title']} :: {content(m)}")
    return out


def content(message) -> str:
    c = message.get("content")
    if isinstance(c, str):
        return c
    return "".join(part.get("text", "") for part in c if isinstance(part, dict))


def wait_for(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


class HeldReply:
    """A generation that holds the engine until released (another visitor's long reply): start it with
    ``ctx.runner.start(owner, settings, lambda: held)``."""

    run_id = ""

    def __init__(self) -> None:
        import threading
        self.release = threading.Event()

    def __iter__(self):
        self.release.wait(60)
        return iter(())

    def cancel(self) -> None:
        self.release.set()

    def update_settings(self, settings) -> None:
        pass

    def summary(self):
        return None


def plot_json(value) -> dict:
    """A Plot output as the API returns it (``{"type": "plotly", "plot": "<json>"}``), as the figure dict."""
    import json

    assert isinstance(value, dict) and value.get("type") == "plotly", value
    return json.loads(value["plot"])
