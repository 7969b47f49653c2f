"""Fixtures for the app tests: the app launched in-process (fake engine) and a client per test."""
from __future__ import annotations

import pytest

from app_helpers import serve
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
