"""The predictor benchmarks run end to end on a tiny calibrated model and write their reports."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_predictor_recall_report(calibrated_dirs, tmp_path, capsys):
    out = tmp_path / "recall.md"
    assert load("predictor_recall").main(["--model", str(calibrated_dirs["deepseek_v2"]), "--max-tokens", "300",
                                          "--calib-tokens", "600", "--distances", "4", "--out", str(out)]) == 0
    rep = json.loads(out.with_suffix(".json").read_text())
    assert set(rep["results"]) == {"draft", "draft (same token only)", "gate", "popularity"}
    assert len(rep["results"]["draft"]) == 4 and rep["results"]["gate"][-1] is None   # gate: same token only
    assert "recall@3" in out.read_text()


@pytest.mark.slow
def test_prefetch_modeled_report(calibrated_dirs, tmp_path, capsys):
    out = tmp_path / "tpot.md"
    assert load("prefetch_modeled").main(["--model", str(calibrated_dirs["qwen3_moe"]), "--prompts", "2",
                                          "--max-new-tokens", "5", "--budgets", "0.25", "0.5",
                                          "--profiles", "h200-pcie5x16", "--out", str(out)]) == 0
    text = out.read_text()
    assert "token-identical to lru on every prompt: **yes**" in text
    assert "## Target: spice_prefetch closes >= 80%" in text
    dump = json.loads(out.with_suffix(".json").read_text())
    assert "h200-pcie5x16 | 0.25 | spice_prefetch" in dump["table"]
