"""Slices of one cell whose configs differ only in the traces they write merge as one run
(benchmarks/headline_runs.py); configs that differ in what they measure stay apart."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from headline_runs import join_output_variants, note_configs, run_digests  # noqa: E402

from spice_core.tools.bench_config import load_config_file  # noqa: E402
from spice_core.tools.bench_records import provenance  # noqa: E402

BASE = {"model": "lift:assets/spice-mini", "policies": ["resident", "spice"], "timing": "measured",
        "prompts": {"heldout": 2}, "max_new_tokens": 8, "links": ["pcie4x8"], "budgets": [0.5],
        "export_traces": ["spice"]}


def _write(d: Path, name: str, **change) -> str:
    cfg = dict(BASE, **change)
    (d / f"config-{name}.json").write_text(json.dumps(cfg))
    loaded = load_config_file(d / f"config-{name}.json")
    return provenance(dict(loaded, hw_profile=loaded.get("hw_profile")), [], "")["config"]


def _rec(config: str, n_runs: int = 1) -> dict:
    return {"policy": "spice", "n_runs": n_runs, "provenance": {"config": config, "prompts": "p", "code": "e"}}


def test_configs_differing_only_in_traces_share_a_run_and_name_both_digests(tmp_path):
    a = _write(tmp_path, "a", runs=[{"budgets": [0.5], "prompt_indices": [0]}])
    b = _write(tmp_path, "b", export_traces=[], runs=[{"budgets": [0.5], "prompt_indices": [1]}])
    other = _write(tmp_path, "c", tau_approx=0.2)
    assert len({a, b, other}) == 3                     # bench stamps three different digests
    digests = run_digests(tmp_path)
    assert digests[a] == digests[b] != digests[other]
    records = [_rec(a), _rec(b), _rec(other)]
    joined = join_output_variants(records, digests)
    assert records[0]["provenance"] == records[1]["provenance"]
    assert records[2]["provenance"]["config"] == other   # a config with no output-only twin keeps its digest
    merged = [dict(records[0], n_runs=2), dict(records[2])]
    note_configs(joined, merged)
    assert merged[0]["provenance"]["configs_as_run"] == sorted([a, b])
    assert "configs_as_run" not in merged[1]["provenance"]
    assert all("_config_as_run" not in r for r in records + merged)


def test_a_digest_no_committed_config_reproduces_is_left_alone(tmp_path):
    _write(tmp_path, "a")
    records = [_rec("0123456789abcdef")]
    join_output_variants(records, run_digests(tmp_path))
    assert records[0]["provenance"]["config"] == "0123456789abcdef"
