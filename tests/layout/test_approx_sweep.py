"""The approx sweep's README is what its report script makes of the committed results (no number typed by
hand), and the report refuses an empty folder with a message instead of writing an empty table."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "docs/benchmarks/full-scale/approx-sweep"


def _report():
    spec = importlib.util.spec_from_file_location("approx_sweep_report", ROOT / "benchmarks/approx_sweep_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_table_and_conclusions_match_the_results_files():
    rep = _report()
    table = rep.rows(SWEEP)
    readme = (SWEEP / "README.md").read_text(encoding="utf-8")
    assert rep.render(table) in readme
    assert rep.conclusion(table) in readme
    assert {(r["link"], r["tau"]) for r in table if r["spice_ms"] is not None} >= {
        ("native", "0.05"), ("native", "0.10"), ("pcie4x8", "0.05"), ("pcie4x8", "0.10")}


def test_an_empty_folder_is_refused(tmp_path, capsys):
    (tmp_path / "approx-sweep").mkdir()
    assert _report().main(["--dir", str(tmp_path / "approx-sweep")]) == 2
    assert "no sweep results" in capsys.readouterr().err
