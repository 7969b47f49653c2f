"""The README's headline table quotes the headline run's results.json, number for number."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- headline-table:"


def test_readme_headline_table_matches_the_results_file():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert MARK in readme, "the README's Performance section lost its headline table"
    lines = readme[readme.index(MARK):].splitlines()[1:]
    table = [ln for ln in lines[:6] if ln.startswith("|")]
    header = [c.strip().strip("*") for c in table[0].strip("|").split("|")]
    source = re.match(r"<!-- headline-table: checked against (\S+) ", readme[readme.index(MARK):]).group(1)
    records = json.loads((ROOT / source).read_text())
    measured = {(r["link"], r["policy"]): r["tpot_ms_median"] for r in records
                if r.get("workload") == "prompts" and r["budget_frac"] == 0.25 and r["timing"] == "measured"}
    checked = 0
    for row in table[2:]:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        link = cells[0]
        for policy, cell in zip(header[1:], cells[1:]):
            value = float(re.match(r"([\d.]+) ms", cell).group(1))
            assert abs(value - measured[(link, policy)]) < 0.051, (link, policy, value, measured[(link, policy)])
            checked += 1
    assert checked >= 16
