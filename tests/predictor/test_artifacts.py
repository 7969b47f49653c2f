"""Artifacts beside a model: round trip, the engine picking them up, and foreign or broken files."""
import json
import shutil

import pytest
import torch

from spice_core.api import RunSettings
from spice_core.engine import SpiceEngine
from spice_core.errors import ArtifactError
from spice_core.model.loader import load_model
from spice_core.predictor.artifacts import (CALIBRATION_FILE, DRAFT_FILE, LORE_FILE, load_artifacts_if_present,
                                            model_fingerprint)
from spice_core.predictor.draft import DraftPredictor
from tiny_models import build_tiny

FIX = "python -m spice_core calibrate --model"


def copy_model(src, dst, with_artifacts=True):
    shutil.copytree(src, dst)
    if not with_artifacts:
        for name in (DRAFT_FILE, LORE_FILE, CALIBRATION_FILE):
            (dst / name).unlink(missing_ok=True)
    return dst


def test_no_artifacts_is_none_and_the_engine_falls_back_to_the_gate_predictor_and_says_so(tiny_dirs):
    lm = load_model(tiny_dirs["olmoe"], "cpu")
    assert load_artifacts_if_present(lm) is None
    eng = SpiceEngine(lm)
    eng.load_artifacts()
    assert not eng.info().has_draft
    run = eng.start_ids([3, 4, 5], RunSettings(policy="spice_prefetch", cache_frac=0.5, max_new_tokens=3))
    list(run)
    assert any("fell back to the training-free gate predictor" in n and FIX in n for n in run.summary().notes)


def test_calibrated_model_loads_its_draft_and_popularity(calibrated_dirs):
    eng = SpiceEngine.load(calibrated_dirs["mixtral"], device="cpu")
    arts = eng.artifacts
    assert eng.info().has_draft and isinstance(arts.draft, DraftPredictor)
    assert arts.draft.distances == 4 and arts.draft.moe_layers == eng.lm.moe_layers
    assert len(arts.popularity) == len(eng.lm.host) and set(arts.popularity) == set(eng.lm.host.keys())
    assert eng._popular_experts() == arts.popularity
    calib = json.loads((calibrated_dirs["mixtral"] / CALIBRATION_FILE).read_text())
    assert calib["fingerprint"] == model_fingerprint(eng.lm)
    assert set(calib["draft"]["heldout_recall_at_k"]) == {"1", "2", "3", "4"}


def test_spice_prefetch_uses_the_draft_without_a_fallback_note(calibrated_dirs):
    eng = SpiceEngine.load(calibrated_dirs["qwen2_moe"], device="cpu")
    run = eng.start_ids([3, 4, 5, 6], RunSettings(policy="spice_prefetch", cache_frac=0.5, max_new_tokens=6))
    steps = list(run)
    assert not any("fell back" in n for n in run.summary().notes)
    assert any(ev.kind == "draft" for ev in eng.get_events(run.run_id))
    assert sum(s.lookahead_depth for s in steps) > 0


def test_artifacts_of_another_model_shape_are_refused_with_the_fix(calibrated_dirs, tiny_dirs, tmp_path):
    dst = copy_model(tiny_dirs["qwen3_moe"], tmp_path / "qwen3")
    shutil.copy(calibrated_dirs["olmoe"] / DRAFT_FILE, dst / DRAFT_FILE)
    with pytest.raises(ArtifactError, match="another model shape") as e:
        SpiceEngine.load(dst, device="cpu")
    assert f"{FIX} {dst}" in str(e.value)


def test_artifacts_of_a_retrained_model_of_the_same_shape_are_refused(calibrated_dirs, tmp_path):
    other = build_tiny("deepseek_v2", tmp_path / "ds_seed1", seed=1)
    shutil.copy(calibrated_dirs["deepseek_v2"] / CALIBRATION_FILE, other / CALIBRATION_FILE)
    with pytest.raises(ArtifactError, match="router weights differ") as e:
        load_artifacts_if_present(load_model(other, "cpu"))
    assert FIX in str(e.value)


def test_corrupted_draft_file_is_named(calibrated_dirs, tmp_path):
    dst = copy_model(calibrated_dirs["deepseek_v2"], tmp_path / "ds")
    lm = load_model(dst, "cpu")
    (dst / DRAFT_FILE).write_bytes((dst / DRAFT_FILE).read_bytes()[:100])
    with pytest.raises(ArtifactError, match=f"{DRAFT_FILE}.*unreadable.*{FIX}"):
        load_artifacts_if_present(lm)


def test_calibration_json_that_is_not_ours_is_refused(calibrated_dirs, tmp_path):
    dst = copy_model(calibrated_dirs["deepseek_v2"], tmp_path / "ds")
    (dst / CALIBRATION_FILE).write_text(json.dumps({"hello": 1}))
    with pytest.raises(ArtifactError, match=CALIBRATION_FILE):
        load_artifacts_if_present(load_model(dst, "cpu"))


def test_draft_with_tensors_of_the_wrong_shape_is_refused(calibrated_dirs, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    dst = copy_model(calibrated_dirs["deepseek_v2"], tmp_path / "ds")
    with safe_open(str(dst / DRAFT_FILE), framework="pt") as f:
        meta, t = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    t["weight"] = t["weight"][:, :, :-1].contiguous()
    save_file(t, str(dst / DRAFT_FILE), metadata=meta)
    with pytest.raises(ArtifactError, match="tensor shapes"):
        load_artifacts_if_present(load_model(dst, "cpu"))


def test_lore_file_without_lore_support_or_with_it_never_breaks_draft_loading(calibrated_dirs, tmp_path):
    """A LoRE file is handed to spice_core.lore; a foreign one is refused like a foreign draft."""
    dst = copy_model(calibrated_dirs["deepseek_v2"], tmp_path / "ds")
    lm = load_model(dst, "cpu")
    (dst / LORE_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(ArtifactError):
        load_artifacts_if_present(lm)


def test_draft_lives_on_the_models_device_in_half_precision_for_half_models(calibrated_dirs):
    lm = load_model(calibrated_dirs["deepseek_v2"], "cpu", dtype=torch.bfloat16)
    arts = load_artifacts_if_present(lm)
    assert arts.draft.weight.dtype == torch.float16 and arts.draft.weight.device.type == "cpu"


def test_a_copy_of_the_shipped_model_is_recognised_by_its_routers(tmp_path):
    """A copied folder still calibrates and evaluates on the shipped model's held-out split."""
    import shutil

    from spice_core.model.loader import DEFAULT_MODEL_DIR, load_model
    from spice_core.predictor.traces import is_shipped_model

    copy = shutil.copytree(DEFAULT_MODEL_DIR, tmp_path / "mini-copy")
    assert is_shipped_model(load_model(copy, "cpu"))


def test_an_interrupted_calibration_leaves_the_old_artifacts_whole(calibrated_dirs, tmp_path, monkeypatch):
    """Regression (review): Ctrl-C during LoRE fitting left new draft heads beside the old LoRE factors and
    calibration record (which counted another number of heads), and `generate` ran on the mix without a word. The
    artifacts are staged and replace the old set only when all are written."""
    from spice_core.tools import calibrate as cal

    d = copy_model(calibrated_dirs["mixtral"], tmp_path / "m")
    before = {name: (d / name).read_bytes() for name in (DRAFT_FILE, CALIBRATION_FILE)}

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cal, "_fit_lore", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cal.calibrate(d, max_tokens=600, seq_len=64, distances=2, epochs=1, lore=True)
    assert {name: (d / name).read_bytes() for name in before} == before
    assert not any(p.name.startswith(".spice-calibrate") for p in d.iterdir())
    monkeypatch.undo()
    report = cal.calibrate(d, max_tokens=600, seq_len=64, distances=2, epochs=1, lore=False)   # then it lands whole
    assert (d / DRAFT_FILE).read_bytes() != before[DRAFT_FILE] and report["draft"]["heads"] > 0
    assert json.loads((d / CALIBRATION_FILE).read_text())["draft"]["heads"] == report["draft"]["heads"]
    assert not any(p.name.startswith(".spice-calibrate") for p in d.iterdir())
