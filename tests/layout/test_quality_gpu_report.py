"""The GPU quality passes' table: the committed README holds the script's tables of the committed records, and a
file that is not bench output is refused with a message."""
from __future__ import annotations

import importlib.util
import io
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs/benchmarks/cpu-lane/quality-gpu"
SOURCES = (FOLDER / "run/results.partial.json",
           ROOT / "docs/benchmarks/headline/raw/native-25-tf/results.partial.json")


def _report():
    spec = importlib.util.spec_from_file_location("quality_gpu_report", ROOT / "benchmarks/quality_gpu_report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_tables_are_the_scripts_output_of_the_committed_records():
    rep, readme = _report(), (FOLDER / "README.md").read_text()
    for src in SOURCES:
        out = io.StringIO()
        with redirect_stdout(out):
            assert rep.main([str(src)]) == 0
        assert out.getvalue().strip() in readme, f"{src.name}: regenerate the README's table"


def test_rows_show_dashes_where_no_quality_pass_ran_and_a_bad_file_is_refused(tmp_path, capsys):
    rep = _report()
    rec = {"policy": "lru", "link": "native", "timing": "measured", "budget_frac": 0.25, "n_runs": 2,
           "tpot_ms_median": 40.0, "miss_split": {"copy": 3}, "greedy_agreement": 1.0}
    row = rep.rows([rec])[-1]
    assert row.startswith("| native | – | lru | 2 | 40.00 | 0/0/3 | 1.000 |")
    assert row.endswith("| – | – | – | – |")
    bad = tmp_path / "results.json"
    bad.write_text("[1, 2]")
    assert rep.main([str(bad)]) == 2
    assert "pass a bench output" in capsys.readouterr().err
