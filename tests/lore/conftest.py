
import pytest

from lore_support import FAMILIES, attach_lore, build_tiny, record_traces


@pytest.fixture(scope="session")
def lore_dirs(tiny_dirs):
    """The shared tiny checkpoints (tests/conftest.py): each test attaches its own LoRE bank."""
    return tiny_dirs


@pytest.fixture(scope="session")
def lore_engines(lore_dirs):
    """{family: (engine with a rank-8 LoRE bank attached, its traces)} (tiny experts are 16 wide)."""
    from spice_core.engine import SpiceEngine
    from spice_core.lore import fit_lore_bank

    out = {}
    for fam, d in lore_dirs.items():
        eng = SpiceEngine.load(d, device="cpu")
        traces = record_traces(eng.lm)
        attach_lore(eng, fit_lore_bank(eng.lm, traces, 8))
        out[fam] = (eng, traces)
    return out
