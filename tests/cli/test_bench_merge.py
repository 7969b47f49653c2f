"""`bench --merge` recombines shards of one run exactly, and refuses anything else (issue 26, defect 7:
two shards of different configs were blended into new medians, and one shard given twice doubled
every step count)."""
import json
import shutil

import pytest

from spice_core.errors import ConfigError
from spice_core.tools.bench_records import derive, merge_records, provenance
from spice_core.tools.cli import main


def record(steps, *, policy="lru", **over):
    raw = {"step_ms": list(steps), "ttft_ms": [1.0], "selections": 4 * len(steps), "hits": len(steps), "bytes": 0,
           "stall_ms": 0.0, "miss_split": {"copy": 1}, "wasted_prefetch_bytes": 0, "agreements": [],
           "gpu_peak_bytes": 0, "n_runs": 1}
    rec = {"model": "m", "timing": "modeled", "profile": "h200-pcie5x16", "shape": "deepseek-v2-lite",
           "link": "native", "budget_frac": 0.25, "policy": policy, "workload": "prompts", "variant": "",
           "routed_bytes_per_token": 1000, "link_gbps": 25.0, "ppl_delta_pct": 0.0, "raw": raw, **derive(raw)}
    rec.update(over)
    return rec


def shard(tmp_path, name, records):
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(records))
    return d


def merge(capsys, tmp_path, *dirs):
    code = main(["bench", "--merge", *map(str, dirs), "--out", str(tmp_path / "merged")])
    err = capsys.readouterr().err
    return code, err


def test_shards_of_one_run_still_merge(capsys, tmp_path):
    a = shard(tmp_path, "s0", [record([10.0, 11.0]), record([5.0], policy="resident")])
    b = shard(tmp_path, "s1", [record([12.0, 13.0]), record([5.0, 5.0], policy="resident")])
    code, err = merge(capsys, tmp_path, a, b)
    assert code == 0, err
    merged = {r["policy"]: r for r in json.loads((tmp_path / "merged" / "results.json").read_text())}
    assert merged["lru"]["n_decode_tokens"] == 4 and merged["lru"]["tpot_ms_median"] == 11.5


@pytest.mark.parametrize("field,value", [("profile", "h100-pcie5x16"), ("model", "other"), ("timing", "measured"),
                                         ("shape", "qwen2-57b-a14b")])
def test_shards_of_different_runs_are_refused(capsys, tmp_path, field, value):
    """Regression: 10.39 ms and 5.42 ms shards of different configs became a 7.91 ms median."""
    a = shard(tmp_path, "s0", [record([10.39] * 3)])
    b = shard(tmp_path, "s1", [record([5.42] * 3, **{field: value})])
    code, err = merge(capsys, tmp_path, a, b)
    assert code == 2 and "Traceback" not in err
    assert field in err and "s0" in err and "s1" in err and "not parts of one run" in err
    assert not (tmp_path / "merged" / "results.json").exists()


def test_records_of_one_configuration_that_disagree_on_the_floor_inputs_are_refused(capsys, tmp_path):
    a = shard(tmp_path, "s0", [record([10.0])])
    b = shard(tmp_path, "s1", [record([11.0], routed_bytes_per_token=2000)])
    code, err = merge(capsys, tmp_path, a, b)
    assert code == 2 and "routed_bytes_per_token" in err


def test_the_same_shard_twice_is_refused(capsys, tmp_path):
    """Regression: the same shard given twice doubled every step count."""
    a = shard(tmp_path, "s0", [record([10.0, 12.0]), record([5.0], policy="resident")])
    code, err = merge(capsys, tmp_path, a, a)
    assert code == 2 and "given twice" in err
    copy = tmp_path / "copy"
    shutil.copytree(a, copy)
    code, err = merge(capsys, tmp_path, a, copy)
    assert code == 2 and "same runs" in err and "give each shard once" in err
    assert len(err.strip().splitlines()) == 1


def test_provenance_tells_configs_prompts_and_code_apart_but_not_run_blocks():
    cfg = {"model": "m", "policies": ["lru"], "max_new_tokens": 64}
    base = provenance(cfg, [[1, 2, 3]], "code1")
    assert provenance({**cfg, "runs": [{"prompt_indices": [6]}], "comment": "resume"}, [[1, 2, 3]], "code1") == base
    assert provenance({**cfg, "max_new_tokens": 32}, [[1, 2, 3]], "code1")["config"] != base["config"]
    assert provenance(cfg, [[1, 2, 4]], "code1")["prompts"] != base["prompts"]
    assert provenance(cfg, [[1, 2, 3]], "code2") != base


def test_records_whose_provenance_differs_are_refused():
    cfg = {"model": "m", "max_new_tokens": 64}
    a = record([10.0], provenance=provenance(cfg, [[1]], "c"))
    b = record([11.0], provenance=provenance({**cfg, "max_new_tokens": 16}, [[1]], "c"))
    with pytest.raises(ConfigError, match="provenance"):
        merge_records([a, b])
    assert merge_records([a, record([11.0], provenance=a["provenance"])])[0]["n_decode_tokens"] == 2


def covering(steps, units, shard_kn, **over):
    """A record holding the runs ``units`` ([prompt, repetition] each), from shard ``shard_kn`` of a run."""
    rec = record(steps, shard=list(shard_kn), **over)
    rec["raw"]["units"] = [list(u) for u in units]
    return rec


def test_a_run_merged_with_its_own_shard_is_refused_not_counted_twice(capsys, tmp_path):
    """Regression (review): an unsharded run merged with its shard 0/2 gave n_runs 5 for 3 prompts, every number
    blending the repeated prompts; records now list the prompts they hold and overlapping ones are refused."""
    whole = shard(tmp_path, "full", [covering([10.0, 11.0, 12.0], [[0, 0], [1, 0], [2, 0]], (0, 1))])
    part = shard(tmp_path, "s0", [covering([10.0, 12.0], [[0, 0], [2, 0]], (0, 2))])
    code, err = merge(capsys, tmp_path, whole, part)
    assert code == 2 and "Traceback" not in err and "both hold prompt 0, prompt 2" in err, err
    assert not (tmp_path / "merged" / "results.json").exists()
    # the shards that split the prompts merge, and say which runs they hold together
    rest = shard(tmp_path, "s1", [covering([11.0], [[1, 0]], (1, 2))])
    code, err = merge(capsys, tmp_path, part, rest)
    assert code == 0, err
    merged = json.loads((tmp_path / "merged" / "results.json").read_text())[0]
    assert merged["n_runs"] == 2 and sorted(merged["raw"]["units"]) == [[0, 0], [1, 0], [2, 0]]


def test_a_merge_into_one_of_its_own_folders_is_refused(capsys, tmp_path):
    """Regression (review): --out s0 with --merge s0 s1 replaced shard 0's results with the merge."""
    a = shard(tmp_path, "s0", [covering([10.0], [[0, 0]], (0, 2))])
    b = shard(tmp_path, "s1", [covering([11.0], [[1, 0]], (1, 2))])
    before = (a / "results.json").read_text()
    code = main(["bench", "--merge", str(a), str(b), "--out", str(tmp_path / "s0" / ".")])
    err = capsys.readouterr().err
    assert code == 2 and "is one of the --merge folders" in err and "Traceback" not in err
    assert (a / "results.json").read_text() == before


def test_a_merge_missing_shards_of_its_split_says_which(capsys, tmp_path):
    a = shard(tmp_path, "s0", [covering([10.0], [[0, 0]], (0, 3))])
    b = shard(tmp_path, "s2", [covering([11.0], [[2, 0]], (2, 3))])
    code, err = merge(capsys, tmp_path, a, b)
    assert code == 0 and "shard 1/3 not given" in err, err
    c = shard(tmp_path, "s1", [covering([12.0], [[1, 0]], (1, 3))])
    shutil.rmtree(tmp_path / "merged")
    code, err = merge(capsys, tmp_path, a, b, c)
    assert code == 0 and "not given" not in err


@pytest.mark.parametrize("field,value", [("settings", {"tau_approx": 0.3}), ("max_new_tokens", 4)])
def test_shards_whose_run_blocks_set_other_thresholds_or_lengths_are_refused(capsys, tmp_path, field, value):
    """Regression (review): shard 0 ran τ_approx 0.05 with 8 tokens, shard 1 τ_approx 0.3 with 4 (their "runs"
    blocks, outside the provenance digest); the merge labelled the blend with shard 0's settings."""
    a = shard(tmp_path, "s0", [covering([10.0], [[0, 0]], (0, 2), settings={"tau_approx": 0.05}, max_new_tokens=8)])
    b = shard(tmp_path, "s1", [covering([11.0], [[1, 0]], (1, 2), **{"settings": {"tau_approx": 0.05},
                                                                     "max_new_tokens": 8, field: value})])
    code, err = merge(capsys, tmp_path, a, b)
    assert code == 2 and field in err and "Traceback" not in err, err


def test_bench_and_generate_report_one_p90():
    """Regression (review): one lru run read p90 412.9 ms in generate (linear interpolation) and 389.7 in bench
    (lower nearest rank); both now take trace.metrics.p90."""
    from spice_core.trace.metrics import p90

    steps = [10.0, 20.0, 30.0, 40.0, 100.0]
    assert record(steps)["tpot_ms_p90"] == p90(steps) == pytest.approx(76.0)     # 40 + 0.6 * (100 - 40)


def test_merged_records_hold_every_shard_and_a_merge_of_merges_misses_none(capsys, tmp_path):
    """Regression (review): a merged record kept its first part's "shard" ([0, 4]), so merging f0+f1 with f2+f3
    said shards 1/4 and 3/4 were missing."""
    parts = [shard(tmp_path, f"f{k}", [covering([10.0 + k], [[k, 0]], (k, 4))]) for k in range(4)]
    for name, pair in (("f01", parts[:2]), ("f23", parts[2:])):
        assert main(["bench", "--merge", *map(str, pair), "--out", str(tmp_path / name)]) == 0
    capsys.readouterr()
    code, err = merge(capsys, tmp_path, tmp_path / "f01", tmp_path / "f23")
    assert code == 0 and "not given" not in err, err
    rec = json.loads((tmp_path / "merged" / "results.json").read_text())[0]
    assert "shard" not in rec and rec["shards"] == [[0, 4], [1, 4], [2, 4], [3, 4]] and rec["n_runs"] == 4
    shutil.rmtree(tmp_path / "merged")
    code, err = merge(capsys, tmp_path, tmp_path / "f01", parts[3])
    assert code == 0 and "shard 2/4 not given" in err, err


def test_a_record_without_its_steps_is_refused_not_merged_over(capsys, tmp_path):
    """Regression (review): a record of one configuration without `raw` (its per-step data) beside one with it kept
    the first one's steps and dropped the other's: half the prompts vanished from the merged median, silently."""
    summary = {k: v for k, v in record([12.0, 13.0]).items() if k != "raw"}
    for first, second in (([summary], [record([10.0, 11.0])]), ([record([10.0, 11.0])], [summary])):
        a, b = shard(tmp_path, "s0", first), shard(tmp_path, "s1", second)
        code, err = merge(capsys, tmp_path, a, b)
        assert code == 2 and "Traceback" not in err and "per-step data" in err and "s0" in err and "s1" in err, err
        assert not (tmp_path / "merged" / "results.json").exists()
        shutil.rmtree(a), shutil.rmtree(b)
