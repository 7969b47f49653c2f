"""The bench command: records with the documented keys, interleaved policies, clear config errors."""
import json

import pytest

from spice_core.tools.bench import _load_config, run_bench
from spice_core.errors import ConfigError

KEYS = {"model", "policy", "budget_frac", "link", "timing", "tpot_ms_median", "tpot_ms_p90", "hit_rate",
        "bytes_per_token", "stall_ms_per_token", "greedy_agreement", "ppl_delta_pct"}


def test_bench_writes_records_with_the_documented_keys(tmp_path):
    cfg = {"model": "random:tiny-deepseek", "policies": ["resident", "on_demand", "lru"], "budgets": [0.3],
           "links": ["native"], "timing": "modeled", "profile": "h200-pcie5x16", "shape": "deepseek-v2-lite",
           "prompts": {"random_ids": 2, "length": 8}, "max_new_tokens": 5}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = run_bench(_load_config(path), tmp_path / "out", "cpu")
    assert {r["policy"] for r in recs} == {"resident", "on_demand", "lru"}
    for r in recs:
        assert KEYS <= set(r)
        assert r["timing"] == "modeled" and r["greedy_agreement"] == 1.0
    on_demand = next(r for r in recs if r["policy"] == "on_demand")
    resident = next(r for r in recs if r["policy"] == "resident")
    assert on_demand["hit_rate"] == 0.0 and on_demand["tpot_ms_median"] > resident["tpot_ms_median"]
    # where each decode token's time went (trace.occupancy): the states add up to the clock's token window
    for r in recs:
        split, busy = r["time_split_ms_per_token"], r["busy_ms_per_token"]
        assert sum(split.values()) == pytest.approx(busy["token window"])
        assert busy["link hidden under GPU work"] <= busy["link"] + 1e-9
    assert resident["busy_ms_per_token"]["link"] == 0.0 and on_demand["time_split_ms_per_token"]["link"] > 0
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert len(saved) == 3 and (tmp_path / "out" / "results.md").exists()


@pytest.mark.parametrize("patch,needle", [({"policies": ["fifo"]}, "policy"), ({"links": ["pcie9"]}, "link"),
                                          ({"budgets": [1.5]}, "budget"), ({"timing": "measured"}, "CUDA"),
                                          ({"lane_offer": "sometimes"}, "lane_offer"),
                                          ({"runs": [{"lane_offer": 1}]}, "lane_offer"),
                                          ({"prefetch_admission": "most"}, "prefetch_admission"),
                                          ({"copy_issue": "fast"}, "copy_issue"),
                                          ({"runs": [{"copy_issue": "torch"}]}, "copy_issue"),
                                          ({"runs": [{"prefetch_admission": None}]}, "prefetch_admission"),
                                          ({"teacher_forced": ["fifo"]}, "teacher_forced"),
                                          ({"runs": [{"teacher_forced": "yes"}]}, "teacher_forced"),
                                          ({"heldout_text_tokens": 256}, "heldout_text_tokens"),
                                          ({"teacher_forced": True, "heldout_text_window": 1}, "heldout_text_window"),
                                          # review: the stock reference then divided by zero (UnboundLocalError)
                                          ({"max_new_tokens": 1}, "at least 2 new tokens"),
                                          ({"runs": [{"max_new_tokens": 1}]}, "at least 2 new tokens")])
def test_bad_config_is_refused_before_any_work(tmp_path, patch, needle):
    import torch

    if patch.get("timing") == "measured" and torch.cuda.is_available():
        pytest.skip("measured timing is valid on a CUDA machine")
    cfg = {"model": "random:tiny-deepseek", "policies": ["lru"]}
    cfg.update(patch)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=needle):
        _load_config(path)


def test_bench_runs_blocks_on_one_model_and_a_long_prompt_workload(tmp_path):
    """"runs" share the model; each block may narrow policies, budgets and prompts; the long-context
    prompt is recorded as its own workload."""
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "prompts": {"heldout": 2}, "long_prompt_tokens": 120,
           "max_new_tokens": 3, "runs": [{"policies": ["lru", "spice_prefetch"], "n_prompts": 1, "long_prompt": False},
                                         {"budgets": [0.1], "policies": ["on_demand"]}]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = run_bench(_load_config(path), tmp_path / "out", "cpu")
    got = {(r["policy"], r["budget_frac"], r["workload"], r["n_runs"]) for r in recs}
    assert got == {("lru", 0.25, "prompts", 1), ("spice_prefetch", 0.25, "prompts", 1),
                   ("on_demand", 0.1, "prompts", 2), ("on_demand", 0.1, "long", 1)}
    spice = next(r for r in recs if r["policy"] == "spice_prefetch")
    assert spice["greedy_agreement"] == 1.0     # lru is this block's exact reference


def test_a_block_without_an_exact_policy_is_compared_with_an_earlier_blocks_exact_tokens(tmp_path):
    """A block of spice alone at another setting still gets its greedy agreement: every exact policy makes the
    same tokens, so an earlier block's (same link, budget, prompt and length) is the reference."""
    cfg = {"model": "random:tiny-deepseek", "timing": "modeled", "profile": "h200-pcie5x16", "prompts": {"random_ids": 2, "length": 8},
           "max_new_tokens": 4, "budgets": [0.3], "links": ["native"],
           "runs": [{"policies": ["lru"], "long_prompt": False},
                    {"variant": "other", "policies": ["spice"], "tau_prefetch": 0.5, "tau_approx": 0.3, "long_prompt": False},
                    {"variant": "before", "policies": ["spice", "spice_no_lore"], "long_prompt": False},
                    {"variant": "alone", "policies": ["spice"], "budgets": [0.5], "long_prompt": False}]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = {(r["variant"], r["budget_frac"]): r for r in run_bench(_load_config(path), tmp_path / "out", "cpu")}
    assert 0.0 <= recs[("other", 0.3)]["greedy_agreement"] <= 1.0   # against block 1's lru tokens
    assert recs[("before", 0.3)]["greedy_agreement"] is not None     # runs before its block's exact policy
    assert recs[("alone", 0.5)]["greedy_agreement"] is None          # no exact run at 50%: nothing to compare with


def test_a_block_can_resume_with_named_prompt_indices_and_refuses_ones_it_does_not_have(tmp_path):
    """"prompt_indices" runs only those held-out prompts (to finish a block cut short), and they keep
    their indices, so the records merge with the earlier run's."""
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "prompts": {"heldout": 3}, "max_new_tokens": 2,
           "policies": ["lru"], "runs": [{"prompt_indices": [2, 0], "long_prompt": False}]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = run_bench(_load_config(path), tmp_path / "out", "cpu")
    assert [r["n_runs"] for r in recs] == [2]
    cfg["runs"] = [{"prompt_indices": [3], "long_prompt": False}]
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="prompt_indices"):
        run_bench(_load_config(path), tmp_path / "out2", "cpu")


def test_long_prompt_beyond_the_context_is_refused_before_decoding(tmp_path):
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "prompts": {"heldout": 1}, "long_prompt_tokens": 500,
           "max_new_tokens": 64, "policies": ["lru"]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="context"):
        run_bench(_load_config(path), tmp_path / "out", "cpu")


@pytest.mark.parametrize("patch,needle", [({"runs": [{"policies": ["fifo"]}]}, "policy"), ({"runs": "all"}, "runs")])
def test_bad_run_blocks_are_refused_before_any_work(tmp_path, patch, needle):
    cfg = {"model": "random:tiny-deepseek", "policies": ["lru"], "timing": "modeled", **patch}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=needle):
        _load_config(path)


def test_missing_hardware_profile_is_refused_before_the_model_is_built(tmp_path, capsys):
    from spice_core.tools.cli import main

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": "random:tiny-deepseek", "policies": ["lru"], "timing": "modeled"}))
    assert main(["bench", "--config", str(path), "--out", str(tmp_path / "o"), "--hw-profile",
                 str(tmp_path / "nope.json")]) == 2
    assert "calibrate-hw" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["assets/spice-mini", "lift:assets/spice-mini"])
def test_budget_below_one_layers_top_k_is_refused_before_the_model_is_built(tmp_path, model):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": model, "policies": ["lru"], "timing": "modeled",
                                "runs": [{"budgets": [0.25]}, {"budgets": [0.001]}]}))
    with pytest.raises(ConfigError, match="below one layer's top-6"):
        _load_config(path)


@pytest.mark.parametrize("policies", [["resident", "lru", "on_demand"], ["lru", "spice_prefetch"]])
def test_shards_merge_into_the_records_of_one_run(tmp_path, policies):
    """One process per GPU: --shard K/N runs every policy on prompts K, K+N, ...; --merge recombines
    them exactly (modeled timing is deterministic, so the merged records equal an unsharded run's), also without an
    on_demand record to read a copy's bytes off (the merge floored prefetching rows without their prefetches)."""
    from spice_core.tools.cli import main

    cfg = {"model": "random:tiny-deepseek", "policies": policies, "budgets": [0.3],
           "timing": "modeled", "prompts": {"random_ids": 3, "length": 6}, "max_new_tokens": 4}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    assert main(["bench", "--config", str(path), "--out", str(tmp_path / "whole")]) == 0
    for k in (0, 1):
        assert main(["bench", "--config", str(path), "--out", str(tmp_path / f"s{k}"), "--shard", f"{k}/2"]) == 0
    assert main(["bench", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    whole = {r["policy"]: r for r in json.loads((tmp_path / "whole" / "results.json").read_text())}
    merged = {r["policy"]: r for r in json.loads((tmp_path / "m" / "results.json").read_text())}
    s0 = {r["policy"]: r for r in json.loads((tmp_path / "s0" / "results.json").read_text())}
    assert s0["lru"]["n_runs"] == 2 and merged["lru"]["n_runs"] == 3
    assert s0["lru"]["shard"] == [0, 2] and s0["lru"]["raw"]["units"] == [[0, 0], [2, 0]]
    assert s0["lru"]["max_new_tokens"] == 4 and sorted(merged["lru"]["raw"]["units"]) == [[0, 0], [1, 0], [2, 0]]
    # a run merged with one of its own shards would count prompts 0 and 2 twice: refused
    assert main(["bench", "--merge", str(tmp_path / "whole"), str(tmp_path / "s0"), "--out", str(tmp_path / "x")]) == 2
    # a note raised on one shard alone is the merged record's too (and results.md says it)
    s1_path = tmp_path / "s1" / "results.json"
    s1 = json.loads(s1_path.read_text())
    for r in s1:
        r["notes"] = sorted(r.get("notes", []) + ["a note only shard 1 raised"])
    s1_path.write_text(json.dumps(s1))
    assert main(["bench", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m2")]) == 0
    assert all("a note only shard 1 raised" in r["notes"] for r in json.loads((tmp_path / "m2" / "results.json").read_text())
               if r.get("raw"))
    assert "a note only shard 1 raised" in (tmp_path / "m2" / "results.md").read_text()
    for pol in whole:
        for key in ("tpot_ms_median", "tpot_ms_p90", "hit_rate", "bytes_per_token", "stall_ms_per_token",
                    "n_decode_tokens", "floor_ms", "greedy_agreement"):
            assert merged[pol][key] == pytest.approx(whole[pol][key]), (pol, key)
        for key in ("time_split_ms_per_token", "busy_ms_per_token"):
            assert merged[pol][key] == pytest.approx(whole[pol][key]), (pol, key)


@pytest.mark.parametrize("shard", ["2/2", "a/b", "1", "4/5"])
def test_bad_shard_is_refused_before_any_work(tmp_path, shard, capsys):
    """4/5 of 3 prompts selects none (regression, review: it wrote an empty results.json and exited 0)."""
    from spice_core.tools.cli import main

    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": "random:tiny-deepseek", "policies": ["lru"], "timing": "modeled",
                                "prompts": {"random_ids": 3, "length": 6}}))
    assert main(["bench", "--config", str(path), "--out", str(tmp_path / "o"), "--shard", shard]) == 2
    assert "--shard" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.json").exists()


def test_a_modeled_run_names_what_timed_it_a_profile_file_and_the_miniatures_own_shape(tmp_path):
    """Regressions (review): with "hw_profile" the records named the default profile though the file's timed the
    run; the Qwen2 miniature with no "shape" was timed at DeepSeek-V2-Lite's sizes and recorded shape None; a trace
    from an earlier run in --out was kept beside the new results."""
    from spice_core.timing.profiles import get_profile

    prof = dict(get_profile("rtx4060-pcie4x8").as_dict(), name="my-slow-box")
    (tmp_path / "slow.json").write_text(json.dumps(prof))
    cfg = {"model": "assets/spice-mini-qwen2", "policies": ["lru"], "budgets": [0.3], "timing": "modeled",
           "prompts": {"heldout": 1}, "max_new_tokens": 3, "export_traces": ["lru"]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    (rec,) = run_bench(_load_config(path), tmp_path / "out", "cpu")
    assert rec["shape"] == "qwen2-57b-a14b" and rec["profile"] == "rtx4090-pcie4x16"
    trace = tmp_path / "out" / "trace-native-0.30-lru.json"
    first = json.loads(trace.read_text())
    path.write_text(json.dumps(dict(cfg, hw_profile=str(tmp_path / "slow.json"))))
    (rec,) = run_bench(_load_config(path), tmp_path / "out", "cpu")
    assert rec["profile"] == "my-slow-box" and rec["link_gbps"] == prof["h2d_pinned_gbps"]
    again = json.loads(trace.read_text())
    assert again != first and again["otherData"]["profile"] == "my-slow-box", "the earlier run's trace was kept"


def test_traces_of_every_prompt_when_asked(tmp_path):
    cfg = {"model": "random:tiny-deepseek", "policies": ["lru"], "budgets": [0.3], "timing": "modeled",
           "prompts": {"random_ids": 2, "length": 6}, "max_new_tokens": 3, "export_traces": ["lru"],
           "export_trace_prompts": "all"}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    run_bench(_load_config(path), tmp_path / "out", "cpu")
    assert sorted(p.name for p in (tmp_path / "out").glob("trace-*.json")) == [
        "trace-native-0.30-lru-p0.json", "trace-native-0.30-lru-p1.json"]
    # Regression (review): the per-prompt results.partial.json stayed beside the complete results.json.
    assert (tmp_path / "out" / "results.json").exists() and not (tmp_path / "out" / "results.partial.json").exists()


def test_heldout_prompts_come_from_the_file_beside_the_benched_model(tmp_path):
    """Regression: {"heldout": N} read the default shipped model's file whatever model was benched; a second
    shipped model (spice-mini-qwen2) has a held-out split of its own."""
    from spice_core.model.loader import _load_tokenizer
    from spice_core.tools.bench import _prompt_ids, model_folder
    from tiny_models import build_tiny, write_heldout

    d = build_tiny("qwen2_moe", tmp_path / "m")
    write_heldout(d, "red")
    tok = _load_tokenizer(d)
    for spec in (str(d), f"lift:{d}"):
        assert model_folder(spec) == d
        ids = _prompt_ids({"prompts": {"heldout": 1}}, tok, 96, model_folder(spec))
        assert tok.decode(ids[0]) == "the red dog"


def test_median_interval_holds_the_median_and_merging_shards_gives_the_unsharded_record():
    import random

    from spice_core.tools.bench_records import derive, median_ci95, merge_records

    rng = random.Random(3)
    steps = [rng.gauss(40.0, 4.0) for _ in range(400)]
    lo, hi = median_ci95(steps)
    med = derive({"step_ms": steps, "ttft_ms": [1.0], "selections": 1, "hits": 1, "bytes": 0, "stall_ms": 0.0,
                  "miss_split": {}, "wasted_prefetch_bytes": 0, "agreements": [], "gpu_peak_bytes": 0,
                  "n_runs": 1})["tpot_ms_median"]
    assert lo <= med <= hi and hi - lo < 2.0
    assert median_ci95(steps) == [lo, hi]                   # fixed seed: the same steps, the same interval
    assert median_ci95([1.0]) is None

    def rec(part):
        raw = {"step_ms": part, "ttft_ms": [1.0], "selections": len(part), "hits": 0, "bytes": 0, "stall_ms": 0.0,
               "miss_split": {"copy": len(part)}, "wasted_prefetch_bytes": 0, "agreements": [], "gpu_peak_bytes": 0,
               "n_runs": 1}
        return {"model": "m", "timing": "measured", "link": "native", "budget_frac": 0.25, "policy": "lru",
                "workload": "prompts", "variant": "", "raw": raw, **derive(raw)}

    whole = merge_records([rec(steps)])[0]
    sharded = merge_records([rec(steps[::2]), rec(steps[1::2])])[0]
    assert sorted(whole["raw"]["step_ms"]) == sorted(sharded["raw"]["step_ms"])
    assert whole["tpot_ms_median"] == sharded["tpot_ms_median"]
    assert whole["tpot_ms_median_ci95"] is not None and sharded["n_runs"] == 2


def test_shards_of_two_configs_are_refused_at_merge_because_their_records_carry_provenance(tmp_path, capsys):
    """Issue 26 defect 7: shards whose configs differ only in max_new_tokens must not blend into one median."""
    from spice_core.tools.cli import main

    base = {"model": "random:tiny-deepseek", "policies": ["lru"], "budgets": [0.3], "timing": "modeled",
            "prompts": {"random_ids": 2, "length": 6}, "max_new_tokens": 4}
    for k, new in ((0, 4), (1, 5)):
        path = tmp_path / f"cfg{k}.json"
        path.write_text(json.dumps(dict(base, max_new_tokens=new)))
        assert main(["bench", "--config", str(path), "--out", str(tmp_path / f"s{k}"), "--shard", f"{k}/2"]) == 0
    rec = json.loads((tmp_path / "s0" / "results.json").read_text())[0]
    assert set(rec["provenance"]) == {"config", "prompts", "code"}
    assert main(["bench", "--merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 2
    assert "provenance" in capsys.readouterr().err


def test_a_block_may_run_its_own_thresholds_and_its_records_say_which(tmp_path):
    """Two settings of one policy in one run (e.g. a hand-picked and a tuned spice): each "variant" block sets
    its own tau_approx/lore_rank, its records carry them, and one variant label with two settings is refused."""
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "prompts": {"heldout": 1}, "max_new_tokens": 3,
           "tau_approx": 0.0, "lore_rank": 4,
           "runs": [{"variant": "exact", "policies": ["spice"], "long_prompt": False},
                    {"variant": "lossy", "policies": ["spice"], "long_prompt": False, "tau_approx": 0.2, "lore_rank": 2}]}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = {(r["variant"], r["policy"]): r for r in run_bench(_load_config(path), tmp_path / "out", "cpu")}
    assert recs[("exact", "spice")]["settings"]["tau_approx"] == 0.0
    assert recs[("lossy", "spice")]["settings"] == {"tau_prefetch": 0.2, "tau_approx": 0.2, "max_lookahead": 4,
                                                    "lore_rank": 2}
    assert recs[("exact", "spice")]["miss_split"]["approx"] == 0
    assert recs[("lossy", "spice")]["miss_split"]["approx"] > 0
    assert recs[("exact", "spice")]["ppl_delta_pct"] == 0.0 and recs[("lossy", "spice")]["ppl_delta_pct"] is None
    cfg["runs"][1]["variant"] = "exact"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="variant 'exact'"):
        run_bench(_load_config(path), tmp_path / "out2", "cpu")


def test_interleaved_blocks_run_every_block_on_a_prompt_before_the_next(tmp_path, monkeypatch):
    """An A/B of two blocks' settings: with "interleave_runs" each prompt runs both blocks (their policies back to
    back) before the next prompt, so machine drift hits both arms alike; the records are the blocks' either way."""
    from spice_core.engine import SpiceEngine

    calls = []
    start = SpiceEngine.start_ids

    def logged(self, ids, s):
        calls.append((tuple(ids), s.tau_approx))
        return start(self, ids, s)

    monkeypatch.setattr(SpiceEngine, "start_ids", logged)
    cfg = {"model": "assets/spice-mini", "timing": "modeled", "prompts": {"heldout": 2}, "max_new_tokens": 2,
           "policies": ["spice"], "runs": [{"variant": "a", "long_prompt": False},
                                           {"variant": "b", "long_prompt": False, "tau_approx": 0.2}]}
    path = tmp_path / "cfg.json"
    for interleave in (False, True):
        calls.clear()
        path.write_text(json.dumps(dict(cfg, interleave_runs=interleave)))
        recs = run_bench(_load_config(path), tmp_path / f"out{interleave}", "cpu")
        prompts = list(dict.fromkeys(ids for ids, _ in calls))
        order = [(prompts.index(ids), tau) for ids, tau in calls]
        if interleave:
            assert order == [(0, 0.0), (0, 0.2), (1, 0.0), (1, 0.2)]
        else:
            assert order == [(0, 0.0), (1, 0.0), (0, 0.2), (1, 0.2)]
        assert {(r["variant"], r["n_runs"]) for r in recs} == {("a", 2), ("b", 2)}
    path.write_text(json.dumps(dict(cfg, interleave_runs="yes")))
    with pytest.raises(ConfigError, match="interleave_runs"):
        _load_config(path)


def test_each_record_says_the_tokens_its_own_runs_asked_so_a_resumed_block_merges(tmp_path):
    """Regression (review): max_new_tokens was noted per variant over every block, so resident and lru (6 tokens)
    read [3, 6], and a resumed on_demand block (3 tokens) was refused at merge."""
    from spice_core.tools.cli import main

    base = {"model": "random:tiny-deepseek", "timing": "modeled", "budgets": [0.3],
            "prompts": {"random_ids": 3, "length": 6}}
    first = dict(base, runs=[{"policies": ["resident", "lru"], "max_new_tokens": 6},
                             {"policies": ["on_demand"], "max_new_tokens": 3, "prompt_indices": [0, 1]}])
    resume = dict(base, runs=[{"policies": ["on_demand"], "max_new_tokens": 3, "prompt_indices": [2]}])
    for name, cfg in (("a", first), ("b", resume)):
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
        assert main(["bench", "--config", str(tmp_path / f"{name}.json"), "--out", str(tmp_path / name)]) == 0
    recs = {r["policy"]: r for r in json.loads((tmp_path / "a" / "results.json").read_text())}
    assert (recs["resident"]["max_new_tokens"], recs["lru"]["max_new_tokens"], recs["on_demand"]["max_new_tokens"]) \
        == (6, 6, 3)
    assert main(["bench", "--merge", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "m")]) == 0
    merged = {r["policy"]: r for r in json.loads((tmp_path / "m" / "results.json").read_text())}
    assert merged["on_demand"]["n_runs"] == 3


def test_a_shard_that_keeps_none_of_the_blocks_prompts_names_them(tmp_path, capsys):
    from spice_core.tools.cli import main

    cfg = {"model": "random:tiny-deepseek", "timing": "modeled", "prompts": {"random_ids": 4, "length": 6},
           "runs": [{"policies": ["lru"], "prompt_indices": [1, 3]}]}
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    assert main(["bench", "--config", str(tmp_path / "c.json"), "--out", str(tmp_path / "o"), "--shard", "0/2"]) == 2
    err = capsys.readouterr().err
    assert "[1, 3]" in err and "0 modulo 2" in err and "Traceback" not in err, err


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "not json"])
def test_a_damaged_heldout_file_gets_a_one_line_error_naming_it(tmp_path, damage):
    """Regression (review): a truncated spice-heldout.json.gz ended `bench` in gzip's EOFError traceback."""
    import gzip

    from spice_core.errors import ConfigError
    from spice_core.heldout import HELDOUT_FILENAME, prompts

    path = tmp_path / HELDOUT_FILENAME
    whole = gzip.compress(b'{"format": "x", "prompts": []}' if damage != "not json" else b"\xff{not json")
    path.write_bytes(whole[: len(whole) // 2] if damage == "truncated" else whole if damage == "not json"
                     else b"plain text")
    with pytest.raises(ConfigError, match=rf"{HELDOUT_FILENAME} cannot be read .*regenerate it"):
        prompts(1, tmp_path)


def test_results_md_says_what_the_runs_notes_say(tmp_path):
    """An uncalibrated model's spice runs without its draft heads and LoRE, which the record's notes say: the table
    a reader opens said nothing, so a spice row read as the full method."""
    cfg = {"model": "random:tiny-deepseek", "policies": ["lru", "spice"], "budgets": [0.3], "links": ["native"],
           "timing": "modeled", "profile": "h200-pcie5x16", "shape": "deepseek-v2-lite",
           "prompts": {"random_ids": 1, "length": 8}, "max_new_tokens": 4, "tau_approx": 0.1}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    recs = run_bench(_load_config(path), tmp_path / "out", "cpu")
    spice = next(r for r in recs if r["policy"] == "spice")
    assert spice["notes"]
    md = (tmp_path / "out" / "results.md").read_text()
    notes = md.split("Notes of the runs:")[1]
    for note in spice["notes"]:
        line = next(line for line in notes.splitlines() if line.startswith(f"- {note} ("))
        assert "spice" in line


def test_merge_refuses_a_folder_whose_later_run_of_another_config_was_cut_short(tmp_path, capsys):
    """Regression (review): a run into a folder that held an earlier run's results, interrupted, left its
    results.partial.json beside the old results.json, and --merge took the old one without a word. The same run's
    partial (a stop between writing results.json and removing it; files copied with equal times) is no such case."""
    from spice_core.tools.cli import main

    cfg = {"model": "random:tiny-deepseek", "policies": ["lru"], "budgets": [0.3], "timing": "modeled",
           "prompts": {"random_ids": 2, "length": 6}, "max_new_tokens": 3}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    d = tmp_path / "run"
    assert main(["bench", "--config", str(path), "--out", str(d)]) == 0
    partial = d / "results.partial.json"
    partial.write_text((d / "results.json").read_text())        # the same run's
    assert main(["bench", "--merge", str(d), "--out", str(tmp_path / "m")]) == 0
    other = tmp_path / "other"
    path.write_text(json.dumps(dict(cfg, max_new_tokens=4)))
    assert main(["bench", "--config", str(path), "--out", str(other)]) == 0
    partial.write_text((other / "results.json").read_text())    # what a later run of another config leaves
    capsys.readouterr()
    assert main(["bench", "--merge", str(d), "--out", str(tmp_path / "m2")]) == 2
    err = capsys.readouterr().err
    assert "from another run than its results.json" in err and "Traceback" not in err, err
    assert not (tmp_path / "m2" / "results.json").exists()
    partial.write_text("[{")                                     # cut short mid-write: not known to be the same run
    assert main(["bench", "--merge", str(d), "--out", str(tmp_path / "m2")]) == 2
