"""The three-lane floor (bench_records.three_lane_floor, which bench and the headline report use) on hand-made
records: the link and the CPU lane share a token's exact misses so that both finish together, host DRAM bounds both,
compute bounds everything."""
import sys
from pathlib import Path

import pytest

from spice_core.tools.bench_records import three_lane_floor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))   # headline_report, for its coverage

EXPERT = 17_302_000          # bytes


def rec(policy, tpot, copy=0, cpu=0, approx=0, link_gbps=13.0, **kw):
    return {"policy": policy, "workload": "prompts", "tpot_ms_median": tpot, "n_decode_tokens": 10,
            "link_gbps": link_gbps, "bytes_per_token": copy / 10 * EXPERT,
            "miss_split": {"copy": copy, "cpu": cpu, "approx": approx}, **kw}


def test_the_misses_split_so_that_link_and_lane_finish_together():
    rows = [rec("resident", 7.0), rec("on_demand", 220.0, copy=1560), rec("spice", 70.0, copy=100, cpu=200, approx=300)]
    three_lane_floor(rows, lane_ms=0.7, dram_gbps=81.0)
    a = EXPERT / 13e6                                   # ms per expert over the link: 1.33
    n = 156                                             # on_demand: every selection of a token, copied
    assert rows[1]["floor3_ms"] == pytest.approx(n * a * 0.7 / (a + 0.7))
    assert rows[1]["tpot_over_floor3"] == pytest.approx(220.0 / rows[1]["floor3_ms"])
    n_spice = 30                                        # (100 copied + 200 on the CPU) / 10 tokens; approximated move nothing
    assert rows[2]["floor3_ms"] == pytest.approx(max(7.0, n_spice * a * 0.7 / (a + 0.7)))
    assert rows[0]["floor3_ms"] == 7.0                  # nothing to move: compute


def test_host_dram_bounds_a_fast_link_and_a_fast_lane_together():
    rows = [rec("resident", 1.0), rec("on_demand", 50.0, copy=1560, link_gbps=1000.0)]
    three_lane_floor(rows, lane_ms=0.01, dram_gbps=81.0)
    assert rows[1]["floor3_ms"] == pytest.approx(156 * EXPERT / 81e6)


def test_peers_and_runs_without_a_lane_measurement_get_no_floor():
    rows = [rec("resident", 7.0), rec("on_demand", 220.0, copy=1560), rec("peer_hf_offload", 3000.0, copy=10, peer="hf_offload")]
    three_lane_floor(rows, lane_ms=0.7)
    assert "floor3_ms" not in rows[2]
    rows = [rec("resident", 7.0), rec("on_demand", 220.0, copy=1560)]
    three_lane_floor(rows, lane_ms=None)
    assert all("floor3_ms" not in r for r in rows)


def test_each_model_has_its_own_compute_and_the_lane_scales_with_its_expert_bytes():
    big = 3 * EXPERT
    rows = [rec("resident", 7.0, model="a"), rec("on_demand", 220.0, copy=1560, model="a"),
            rec("resident", 14.0, model="b"),
            dict(rec("on_demand", 900.0, copy=1560, model="b"), bytes_per_token=156 * big)]
    three_lane_floor(rows, lane_ms=0.7, dram_gbps=81.0, lane_bytes=EXPERT)
    a_small, a_big = EXPERT / 13e6, big / 13e6
    assert rows[1]["floor3_ms"] == pytest.approx(156 * a_small * 0.7 / (a_small + 0.7))
    assert rows[3]["floor3_ms"] == pytest.approx(max(156 * big / 81e6, 156 * a_big * 2.1 / (a_big + 2.1)))
    assert rows[2]["floor3_ms"] == 14.0                 # b's compute, not a's


def test_a_lane_given_as_a_fixed_cost_plus_a_rate_prices_each_models_expert_by_its_bytes():
    """Regression (review): the lane's time measured on a 17.3 MB expert, scaled in proportion to a 55 MB one, put
    the Qwen2 lift's lane at 2.27 ms per expert where its records measured 0.94-1.34, and rows ran below their floor.
    A lane of a fixed cost per job plus bytes at a rate (the headline's fit) prices each model's expert apart."""
    from headline_report import lane_ms_for

    big = 3 * EXPERT
    rows = [rec("resident", 7.0, model="a"), rec("on_demand", 220.0, copy=1560, model="a"),
            rec("resident", 14.0, model="b"),
            dict(rec("on_demand", 900.0, copy=1560, model="b"), bytes_per_token=156 * big)]
    lane = lane_ms_for((0.35, 63.0))
    assert lane(EXPERT) == pytest.approx(0.35 + EXPERT / 63e6)
    three_lane_floor(rows, lane_ms=lane, dram_gbps=81.0)
    for i, nbytes in ((1, EXPERT), (3, big)):
        a, c = nbytes / 13e6, 0.35 + nbytes / 63e6
        assert rows[i]["floor3_ms"] == pytest.approx(max(156 * nbytes / 81e6, 156 * a * c / (a + c)))
    assert 0.35 + big / 63e6 < 3 * (0.35 + EXPERT / 63e6)      # not in proportion: the fixed part is paid once


def test_coverage_lists_what_is_still_to_run_per_model():
    from headline_report import coverage
    full = [dict(rec(p, 10.0, model="lift:spice-mini"), link=link, budget_frac=b, n_runs=8,
                 provenance={"code": "c0de"}) for p in [f"p{i}" for i in range(10)]
            for link in ("native", "pcie4x8") for b in (0.1, 0.25, 0.5)]
    part = [dict(rec(p, 10.0, model="lift:spice-mini-qwen2"), link="native", budget_frac=0.25, n_runs=3,
                 provenance={"code": "c0de"}) for p in [f"p{i}" for i in range(9)]]
    table, gaps = coverage(full + part)
    assert "| DeepSeek-V2-Lite | pcie4x8 | 50% | prompts | 8 |" in table
    assert "Qwen2-57B-A14B, native, 25%, 8 prompts: 3 of 8 prompts, 9 of 10 policies (engine code `c0de`)" in gaps
    assert "Qwen2-57B-A14B, pcie4x8, 25%, 8 prompts: not run" in gaps
    assert not [g for g in gaps if g.startswith("DeepSeek-V2-Lite") and "8 prompts" in g]


def test_bench_floors_its_own_run_with_the_lane_it_measured_and_merging_floors_again():
    from spice_core.tools.bench_records import add_three_lane_floor

    rows = [rec("resident", 7.0), rec("lru", 160.0, copy=1100), rec("spice", 45.0, copy=5, cpu=300, approx=600,
                                                                      cpu_lane_ms_per_expert=0.6)]
    add_three_lane_floor(rows, EXPERT, profile_lane_ms=1.0, dram_gbps=81.0)
    a = EXPERT / 13e6
    assert rows[1]["floor3_ms"] == pytest.approx(110 * a * 0.6 / (a + 0.6))      # the lane this run measured
    assert rows[2]["floor3_inputs"]["lane_source"] == "measured"
    assert rows[2]["floor3_ms"] == pytest.approx(max(7.0, 30.5 * a * 0.6 / (a + 0.6)))
    assert rows[2]["floor3_ms"] < rows[2]["tpot_ms_median"]                       # a floor, below what ran
    plain = [rec("resident", 7.0), rec("lru", 160.0, copy=1100)]
    add_three_lane_floor(plain, EXPERT, profile_lane_ms=1.0, dram_gbps=None)       # no lane ran: the profile's
    assert plain[1]["floor3_ms"] == pytest.approx(110 * a * 1.0 / (a + 1.0))
    assert plain[1]["floor3_inputs"]["lane_source"] == "profile"


def test_merged_shards_are_floored_again_over_their_combined_steps():
    from spice_core.tools.bench_records import add_three_lane_floor, derive, merge_records

    def shard(policy, steps, copies, ttft):
        raw = {"step_ms": steps, "ttft_ms": [ttft], "selections": 156 * len(steps), "hits": 0, "bytes": 0,
               "stall_ms": 0.0, "miss_split": {"approx": 0, "cpu": 0, "copy": copies}, "wasted_prefetch_bytes": 0,
               "agreements": [], "gpu_peak_bytes": 0, "n_runs": 1, "device_ms": steps}
        return {"model": "m", "timing": "measured", "link": "pcie4x8", "budget_frac": 0.25, "policy": policy,
                "workload": "prompts", "variant": "", "link_gbps": 13.0, "raw": raw, **derive(raw)}

    a = [shard("resident", [7.0, 7.2], 0, 50.0), shard("on_demand", [220.0, 221.0], 312, 90.0)]
    b = [shard("resident", [7.1, 6.9], 0, 51.0), shard("on_demand", [219.0, 222.0], 156, 91.0)]
    for part in (a, b):
        add_three_lane_floor(part, EXPERT, profile_lane_ms=0.7, dram_gbps=81.0)
    merged = {r["policy"]: r for r in merge_records(a + b, ["a", "a", "b", "b"])}
    od = merged["on_demand"]
    n, x = (312 + 156) / 4, EXPERT / 13e6                 # copies per token over both shards' 4 steps
    assert od["floor3_ms"] == pytest.approx(max(7.0, n * x * 0.7 / (x + 0.7), n * EXPERT / 81e6))
    assert od["tpot_over_floor3"] == pytest.approx(od["tpot_ms_median"] / od["floor3_ms"])


def test_the_peer_table_names_each_peers_model_and_sets_it_beside_that_models_engine_rows():
    from headline_report import peer_table
    common = {"workload": "prompts", "link": "native", "n_runs": 2, "n_decode_tokens": 16, "tpot_ms_p90": 1.0,
              "bytes_per_token": 0.0, "tpot_ms_median_ci95": None}
    engine = [{**common, "model": "lift:spice-mini", "policy": "spice", "budget_frac": 0.25, "tpot_ms_median": 20.0},
              {**common, "model": "lift:spice-mini-qwen2", "policy": "spice", "budget_frac": 0.25, "tpot_ms_median": 70.0}]
    peers = [{**common, "model": m, "policy": "peer_hf_offload", "peer": "hf_offload", "budget_frac": 0.25,
              "tpot_ms_median": t} for m, t in (("lift:spice-mini-qwen2", 7000.0), ("lift:spice-mini", 3000.0))]
    rows = [ln for ln in peer_table(peers, engine).splitlines()[2:]]
    assert [ln.split("|")[1].strip() for ln in rows] == ["DeepSeek-V2-Lite", "Qwen2-57B-A14B"]   # the protocol's order
    assert rows[0].rstrip(" |").endswith("150.0×") and rows[1].rstrip(" |").endswith("100.0×")   # each over its own spice


def test_the_link_floor_charges_exact_misses_only_not_approximated_ones():
    """Regression (review): spice's floor charged every miss as a copy, approximations included, and read 119.1 ms
    beside a measured 52.8 ms token (x8, 25%). An approximated miss moves nothing; a CPU-lane miss is charged as a
    copy in this two-lane floor."""
    from spice_core.tools.bench_records import add_floors

    base = {"link": "native", "workload": "prompts", "routed_bytes_per_token": 1e9, "link_gbps": 10.0}
    recs = [dict(base, policy="resident", tpot_ms_median=5.0, hit_rate=1.0, miss_split={}),
            dict(base, policy="lru", tpot_ms_median=70.0, hit_rate=0.4, miss_split={"copy": 60}),
            dict(base, policy="spice", tpot_ms_median=30.0, hit_rate=0.4,
                 miss_split={"approx": 45, "cpu": 10, "copy": 5})]
    add_floors(recs)
    floors = {r["policy"]: r["floor_ms"] for r in recs}
    assert floors["lru"] == pytest.approx(0.6 * 1e9 / 1e7)                  # 60 ms: every miss copied
    assert floors["spice"] == pytest.approx(0.6 * (15 / 60) * 1e9 / 1e7)   # 15 ms: the 15 exact misses of 60
    assert floors["resident"] == 5.0


def test_a_used_prefetch_crossed_the_link_and_counts_toward_both_floors_a_wasted_one_does_not():
    """Regression: the floors charged a token's misses only, so a prefetching row's prefetch hits moved for free and
    oracle_prefetch (every expert prefetched, few misses) read ~7x its floor while its link was full. 10 tokens of
    20 selections; the oracle copies 120 experts (100 used, 20 wasted) with 10 misses among them."""
    from spice_core.tools.bench_records import add_floors, carried_experts_per_token

    def row(policy, tpot, copies, copy_misses, wasted, hits):
        return dict(rec(policy, tpot, copy=copy_misses), bytes_per_token=copies / 10 * EXPERT,
                    wasted_prefetch_bytes=wasted * EXPERT, hit_rate=hits / 200, routed_bytes_per_token=20 * EXPERT,
                    raw={"selections": 200})

    rows = [row("resident", 7.0, 0, 0, 0, 200), row("on_demand", 220.0, 200, 200, 0, 0),
            row("oracle_prefetch", 150.0, 120, 10, 20, 190)]
    assert carried_experts_per_token(rows[2], EXPERT) == pytest.approx(10.0)      # (120 - 20) copies / 10 tokens
    assert carried_experts_per_token(rows[2], None) == pytest.approx(1.0)         # no copy size: its misses only
    add_floors(rows)                                                              # the copy size from on_demand
    a = EXPERT / 13e6
    assert rows[2]["floor_ms"] == pytest.approx(10 * a)                           # 100 of 200 selections carried
    assert rows[1]["floor_ms"] == pytest.approx(20 * a)
    three_lane_floor(rows, lane_ms=0.7, dram_gbps=81.0)
    assert rows[2]["floor3_ms"] == pytest.approx(max(7.0, 10 * a * 0.7 / (a + 0.7)))
    assert rows[2]["floor3_ms"] < rows[2]["tpot_ms_median"]
