import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tiny_models import FAMILIES, build_tiny  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return {f: build_tiny(f, root / f) for f in FAMILIES}


@pytest.fixture(scope="session")
def engines(tiny_dirs):
    from spice_core.engine import SpiceEngine

    return {f: SpiceEngine.load(d, device="cpu") for f, d in tiny_dirs.items()}
