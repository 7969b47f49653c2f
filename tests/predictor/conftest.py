
import pytest

from tiny_models import FAMILIES


@pytest.fixture(scope="session")
def calibrated_dirs(tiny_dirs, tmp_path_factory):
    """Copies of the tiny models with draft artifacts built by `calibrate` beside them."""
    import shutil

    from spice_core.tools.calibrate import calibrate

    root = tmp_path_factory.mktemp("tiny_calibrated")
    out = {}
    for fam in FAMILIES:             # the extra families are for the exactness tests only
        d = tiny_dirs[fam]
        dst = root / fam
        shutil.copytree(d, dst)
        calibrate(dst, max_tokens=1500, seq_len=64, distances=4, epochs=6, lore=False)
        out[fam] = dst
    return out
