"""Test-wide setup and the shared tiny models.

One torch thread (2-core machines stall with more) and an offline hub. The tiny checkpoints of
the five families are built once per session (tiny_models.py) and shared by every folder; the
package is installed (pyproject.toml) and pytest.ini puts this folder on the path for the helpers.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402

from tiny_models import EXTRA_FAMILIES, FAMILIES, build_tiny  # noqa: E402

torch.set_num_threads(1)


class _CurrentStderr:
    """Whatever ``sys.stderr`` is when written to (pytest swaps in each test's capture, capsys's included)."""

    def write(self, text: str) -> int:
        import sys
        return sys.stderr.write(text)

    def flush(self) -> None:
        import sys
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def _library_logs_to_this_tests_stderr():
    """transformers' log handler binds the stderr of its first use, an earlier test's capture stream that pytest
    closes after that test: a later warning then printed "--- Logging error ---" and a traceback into whatever stderr
    was captured, failing tests that check a command's stderr has no traceback, depending on test order. Its stream
    handlers write to the stderr of the moment instead (this fixture runs before capsys swaps it, so not a fixed one)."""
    import logging

    current = _CurrentStderr()
    for handler in logging.getLogger("transformers").handlers:
        if type(handler) is logging.StreamHandler:
            with handler.lock:           # not setStream: it flushes the old stream, which may be closed
                handler.stream = current
                if "flush" in vars(handler):     # transformers binds its handler's flush to that stream's too
                    handler.flush = current.flush
    yield


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """{family: directory of a tiny random checkpoint}, safetensors with the real per-expert key names
    (FAMILIES, and EXTRA_FAMILIES for the exactness tests)."""
    root = tmp_path_factory.mktemp("tiny")
    return {f: build_tiny(f, root / f) for f in FAMILIES + EXTRA_FAMILIES}


@pytest.fixture(scope="session")
def engines(tiny_dirs):
    """{family: SpiceEngine on the CPU} over `tiny_dirs`."""
    from spice_core.engine import SpiceEngine

    return {f: SpiceEngine.load(d, device="cpu") for f, d in tiny_dirs.items()}
