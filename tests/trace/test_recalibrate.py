"""Host-cost recalibration from measured traces, and the timing model's host lane."""
import gzip
import json
from dataclasses import replace

import pytest

from spice_core.tools.cli import main
from spice_core.errors import ConfigError
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import get_profile, get_shape
from spice_core.tools.recalibrate import fit_host_costs, read_trace_events, recalibrated_profile
from spice_core.timing.timeline import ModeledTimeline
from spice_core.types import ExpertKey

LAYER_MS, COPY_MS, BASE_GAP_MS, LAUNCH_MS = 1.0, 0.15, 0.2, 0.08


def _ev(token, layer, expert, lane, kind, start, dur, detail=""):
    return {"ph": "X", "name": kind, "ts": start * 1e3, "dur": dur * 1e3,
            "args": {"token": token, "layer": layer, "expert": expert, "lane": lane, "kind": kind,
                     "timing": "measured", "detail": detail, "start_ms": start, "dur_ms": dur}}


def _trace(prefetches_per_layer=0, plan_ms=0.0):
    """A synthetic measured decode: known layer span, copy issue cost, launch interval."""
    ev, t = [], 0.0
    for tok in range(1, 5):
        t0 = t
        for layer in range(1, 6):
            span = LAYER_MS + (plan_ms + prefetches_per_layer * COPY_MS if prefetches_per_layer else 0.0)
            ev.append(_ev(tok, layer, -1, "gpu", "layer", t, span))
            t += span
            n_copies = (tok + layer) % 4
            for c in range(n_copies):
                ev.append(_ev(tok, layer, 10 + c, "copy", "copy", t + 0.01 * c, 0.3))
            for p in range(prefetches_per_layer):
                ev.append(_ev(tok, layer + 1, 20 + p, "copy", "prefetch", t, 0.3))
            t += BASE_GAP_MS + COPY_MS * n_copies
            for e in range(6):
                ev.append(_ev(tok, layer, e, "gpu", "expert", t, 0.05))
                t += LAUNCH_MS
        ev.append(_ev(tok, -1, -1, "host", "token", t0 - 0.2, t - t0 + 0.5))
    return ev


def test_fit_recovers_the_host_costs_of_a_known_trace():
    fit = fit_host_costs(_trace())
    assert fit["host_copy_us"] == pytest.approx(COPY_MS * 1e3, rel=1e-6)
    assert fit["host_layer_us"] == pytest.approx((LAYER_MS + BASE_GAP_MS) * 1e3, rel=1e-6)
    assert fit["host_expert_us"] == pytest.approx(LAUNCH_MS * 1e3, rel=1e-6)
    assert fit["host_step_us"] == pytest.approx(500.0 + (LAUNCH_MS - 0.05) * 1e3, abs=1.0)   # after the last kernel


def test_fit_attributes_the_longer_layers_of_a_prefetching_trace_to_planning():
    fit = fit_host_costs(_trace(), _trace(prefetches_per_layer=3, plan_ms=0.9))
    assert fit["host_plan_us"] == pytest.approx(900.0, rel=1e-6)


def test_recalibrated_profile_keeps_the_device_numbers_and_names_its_source():
    base = get_profile("h200-pcie5x16")
    new = recalibrated_profile(base, fit_host_costs(_trace()), note="lru.json")
    assert new.h2d_pinned_gbps == base.h2d_pinned_gbps and new.models_host and not base.models_host
    assert "recalibrated" in new.source and new.name.endswith("+host")


def test_host_lane_makes_a_layer_launch_bound_and_zero_costs_change_nothing():
    shape = get_shape("deepseek-v2-lite")
    base = get_profile("h200-pcie5x16")
    plain = ModeledTimeline(CostModel(base, shape), native_expert_bytes=1)
    hosted = ModeledTimeline(CostModel(replace(base, host_layer_us=3000.0, host_expert_us=1.0), shape),
                             native_expert_bytes=1)
    for tl in (plain, hosted):
        tl.start_token(1)
        tl.layer(1, 1, dense=False)
        tl.gpu_expert(ExpertKey(1, 0), 1, lambda: None)
    gpu_ms = CostModel(base, shape).gpu_layer_ms() + CostModel(base, shape).gpu_expert_ms()
    assert plain.end_token() == pytest.approx(gpu_ms + base.host_step_us / 1e3)
    assert hosted.end_token() >= 3.0 + base.host_step_us / 1e3     # the host's 3 ms launch dominates


def test_recalibrate_cli_refuses_modeled_or_missing_traces(tmp_path, capsys):
    modeled = tmp_path / "modeled.json.gz"
    ev = _trace()
    for e in ev:
        e["args"]["timing"] = "modeled"
    with gzip.open(modeled, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    with pytest.raises(ConfigError, match="measured"):
        read_trace_events(modeled)
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(get_profile("h200-pcie5x16").as_dict()))
    assert main(["recalibrate", "--profile", str(prof), "--trace", str(tmp_path / "nope.json"),
                 "--out", str(tmp_path / "o.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_recalibrate_cli_writes_a_profile_the_bench_can_load(tmp_path):
    from spice_core.timing.profiles import profile_from_dict

    trace = tmp_path / "lru.json"
    trace.write_text(json.dumps({"traceEvents": _trace()}))
    prof = tmp_path / "p.json"
    prof.write_text(json.dumps(get_profile("h200-pcie5x16").as_dict()))
    out = tmp_path / "new.json"
    assert main(["recalibrate", "--profile", str(prof), "--trace", str(trace), "--out", str(out)]) == 0
    new = profile_from_dict(json.loads(out.read_text()))
    assert new.host_copy_us == pytest.approx(150.0)


def test_cpu_lane_tasks_in_the_trace_set_the_profiles_cpu_task_cost():
    base = get_profile("h200-pcie5x16")
    shape = get_shape("deepseek-v2-lite")
    ev = _trace() + [_ev(1, 1, e, "cpu0", "cpu_run", 0.0, 2.5) for e in range(12)]
    fit = fit_host_costs(ev)
    assert fit["cpu_task_ms_median"] == pytest.approx(2.5)
    new = recalibrated_profile(base, fit, shape=shape)
    assert CostModel(new, shape).cpu_expert_ms() == pytest.approx(2.5, abs=1e-3)


def test_several_traces_fit_like_one_longer_trace(tmp_path):
    """Traces of several prompts are combined; their tokens never mix (token numbers repeat across them)."""
    from spice_core.tools.recalibrate import read_traces

    paths = []
    for i in range(2):
        path = tmp_path / f"lru-p{i}.json"
        path.write_text(json.dumps({"traceEvents": _trace()}))
        paths.append(path)
    events = read_traces(paths)
    assert len({e["args"]["token"] for e in events}) == 2 * len({e["args"]["token"] for e in _trace()})
    fit = fit_host_costs(events)
    assert fit["host_copy_us"] == pytest.approx(COPY_MS * 1e3, rel=1e-6)
    assert fit["evidence"]["decode_moe_layers"] == 2 * fit_host_costs(_trace())["evidence"]["decode_moe_layers"]


def _fast_rec(policy, copies_per_layer, host_us, overlap_us, prefetches_per_layer=0.0, cpu=0, link="native",
              variant="", tokens=10, layers=4, expert_bytes=1000):
    return {"policy": policy, "variant": variant, "link": link, "timing": "measured", "n_decode_tokens": tokens,
            "host_us_per_layer": host_us, "host_overlap_us_per_layer": overlap_us,
            "miss_split": {"copy": round(copies_per_layer * tokens * layers), "cpu": cpu, "approx": 0},
            "bytes_per_token": (copies_per_layer + prefetches_per_layer) * layers * expert_bytes}


def test_fast_path_records_give_the_host_steps_line_and_the_plan_cost():
    """GPU-idle host time = 100 + 30 x demand copies per layer; a prefetcher's overlapped time is the
    recording (12) + its plan (200) + 30 per prefetch copy issued."""
    from spice_core.tools.recalibrate import fit_fast_path_costs

    recs = [_fast_rec("on_demand", 6.0, 100 + 30 * 6.0, 12.0), _fast_rec("lru", 4.0, 100 + 30 * 4.0, 12.0),
            _fast_rec("spice", 0.5, 100 + 30 * 0.5, 12.0 + 200 + 30 * 2.0, prefetches_per_layer=2.0),
            _fast_rec("spice", 1.0, 500.0, 900.0, cpu=40, variant="lane")]      # the CPU lane's rows are left out
    fit = fit_fast_path_costs(recs, moe_layers=4)
    assert fit["host_layer_us"] == pytest.approx(100.0) and fit["host_copy_us"] == pytest.approx(30.0)
    assert fit["host_plan_us"] == pytest.approx(200.0)
    assert set(fit["evidence"]["plans_us"]) == {"spice"}


@pytest.mark.parametrize("recs,needle", [
    ([], "no measured fast-path run"),
    ([_fast_rec("on_demand", 6.0, 280, 12), _fast_rec("lru", 4.0, 220, 12, link="pcie4x8")], "mix links"),
    ([_fast_rec("on_demand", 6.0, 280, 12)], "on_demand and lru"),
])
def test_fast_path_fit_refuses_records_it_cannot_fit(recs, needle):
    from spice_core.tools.recalibrate import fit_fast_path_costs

    with pytest.raises(ConfigError, match=needle):
        fit_fast_path_costs(recs, moe_layers=4)


def test_recalibrate_cli_fits_the_fast_path_from_bench_records(tmp_path, capsys):
    recs = [_fast_rec("on_demand", 6.0, 280, 12), _fast_rec("lru", 4.0, 220, 12),
            _fast_rec("on_demand", 6.0, 400, 12, link="pcie4x8"), _fast_rec("lru", 4.0, 300, 12, link="pcie4x8")]
    (tmp_path / "results.json").write_text(json.dumps(recs))
    prof = tmp_path / "hw.json"
    prof.write_text(json.dumps(get_profile("h200-pcie5x16-graphed").as_dict()))
    out = tmp_path / "refit.json"
    assert main(["recalibrate", "--profile", str(prof), "--records", str(tmp_path / "results.json"), "--link",
                 "native", "--moe-layers", "4", "--out", str(out)]) == 0
    fitted = json.loads(out.read_text())
    assert fitted["host_layer_us"] == pytest.approx(100.0) and fitted["host_copy_us"] == pytest.approx(30.0)
    assert fitted["host_plan_us"] == get_profile("h200-pcie5x16-graphed").host_plan_us      # no prefetcher: kept
    assert main(["recalibrate", "--profile", str(prof), "--records", str(tmp_path / "results.json"), "--link",
                 "pcie9", "--out", str(out)]) != 0
    assert "no record of that link" in capsys.readouterr().err


def test_a_fast_path_trace_is_refused_naming_the_two_ways_that_fit():
    """A fast-path trace has one segment per layer and no expert launches: the refusal said only "pass a measured
    trace of a full run", which a fast-path trace of a full run is."""
    layers = [{"args": {"token": t, "layer": l, "lane": "gpu", "kind": "layer", "start_ms": float(t * 10 + l),
                        "dur_ms": 0.5}} for t in range(1, 4) for l in range(4)]
    with pytest.raises(ConfigError, match="--executor eager.*--records"):
        fit_host_costs(layers)
