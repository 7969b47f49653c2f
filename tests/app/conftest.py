"""Fixtures for the app tests: the app launched in-process (fake engine), a client per test, and a real
chromium driven by playwright for the browser tests (FACTS: system chromium, never a downloaded one)."""
from __future__ import annotations

import pytest

from app_helpers import ARGS, CHROMIUM, close, serve, serve_shipped
from fake_engine import FakeEngine


@pytest.fixture(scope="module")
def served():
    s = serve(FakeEngine(token_delay_s=0.004))
    yield s
    s.demo.close()
    s.ctx.exports.cleanup()


@pytest.fixture
def client(served):
    from gradio_client import Client
    c = Client(served.url, verbose=False)
    yield c
    c.close()
    assert served.wait_idle(10), "a generation was still running after the test"


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium: apt-get install -y chromium")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright Python package is not installed")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


@pytest.fixture
def shipped_served():
    """The app on the shipped model (the fake engine where it is absent), for one test."""
    s = serve_shipped()
    yield s
    close(s)


def pytest_collection_modifyitems(items):
    """Every test that drives chromium is marked `browser`, whether or not its module says so: scripts/test.sh runs
    them apart from the parallel workers, so that a page's pace never depends on what another worker is doing."""
    for item in items:
        if "browser" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.browser)
