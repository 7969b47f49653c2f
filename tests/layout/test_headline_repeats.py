"""The headline report's run-to-run table (benchmarks/headline_repeats.py): a shard's second run is paired with its
first record by record, only where both ran the same prompts on the same code, and never merged."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from headline_report import load_shards  # noqa: E402
from headline_repeats import repeat_pairs, repeats_table  # noqa: E402

PROV = {"config": "c1", "prompts": "p1", "code": "e1"}


def rec(policy, tpot, n_runs=3, provenance=PROV, **kw):
    return {"model": "lift:spice-mini", "link": "pcie4x8", "budget_frac": 0.1, "workload": "prompts", "variant": "",
            "policy": policy, "tpot_ms_median": tpot, "hit_rate": 0.5, "n_runs": n_runs, "provenance": provenance, **kw}


def write(folder: Path, records, name="results.partial.json"):
    folder.mkdir(parents=True)
    (folder / name).write_text(json.dumps(records))


def test_no_repeats_folder_gives_no_table(tmp_path):
    write(tmp_path / "raw" / "s", [rec("spice", 50.0)])
    assert repeats_table(tmp_path) is None


def test_repeat_rows_pair_with_the_first_run_and_the_largest_change_is_named(tmp_path):
    write(tmp_path / "raw" / "s", [rec("spice", 50.0), rec("lru", 200.0)])
    write(tmp_path / "repeats" / "s", [rec("spice", 55.0), rec("lru", 198.0)], name="results.json")
    pairs = repeat_pairs(tmp_path)
    assert [(a["policy"], a["tpot_ms_median"], b["tpot_ms_median"]) for _, a, b in pairs] == \
        [("spice", 50.0, 55.0), ("lru", 200.0, 198.0)]
    table = repeats_table(tmp_path)
    assert "50.0 → 55.0 | +10.0%" in table and "200.0 → 198.0 | -1.0%" in table
    assert "`spice`, 10.0%" in table


def test_a_repeat_of_other_prompts_or_code_is_not_paired(tmp_path):
    write(tmp_path / "raw" / "s", [rec("spice", 50.0), rec("lru", 200.0), rec("on_demand", 220.0)])
    other_code = {**PROV, "code": "e2"}
    write(tmp_path / "repeats" / "s", [rec("spice", 55.0, n_runs=2), rec("lru", 198.0, provenance=other_code),
                                       rec("on_demand", 221.0, link="native")])
    assert repeat_pairs(tmp_path) == []
    assert repeats_table(tmp_path) is None


def test_the_report_does_not_merge_repeats_into_the_results():
    """The committed headline: every record's runs come from raw/ alone (a repeat would double a cell's prompts)."""
    d = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "headline"
    results = json.loads((d / "results.json").read_text())
    for shard, first, _ in repeat_pairs(d):
        merged = [r for r in results if all(r.get(k) == first.get(k) for k in ("model", "link", "budget_frac",
                                                                              "workload", "policy"))]
        assert len(merged) == 1
        raw_runs = sum(r["n_runs"] for r in load_shards(d / "raw")
                       if all(r.get(k) == first.get(k) for k in ("model", "link", "budget_frac", "workload", "policy")))
        assert merged[0]["n_runs"] == raw_runs
