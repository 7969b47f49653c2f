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
    mark = re.match(r"<!-- headline-table: checked against (\S+) \(model (\S+)\) ", readme[readme.index(MARK):])
    assert mark, "the headline table's marker names its results file and model: '(model lift:...)'"
    source, model = mark.groups()
    records = json.loads((ROOT / source).read_text())
    measured = {(r["link"], r["policy"]): r["tpot_ms_median"] for r in records
                if r.get("workload") == "prompts" and r["budget_frac"] == 0.25 and r["timing"] == "measured"
                and r.get("model") == model}
    assert measured, f"no measured 25% record of {model} in {source}"
    checked = 0
    for row in table[2:]:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        link = cells[0]
        for policy, cell in zip(header[1:], cells[1:]):
            value = float(re.match(r"([\d.]+) ms", cell).group(1))
            assert abs(value - measured[(link, policy)]) < 0.051, (link, policy, value, measured[(link, policy)])
            checked += 1
    assert checked >= 16


BUDGETS_MARK = "<!-- headline-budgets:"
MODEL_IDS = {"DeepSeek-V2-Lite": "lift:spice-mini", "Qwen2-57B-A14B": "lift:spice-mini-qwen2"}


def test_readme_budgets_table_matches_the_results_file():
    """The second table (other budgets, the second model): every cell is the record of its model, link and budget."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert BUDGETS_MARK in readme, "the README's Performance section lost its other-budgets table"
    at = readme.index(BUDGETS_MARK)
    source = re.match(r"<!-- headline-budgets: checked against (\S+) ", readme[at:]).group(1)
    table = [ln.strip() for ln in readme[at:].splitlines()[1:8] if ln.strip().startswith("|")]
    header = [c.strip().strip("*") for c in table[0].strip("|").split("|")]
    records = json.loads((ROOT / source).read_text())
    measured = {(r.get("model"), r["link"], round(r["budget_frac"], 3), r["policy"]): r["tpot_ms_median"]
                for r in records if r.get("workload") == "prompts" and r["timing"] == "measured" and not r.get("peer")}
    checked = 0
    for row in table[2:]:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        model, link, budget = MODEL_IDS[cells[0]], cells[1], round(float(cells[2].rstrip("%")) / 100, 3)
        for policy, cell in zip(header[3:], cells[3:]):
            value = float(re.match(r"([\d.]+) ms", cell).group(1))
            want = measured[(model, link, budget, policy)]
            assert abs(value - want) < 0.051, (model, link, budget, policy, value, want)
            checked += 1
    assert checked >= 14
