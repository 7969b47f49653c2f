"""Compressed source files inflate to a bounded size (a corrupted or hostile file cannot expand without bound)."""
import gzip
import zlib

import pytest

import training.sources as sources
from spice_core.errors import SpiceError


def test_inflate_round_trips_zlib_and_gzip():
    assert sources._inflate(zlib.compress(b"chapter one"), "x") == b"chapter one"
    assert sources._inflate(gzip.compress(b"chapter one"), "x", gzip_header=True) == b"chapter one"


def test_inflate_refuses_a_bomb(monkeypatch):
    monkeypatch.setattr(sources, "MAX_INFLATED_BYTES", 10_000)
    with pytest.raises(SpiceError, match="inflates to more than"):
        sources._inflate(zlib.compress(b"\0" * 1_000_000), "Rdata.rdb")
