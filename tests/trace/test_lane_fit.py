"""The CPU lane's rate and fixed compute per job, fitted from measured records of two expert sizes."""
import json
from dataclasses import replace

import pytest

from spice_core.errors import ConfigError
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape, profile_from_dict
from spice_core.tools.cli import main
from spice_core.tools.lane_fit import fit_lane_costs

FIXED_US, GBPS = 300.0, 60.0


def _rec(policy, expert_mb, us_per_expert=None, experts=1000, timing="measured", model="lift:m"):
    us = FIXED_US + expert_mb * 1e3 / GBPS if us_per_expert is None else us_per_expert
    return {"policy": policy, "timing": timing, "model": model, "link": "native", "budget_frac": 0.25,
            "raw": {"lane_experts": experts, "lane_bytes_sum": expert_mb * 1e6 * experts,
                    "lane_compute_us_sum": us * experts}}


def test_two_expert_sizes_give_the_lanes_rate_and_fixed_cost():
    fit = fit_lane_costs([_rec("cpu_compute", 17.3), _rec("cpu_compute", 17.3), _rec("cpu_compute", 55.05)])
    assert fit["cpu_mem_gbps"] == pytest.approx(GBPS) and fit["cpu_job_compute_us"] == pytest.approx(FIXED_US)
    assert fit["evidence"]["records"] == 3


def test_lane_jobs_beside_copies_are_evidence_not_fit():
    slow = _rec("spice", 17.3, us_per_expert=1.2 * (FIXED_US + 17.3e3 / GBPS))
    fit = fit_lane_costs([_rec("cpu_compute", 17.3), _rec("cpu_compute", 55.05), slow,
                          _rec("cpu_compute", 30.0, us_per_expert=1.0, timing="modeled")])
    assert fit["cpu_mem_gbps"] == pytest.approx(GBPS)
    (shared,) = fit["evidence"]["dram_shared_with_copies"].values()
    assert shared["over_fit_pct"] == pytest.approx(20.0, abs=0.1)


@pytest.mark.parametrize("recs, needle", [
    ([_rec("cpu_compute", 17.3), _rec("cpu_compute", 17.3)], "two expert sizes"),
    ([_rec("spice", 17.3), _rec("spice", 55.05)], "two expert sizes"),
    ([_rec("cpu_compute", 17.3, 900.0), _rec("cpu_compute", 55.05, 800.0)], "does not grow"),
])
def test_the_fit_refuses_what_cannot_tell_rate_from_fixed_cost(recs, needle):
    with pytest.raises(ConfigError, match=needle):
        fit_lane_costs(recs)


def test_the_fixed_compute_is_charged_once_per_cpu_expert():
    base = get_profile("h200-pcie5x16-graphed")
    shape = get_shape("deepseek-v2-lite")
    with_fixed = replace(base, cpu_job_compute_us=250.0)
    assert CostModel(with_fixed, shape).cpu_expert_ms() - CostModel(base, shape).cpu_expert_ms() == \
        pytest.approx(0.25)


def test_recalibrate_fits_the_lane_alone_and_names_it(tmp_path, capsys):
    recs = tmp_path / "results.json"
    recs.write_text(json.dumps([_rec("cpu_compute", 17.3), _rec("cpu_compute", 55.05)]))
    prof = tmp_path / "hw.json"
    base = get_profile("h200-pcie5x16-graphed")
    prof.write_text(json.dumps(base.as_dict()))
    out = tmp_path / "lane.json"
    assert main(["recalibrate", "--profile", str(prof), "--lane-records", str(recs), "--out", str(out)]) == 0
    new = profile_from_dict(json.loads(out.read_text()))
    assert new.cpu_mem_gbps == pytest.approx(GBPS) and new.cpu_job_compute_us == pytest.approx(FIXED_US)
    assert new.host_layer_us == base.host_layer_us and new.name.endswith("+lane")
    assert main(["recalibrate", "--profile", str(prof), "--out", str(out)]) != 0
    assert "--lane-records" in capsys.readouterr().err


def test_a_record_with_the_lanes_busy_wall_is_fitted_on_it_not_on_a_jobs_time():
    """Side by side (the auto lane) a job takes 3x as long as alone while the layer's busy wall per expert is the
    lane's rate: records that carry the busy wall are fitted on it."""
    from spice_core.tools.lane_fit import lane_points

    recs = []
    for mb in (17.3, 55.05):
        r = _rec("cpu_compute", mb)
        n, us = r["raw"]["lane_experts"], r["raw"]["lane_compute_us_sum"]
        r["raw"].update(lane_compute_us_sum=3 * us, lane_bursts=n // 4, lane_busy_us_sum=us)
        recs.append(r)
    assert [p["basis"] for p in lane_points(recs)] == ["busy wall", "busy wall"]
    fit = fit_lane_costs(recs)
    assert fit["cpu_mem_gbps"] == pytest.approx(GBPS) and fit["cpu_job_compute_us"] == pytest.approx(FIXED_US)


def test_records_that_say_which_layers_ran_side_by_side_are_fitted_on_the_others_and_give_the_speedup():
    """A layer's experts side by side end 1.4x sooner than one after another: the fit takes the layers run one after
    another for the rate and fixed cost (what the cost model charges a job), and the ratio as cpu_side_speedup."""
    from spice_core.tools.lane_fit import lane_points

    recs = []
    for mb in (17.3, 55.05):
        r = _rec("cpu_compute", mb)
        n, us = r["raw"]["lane_experts"], r["raw"]["lane_compute_us_sum"] / r["raw"]["lane_experts"]
        side_n = 900                                      # 900 experts in layers of 3+, 100 in layers of 1-2
        r["raw"].update(lane_bursts=350, lane_busy_us_sum=(n - side_n) * us + side_n * us / 1.4,
                        lane_side_bursts=250, lane_side_experts=side_n, lane_side_busy_us_sum=side_n * us / 1.4)
        recs.append(r)
    assert {p["basis"] for p in lane_points(recs)} == {"busy wall, one after another"}
    fit = fit_lane_costs(recs)
    assert fit["cpu_mem_gbps"] == pytest.approx(GBPS) and fit["cpu_job_compute_us"] == pytest.approx(FIXED_US)
    assert fit["cpu_side_speedup"] == pytest.approx(1.4)
    # the same records without the side sums: the whole busy wall, a faster lane than one job alone is
    for r in recs:
        for k in ("lane_side_bursts", "lane_side_experts", "lane_side_busy_us_sum"):
            del r["raw"][k]
    old = fit_lane_costs(recs)
    # ... in which the side-by-side gain already is: the fit resets the speedup so it is not applied twice
    assert old["cpu_side_speedup"] == 1.0 and old["cpu_mem_gbps"] > GBPS


def _side_only(r, speedup=1.4):
    """``r`` as a run whose every layer sent the lane 3+ experts: all its bursts ran side by side."""
    n, us = r["raw"]["lane_experts"], r["raw"]["lane_compute_us_sum"] / r["raw"]["lane_experts"]
    r["raw"].update(lane_bursts=250, lane_busy_us_sum=n * us / speedup, lane_side_bursts=250, lane_side_experts=n,
                    lane_side_busy_us_sum=n * us / speedup)
    return r


def test_a_record_whose_layers_all_ran_side_by_side_is_not_fitted_as_one_after_another():
    """Regression: such a record has no layer run one after another, and its whole busy wall (the side-by-side
    lane's, 1.4x faster) was fitted as the rate the cost model then divides by cpu_side_speedup again."""
    from spice_core.tools.lane_fit import lane_points

    recs = []
    for mb in (17.3, 55.05):
        r = _rec("cpu_compute", mb)
        n, us = r["raw"]["lane_experts"], r["raw"]["lane_compute_us_sum"] / r["raw"]["lane_experts"]
        r["raw"].update(lane_bursts=350, lane_busy_us_sum=100 * us + 900 * us / 1.4, lane_side_bursts=250,
                        lane_side_experts=900, lane_side_busy_us_sum=900 * us / 1.4)
        recs += [r, _side_only(_rec("cpu_compute", mb))]
    assert [p["basis"] for p in lane_points(recs)] == ["busy wall, one after another"] * 2
    fit = fit_lane_costs(recs)
    assert fit["cpu_mem_gbps"] == pytest.approx(GBPS) and fit["cpu_job_compute_us"] == pytest.approx(FIXED_US)
    assert fit["cpu_side_speedup"] == pytest.approx(1.4) and fit["evidence"]["records"] == 2
    with pytest.raises(ConfigError, match="side by side"):
        fit_lane_costs([_side_only(_rec("cpu_compute", mb)) for mb in (17.3, 55.05)])
