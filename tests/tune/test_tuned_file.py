"""The tuned-settings file beside the model (spice_core.tuned): a save that fails leaves the file as it was.

Regression: the file was rewritten in place, so a write that failed half way (a full disk) lost every pick saved
before it; it is written beside the file, then renamed over it."""
import errno

import pytest

from spice_core import tuned
from spice_core.tuned import TuneRecord, load_all, save


def _record(cache_frac: float) -> TuneRecord:
    return TuneRecord(model="m", policy="spice", profile="rtx4090-pcie4x16", shape="deepseek-v2-lite",
                      cache_frac=cache_frac, budget={"ppl_pct": 1.0, "agreement": 0.9},
                      setting={"tau_approx": 0.05, "tau_prefetch": 0.1, "max_lookahead": 2, "lore_rank": 4,
                               "cpu_lane": True},
                      speed_ms=10.0, speed_timing="modeled", ppl_pct=0.5, agreement=0.95, quality_measured_on="text",
                      reason="fastest")


def test_a_save_that_fails_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    path = tmp_path / tuned.TUNED_FILE
    save(_record(0.25), path)
    before = path.read_text()

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(tuned.os, "replace", full_disk)
    with pytest.raises(OSError):
        save(_record(0.5), path)
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == [path.name]
    monkeypatch.undo()
    save(_record(0.5), path)
    assert sorted(r.cache_frac for r in load_all(path)) == [0.25, 0.5]
