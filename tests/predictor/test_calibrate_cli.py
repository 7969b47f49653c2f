"""`python -m spice_core calibrate` end to end on a tiny model, and the bad inputs of issue 3."""
import json
import shutil

import pytest

from spice_core.api import RunSettings
from spice_core.tools.cli import main
from spice_core.errors import ConfigError
from spice_core.predictor.artifacts import CALIBRATION_FILE, DRAFT_FILE

TEXT = "the cat sat on the mat . the dog ran to the park and the bird sang .\n\n" * 30


@pytest.fixture()
def model(tiny_dirs, tmp_path):
    return shutil.copytree(tiny_dirs["deepseek_v2"], tmp_path / "model")


@pytest.fixture()
def text(tmp_path):
    f = tmp_path / "calib.txt"
    f.write_text(TEXT)
    return f


def calibrate(*args):
    return main(["calibrate", "--threads", "1", "--no-lore", *map(str, args)])


def test_calibrate_writes_artifacts_beside_the_model_and_generate_uses_them(model, text, capsys):
    assert calibrate("--model", model, "--text", text, "--max-tokens", 500, "--seq-len", 64, "--distances", 3) == 0
    out = capsys.readouterr().out
    assert "draft: 9 heads" in out and "held-out recall@k" in out and f"wrote {model / DRAFT_FILE}:" in out
    assert "--artifacts" not in out                  # beside the model: found without it
    calib = json.loads((model / CALIBRATION_FILE).read_text())
    assert calib["traces"]["tokens"] == 500 and "calib.txt" in calib["traces"]["source"]
    assert calib["command"].startswith("python -m spice_core calibrate --model")
    assert main(["generate", "--model", str(model), "--prompt", "the cat", "--policy", "spice_prefetch",
                 "--max-new-tokens", "4", "--cache-frac", "0.5", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]
    assert not any("fell back" in n for n in summary["notes"])


def test_calibrate_to_another_folder_and_use_it_with_artifacts(model, text, tmp_path, capsys):
    """A read-only checkpoint is calibrated into another folder; --artifacts points every command at it (nothing
    could use that folder before)."""
    out_dir = tmp_path / "arts"
    assert calibrate("--model", model, "--text", text, "--max-tokens", 400, "--distances", 2, "--out", out_dir) == 0
    assert (out_dir / DRAFT_FILE).exists() and not (model / DRAFT_FILE).exists()
    assert f"pass --artifacts {out_dir}" in capsys.readouterr().out
    gen = ["generate", "--model", str(model), "--prompt", "the cat", "--policy", "spice_prefetch", "--max-new-tokens",
           "3", "--cache-frac", "0.5", "--json"]

    def notes(*extra):
        assert main(gen + list(extra)) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])["summary"]["notes"]

    assert any("fell back" in n for n in notes())
    assert not any("fell back" in n for n in notes("--artifacts", str(out_dir)))
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in (empty, tmp_path / "missing"):
        assert main(gen + ["--artifacts", str(bad)]) == 2
        err = capsys.readouterr().err
        assert f"--artifacts {bad}" in err and "--out" in err and "Traceback" not in err


def test_lore_only_refuses_draft_heads_of_another_model_before_tracing(model, text, calibrated_dirs, capsys):
    from spice_core.predictor.artifacts import LORE_FILE

    for name in (DRAFT_FILE, CALIBRATION_FILE):
        shutil.copy(calibrated_dirs["olmoe"] / name, model / name)
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--lore-only"]) == 2
    assert "another model" in capsys.readouterr().err
    assert not (model / LORE_FILE).exists()


def test_calibrate_rebuilds_over_stale_artifacts_of_another_model(model, text, calibrated_dirs, capsys):
    shutil.copy(calibrated_dirs["olmoe"] / DRAFT_FILE, model / DRAFT_FILE)
    assert main(["generate", "--model", str(model), "--prompt", "the cat", "--max-new-tokens", "2"]) == 2
    assert "python -m spice_core calibrate --model" in capsys.readouterr().err
    assert calibrate("--model", model, "--text", text, "--max-tokens", 400, "--distances", 2) == 0
    assert main(["generate", "--model", str(model), "--prompt", "the cat", "--max-new-tokens", "2"]) == 0


@pytest.mark.parametrize("flag,value,needle", [
    ("--distances", 0, "--distances"), ("--distances", 100, "--distances"), ("--max-tokens", 10, "--max-tokens"),
    ("--lore-max-rank", 0, "--lore-max-rank"), ("--epochs", 0, "--epochs"), ("--seq-len", 2, "--seq-len")])
def test_calibrate_bad_numbers_name_the_flag(model, flag, value, needle, capsys):
    assert calibrate("--model", model, flag, value) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_calibrate_empty_or_missing_text_file(model, tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n\n")
    assert calibrate("--model", model, "--text", empty) == 2
    assert "empty" in capsys.readouterr().err
    assert calibrate("--model", model, "--text", tmp_path / "nope.txt") == 2
    assert "no such file" in capsys.readouterr().err


@pytest.mark.parametrize("tau", [-0.1, 1.5])
def test_tau_prefetch_outside_unit_interval_is_refused(tau, model, capsys):
    with pytest.raises(ConfigError, match="tau_prefetch"):
        RunSettings(policy="spice_prefetch", tau_prefetch=tau)
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--tau-prefetch", str(tau)]) == 2
    assert "--tau-prefetch" in capsys.readouterr().err     # the CLI names its flag


@pytest.mark.parametrize("depth", [0, -3])
def test_max_lookahead_below_one_is_refused(depth, model, capsys):
    with pytest.raises(ConfigError, match="max_lookahead"):
        RunSettings(policy="spice_prefetch", max_lookahead=depth)
    assert main(["generate", "--model", str(model), "--prompt", "hi", "--max-lookahead", str(depth)]) == 2
    assert "--max-lookahead" in capsys.readouterr().err     # the CLI names its flag


def test_calibrate_also_fits_lore_when_asked_and_the_engine_loads_both(model, text, capsys):
    from spice_core.engine import SpiceEngine

    assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--max-tokens", "400",
                 "--distances", "2", "--lore-max-rank", "4"]) == 0
    assert "LoRE: spice-lore.safetensors (max rank 4)" in capsys.readouterr().out
    info = SpiceEngine.load(model, device="cpu").info()
    assert info.has_draft and info.has_lore


def test_lore_only_adds_lore_beside_an_existing_draft_without_retraining_it(model, text, capsys):
    from spice_core.engine import SpiceEngine

    assert calibrate("--model", model, "--text", text, "--max-tokens", "400", "--distances", "2") == 0
    draft_before = (model / DRAFT_FILE).read_bytes()
    capsys.readouterr()
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--max-tokens", "400",
                 "--lore-only", "--lore-max-rank", "4"]) == 0
    out = capsys.readouterr().out
    assert "LoRE: spice-lore.safetensors (max rank 4)" in out
    assert f"kept {model / DRAFT_FILE}:" in out and f"wrote {model / DRAFT_FILE}" not in out   # not rewritten
    assert (model / DRAFT_FILE).read_bytes() == draft_before
    cal = json.loads((model / CALIBRATION_FILE).read_text())
    assert cal["lore"]["max_rank"] == 4 and "spice-lore.safetensors" in cal["files_bytes"]
    # --json prints the report as JSON here too (review: it printed the text lines)
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--max-tokens", "400",
                 "--lore-only", "--lore-max-rank", "4", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["lore"]["max_rank"] == 4 and "expert_frequency" not in rep
    eng = SpiceEngine.load(model, device="cpu")
    info = eng.info()
    assert info.has_draft and info.has_lore and info.lore_ranks == (1, 2, 4)
    # A rank above the fitted ones runs at the largest one, and the summary says so.
    run = eng.start_ids([5, 6, 7, 8], RunSettings(policy="spice", tau_approx=0.5, lore_rank=16, max_new_tokens=4))
    list(run)
    assert any(n.startswith("LoRE at rank 4, the largest of the model's factors") for n in run.summary().notes)


def test_lore_only_without_a_draft_names_the_full_calibrate_command(model, text, capsys):
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--lore-only"]) == 2
    assert "spice_core calibrate" in capsys.readouterr().err


def test_another_models_artifacts_in_an_artifacts_folder_name_the_fix_there(model, calibrated_dirs, tmp_path, capsys):
    """The rebuild hint for a folder given with --artifacts writes there (--out): beside a read-only checkpoint it
    cannot."""
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for name in (DRAFT_FILE, CALIBRATION_FILE):
        shutil.copy(calibrated_dirs["olmoe"] / name, wrong / name)
    assert main(["generate", "--model", str(model), "--prompt", "the cat", "--max-new-tokens", "2",
                 "--artifacts", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and f"--out {wrong}" in err and "Traceback" not in err, err


def test_a_bad_artifacts_folder_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import spice_core.engine as engine_mod

    def no_load(*a, **kw):
        raise AssertionError("the model was loaded before --artifacts was checked")

    monkeypatch.setattr(engine_mod, "load_model", no_load)
    assert main(["generate", "--prompt", "the cat", "--artifacts", str(tmp_path / "missing")]) == 2
    assert "--artifacts" in capsys.readouterr().err


def test_calibrate_writes_files_anyone_the_umask_allows_can_read(model, text):
    """Regression (review): the draft and LoRE files came out mode 0600 (safetensors' own), beside a 0644 calibration
    record: an app running as another user could not read them."""
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert main(["calibrate", "--threads", "1", "--model", str(model), "--text", str(text), "--max-tokens", "400",
                     "--distances", "2", "--lore-max-rank", "2"]) == 0
    finally:
        os.umask(old)
    for name in (DRAFT_FILE, "spice-lore.safetensors", CALIBRATION_FILE):
        assert stat.S_IMODE((model / name).stat().st_mode) == 0o644, name


def test_sigterm_mid_calibration_unwinds_leaving_no_scratch_folder_and_the_old_set_whole(model, text, tmp_path):
    """Regression (review): `timeout` (SIGTERM) during calibrate left its `.spice-calibrate-<pid>.part` folder behind;
    SIGTERM now unwinds as Ctrl-C does: one line, exit 143, the scratch folder gone, the artifacts as they were."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    assert calibrate("--model", model, "--text", text, "--max-tokens", 400, "--distances", 2) == 0
    before = (model / DRAFT_FILE).read_bytes()
    repo = Path(__file__).resolve().parents[2]
    p = subprocess.Popen([sys.executable, "-m", "spice_core", "calibrate", "--threads", "1", "--model", str(model),
                          "--text", str(text), "--max-tokens", "2000", "--distances", "4", "--epochs", "400"],
                         cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(model.glob(".spice-calibrate-*.part")) and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(model.glob(".spice-calibrate-*.part")), "calibrate never started writing"
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("terminated"), err
    assert not list(model.glob(".spice-calibrate-*.part")) and (model / DRAFT_FILE).read_bytes() == before


def test_every_hint_for_artifacts_kept_apart_names_their_folder(model, calibrated_dirs, tmp_path, capsys):
    """Regressions (a review): draft heads of another model alone in an --artifacts folder, and `calibrate --lore-only
    --out A` without a draft in A or with another model's, hinted `calibrate --model M` without `--out A`."""
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(calibrated_dirs["olmoe"] / DRAFT_FILE, alone / DRAFT_FILE)
    assert main(["generate", "--model", str(model), "--prompt", "the cat", "--max-new-tokens", "2",
                 "--artifacts", str(alone)]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and f"--out {alone}" in err, err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--lore-only", "--out", str(empty)]) == 2
    assert f"--model {model} --out {empty}`" in capsys.readouterr().err
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    for name in (DRAFT_FILE, CALIBRATION_FILE):
        shutil.copy(calibrated_dirs["olmoe"] / name, wrong / name)
    assert main(["calibrate", "--threads", "1", "--model", str(model), "--lore-only", "--out", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert "another model" in err and f"--model {model} --out {wrong}" in err, err
