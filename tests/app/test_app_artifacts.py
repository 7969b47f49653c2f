"""The app on a checkpoint whose calibration artifacts live in another folder (a read-only checkpoint, calibrated
with `calibrate --out DIR`): `app.py --model M --artifacts DIR` loads them; a bad --artifacts is one line, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys

from app_helpers import ROOT
from tiny_models import build_tiny


def _app(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "app.py"), "--device", "cpu", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_app_loads_artifacts_from_their_own_folder(tmp_path):
    import app
    from spice_core.tools.calibrate import calibrate

    model = build_tiny("deepseek_v2", tmp_path / "model")
    arts = tmp_path / "arts"
    calibrate(model, max_tokens=400, seq_len=64, distances=2, epochs=2, lore=False, out=arts)
    (engine,) = app.load_engines(str(model), "cpu", str(arts))
    assert engine.info().has_draft
    (plain,) = app.load_engines(str(model), "cpu")
    assert not plain.info().has_draft


def test_bad_artifacts_arguments_are_one_line_and_exit_2(tmp_path):
    alone = _app("--artifacts", str(tmp_path))
    assert alone.returncode == 2 and "--artifacts belongs to one model: pass --model too" in alone.stderr
    model = build_tiny("deepseek_v2", tmp_path / "model")
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = _app("--model", str(model), "--artifacts", str(empty))
    assert bad.returncode == 2 and f"--artifacts {empty}" in bad.stderr and "Traceback" not in bad.stderr


def test_a_checkpoint_without_a_tokenizer_is_refused_at_start(tmp_path):
    """It started, then refused every message ("pass token ids", which the app cannot)."""
    model = build_tiny("deepseek_v2", tmp_path / "model")
    for f in model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")) or f.name == "chat_template.jinja":
            f.unlink()
    got = _app("--model", str(model))
    assert got.returncode == 2 and "has no tokenizer files" in got.stderr and "Traceback" not in got.stderr
