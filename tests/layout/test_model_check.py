"""benchmarks/model_check.py: modeled TPOT beside measured, matched per (link, budget, policy, workload), counted
against the ±target; only the measured model asked for, and only the rows some modeled run has."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import model_check  # noqa: E402


def rec(policy, tpot, model="lift:spice-mini", link="native", budget=0.25, **kw):
    return {"model": model, "link": link, "budget_frac": budget, "workload": "prompts", "policy": policy,
            "tpot_ms_median": tpot, **kw}


def test_rows_are_matched_counted_and_filtered_by_model(tmp_path):
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([rec("spice", 20.0), rec("lru", 50.0), rec("spice", 120.0, model="lift:other"),
                                    rec("on_demand", 60.0, budget=0.5), rec("peer_x", 9.0, peer=True)]))
    modeled = tmp_path / "modeled.json"
    modeled.write_text(json.dumps([rec("spice", 23.5, model="spice-mini"), rec("lru", 51.0, model="spice-mini")]))
    out = tmp_path / "check.md"
    assert model_check.main(["--measured", str(measured), "--measured-model", "lift:spice-mini",
                             "--modeled", f"refit={modeled}", "--out", str(out)]) == 0
    text = out.read_text()
    assert "| native | 25% | spice | 20.0 | 23.5 | +18% ✗ |" in text     # the other model's 120 ms is not used
    assert "| native | 25% | lru | 50.0 | 51.0 | +2% |" in text
    assert "on_demand" not in text and "peer_x" not in text             # no modeled row: not listed
    assert "- refit: 1 of 2 policies within ±15% of measured" in text


def test_bad_or_mismatched_input_is_one_line_not_a_traceback_or_a_wrong_table(tmp_path, capsys):
    """Regressions (review): a missing file, a config given as results, a --modeled without LABEL= were
    tracebacks; a Qwen2 modeled run against a DeepSeek measured one, or a modeled file given as measured, printed
    a table of +150 to +401% errors."""
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps([rec("lru", 50.0, timing="measured", settings={"tau_approx": 0.0})]))
    good = tmp_path / "modeled.json"
    good.write_text(json.dumps([rec("lru", 51.0, model="assets/spice-mini", timing="modeled",
                                    settings={"tau_approx": 0.0})]))
    qwen = tmp_path / "qwen.json"
    qwen.write_text(json.dumps([rec("lru", 151.0, model="assets/spice-mini-qwen2", timing="modeled")]))
    other = tmp_path / "other.json"
    other.write_text(json.dumps([rec("lru", 51.0, timing="modeled", settings={"tau_approx": 0.2})]))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model": "lift:spice-mini", "policies": ["lru"]}))
    cases = {"missing": ["--measured", str(tmp_path / "nope.json"), "--modeled", f"m={good}"],
             "config": ["--measured", str(config), "--modeled", f"m={good}"],
             "no label": ["--measured", str(measured), "--modeled", str(good)],
             "other model": ["--measured", str(measured), "--modeled", f"m={qwen}"],
             "other settings": ["--measured", str(measured), "--modeled", f"m={other}"],
             "modeled as measured": ["--measured", str(good), "--modeled", f"m={good}"],
             "measured as modeled": ["--measured", str(measured), "--modeled", f"m={measured}"]}
    for name, argv in cases.items():
        assert model_check.main(argv) == 2, name
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1 and "Traceback" not in err, (name, err)
    assert model_check.main(["--measured", str(measured), "--modeled", f"m={good}"]) == 0
