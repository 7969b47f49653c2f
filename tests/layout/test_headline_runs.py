"""Slices of one cell whose configs differ only in the traces they write merge as one run
(benchmarks/headline_runs.py); configs that differ in what they measure stay apart; shards of one config merge only from one kind of GPU."""
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from headline_runs import (GPU_BEFORE_ENV_FILES, join_output_variants, note_configs, refuse_mixed_gpus,  # noqa: E402
                           run_digests, shard_gpu)

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


def test_a_shards_gpu_is_read_from_its_env_file_and_shards_before_env_files_ran_on_the_h200(tmp_path):
    h100, h200, old = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (h100, h200, old):
        d.mkdir()
    (h100 / "env.txt").write_text("name, driver_version, memory.total [MiB]\nNVIDIA H100 80GB HBM3, 580.1, 81559 MiB\n")
    (h200 / "env.txt").write_text("name, driver_version, memory.total [MiB]\nNVIDIA H200, 580.1, 143771 MiB\n")
    assert (shard_gpu(h100), shard_gpu(h200), shard_gpu(old)) == ("H100", "H200", GPU_BEFORE_ENV_FILES)


def test_shards_of_one_config_from_two_kinds_of_gpu_are_refused_and_of_one_kind_pass():
    one = [dict(_rec("x"), gpu="H100"), dict(_rec("x", 2), gpu="H100")]
    refuse_mixed_gpus({"x": one, "y": [dict(_rec("y"), gpu="H200"), _rec("y")]})   # no env file: the H200's
    with pytest.raises(ValueError, match="H100 and H200"):
        refuse_mixed_gpus({"x": one + [dict(_rec("x", 3), gpu="H200")]})


def test_the_committed_headline_names_each_cells_gpu():
    """The report's coverage has a GPU column, and the Qwen2 x8 cell (run on an H100) is not merged with H200 shards."""
    readme = (Path(__file__).resolve().parents[2] / "docs/benchmarks/headline/README.md").read_text(encoding="utf-8")
    assert "| policies | GPU | engine code |" in readme
    assert "| Qwen2-57B-A14B | pcie4x8 | 25% | prompts |" in readme
    row = next(ln for ln in readme.splitlines() if ln.startswith("| Qwen2-57B-A14B | pcie4x8 | 25% | prompts |"))
    assert "| H100 |" in row


def test_the_time_split_table_lists_the_rows_that_carry_a_split():
    """headline_report.time_split_table: one row per record with bench's time split (none: no table)."""
    from headline_report import time_split_table

    split = {"gpu": 5.0, "link": 12.0, "link + lane": 0.0, "lane": 1.0, "host": 2.0}
    busy = {"token window": 20.0, "link": 15.0, "link hidden under GPU work": 3.0, "CPU lane": 1.5}
    recs = [{"link": "native", "budget_frac": 0.25, "workload": "prompts", "policy": "spice",
             "time_split_ms_per_token": split, "busy_ms_per_token": busy},
            {"link": "native", "budget_frac": 0.25, "workload": "prompts", "policy": "lru"}]
    table = time_split_table(recs).splitlines()
    assert len(table) == 3 and "| spice |" in table[2] and "lru" not in "\n".join(table)
    assert "| 20.00 | 5.00 | 12.00 | 0.00 | 1.00 | 2.00 | link | 15.00 (3.00) | 1.50 |" in table[2]
    assert time_split_table(recs[1:]) == ""
