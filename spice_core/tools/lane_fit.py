"""The CPU lane's cost per expert, fitted from measured `bench` records of two or more expert sizes.

A lane job's measured time per expert (the worker's compute, `lane_compute_us_sum` / `lane_experts` in a record's raw
sums; where the record has them, the lane's busy wall over its layers' bursts of jobs, `lane_busy_us_sum`, per
expert instead: a lane that runs a layer's experts side by side takes longer per job and less per expert) is a
fixed part (thread wake-up, the matmuls' set-up) plus the expert's bytes read at the lane's rate. One
expert size cannot tell the two apart: fitted on DeepSeek-V2-Lite's 17.3 MB experts alone, the rate came out
at 29.1 GB/s with the whole time charged to bytes, and Qwen2-57B-A14B's 55 MB experts, measured at 45 GB/s,
were modeled 54% too slow (docs/benchmarks/headline/model-check/qwen2-native-25-refit.md). This fits the
line through the sizes instead:

- ``cpu_mem_gbps``: the inverse slope, the lane's marginal read rate;
- ``cpu_job_compute_us``: the intercept, the fixed compute of one job (CostModel charges it once per CPU expert,
  beside the bytes, the task's dispatch in ``cpu_task_us`` and the activations' round trip over the link).

A lane that runs a layer's experts side by side (the auto lane, from three a layer) ends them sooner than one after
another: where a record says which layers ran so (`lane_side_experts`, `lane_side_busy_us_sum`), the points are the
busy wall of the layers run one after another, which is what the two costs above model, and the fit adds
``cpu_side_speedup``: the median over the records of that busy wall per expert over the side-by-side layers' (the
cost model divides by it from three a layer). Records from before those sums, fitted on their whole busy wall, hold
whatever side-by-side gain their lane had in the fitted rate already: the fit then sets ``cpu_side_speedup`` to 1.
A record whose every layer ran side by side is left out: its busy wall is the faster side-by-side lane's, and
nothing in it says what one after another costs.

Only `cpu_compute` records are fitted (every miss on the lane, no copies: the lane has host DRAM to itself);
the other policies' lane jobs, which share DRAM with the copy engine, are reported beside the fit as evidence
of the contention. Pure: records in, numbers out.
"""
from __future__ import annotations

import statistics

from spice_core.errors import ConfigError
from spice_core.tools.bench_records import serial_busy_us_per_expert, side_speedup

FIT_POLICY = "cpu_compute"
LANE_KEYS = ("cpu_mem_gbps", "cpu_job_compute_us", "cpu_side_speedup")     # what `fit_lane_costs` may fit


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares intercept and slope (slope 0 when x does not vary); recalibrate's host fits use it too."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    if var == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var
    return my - slope * mx, slope


def all_side_by_side(raw: dict) -> bool:
    """Whether a record's lane ran every layer's exact jobs side by side (its sums say which ran so)."""
    bursts = raw.get("lane_bursts") or 0
    return bool(bursts) and not raw.get("lane_int8_experts") and raw.get("lane_side_bursts", 0) >= bursts


def lane_points(records: list[dict]) -> list[dict]:
    """One point per measured record with real lane jobs (but those `all_side_by_side`): its policy, link, bytes and
    µs per expert."""
    points = []
    for r in records:
        raw = r.get("raw") or {}
        n = raw.get("lane_experts") or 0
        if r.get("timing") != "measured" or n <= 0 or not raw.get("lane_bytes_sum") or all_side_by_side(raw):
            continue
        exact = raw.get("lane_bursts") and not raw.get("lane_int8_experts")
        busy = raw.get("lane_busy_us_sum") if exact else None
        serial = serial_busy_us_per_expert(raw) if exact and "lane_side_experts" in raw else None
        if serial is not None:      # the layers run one after another: what cpu_mem_gbps and the job's µs model
            us, basis = serial, "busy wall, one after another"
        else:
            us, basis = (busy or raw["lane_compute_us_sum"]) / n, "busy wall" if busy else "job compute"
        points.append({"model": r.get("model"), "policy": r.get("policy"), "link": r.get("link"),
                       "budget_frac": r.get("budget_frac"), "experts": n,
                       "expert_mb": raw["lane_bytes_sum"] / n / 1e6, "us_per_expert": us, "basis": basis,
                       "side_speedup": side_speedup(raw) if exact else None})
    return points


def fit_lane_costs(records: list[dict]) -> dict:
    """``cpu_mem_gbps`` and ``cpu_job_compute_us`` from the `cpu_compute` records, and ``cpu_side_speedup`` where
    they ran layers both ways, with the points they rest on."""
    points = lane_points(records)
    fitted = [p for p in points if p["policy"] == FIT_POLICY]
    by_size: dict[float, list[float]] = {}
    for p in fitted:
        by_size.setdefault(round(p["expert_mb"], 2), []).append(p["us_per_expert"])
    if len(by_size) < 2:
        sizes = ", ".join(f"{mb:g} MB" for mb in sorted(by_size)) or "none"
        side = sum(r.get("policy") == FIT_POLICY and all_side_by_side(r.get("raw") or {}) for r in records)
        why = f"; {side} record(s) left out whose lane ran every layer side by side: run them on a fixed lane " \
              "shape (SPICE_CPU_LANE=1x0)" if side else ""
        raise ConfigError(f"fitting the CPU lane needs measured {FIT_POLICY} records of two expert sizes (found: "
                          f"{sizes}): pass the results.json of both models' runs, e.g. DeepSeek-V2-Lite's and "
                          f"Qwen2-57B-A14B's lifts{why}")
    xs = sorted(by_size)
    ys = [statistics.median(by_size[x]) for x in xs]
    intercept_us, slope_us_per_mb = fit_line(xs, ys)
    if slope_us_per_mb <= 0:
        raise ConfigError(f"the {FIT_POLICY} records' time per expert does not grow with its size ({ys} µs at "
                          f"{xs} MB): the runs are not comparable (another machine, or a lane that did not run)")
    gbps = 1e3 / slope_us_per_mb
    residual = {f"{x:g} MB": round(y - (intercept_us + slope_us_per_mb * x), 1) for x, y in zip(xs, ys)}
    shared = {}
    for p in points:
        if p["policy"] != FIT_POLICY:
            modeled = max(0.0, intercept_us) + slope_us_per_mb * p["expert_mb"]
            key = f"{p['model']} {p['link']} {p['budget_frac']:g} {p['policy']}"
            shared[key] = {"us_per_expert": round(p["us_per_expert"], 1),
                           "over_fit_pct": round(100 * (p["us_per_expert"] / modeled - 1), 1)}
    fit = {"cpu_mem_gbps": gbps, "cpu_job_compute_us": max(0.0, intercept_us)}
    speedups = [p["side_speedup"] for p in fitted if p["side_speedup"]]
    if speedups:                # the lane ran layers both ways: how much sooner side by side ends them, measured
        fit["cpu_side_speedup"] = statistics.median(speedups)
    elif any(p["basis"] == "busy wall" for p in fitted):
        # Records from before the side sums, fitted on their whole busy wall: whatever side-by-side gain their lane
        # had is already in the fitted rate, so the cost model must not divide by a speedup again.
        fit["cpu_side_speedup"] = 1.0
    return {**fit,
            "evidence": {"fitted_policy": FIT_POLICY, "bases": sorted({p["basis"] for p in fitted}),
                         "side_speedups": [round(s, 3) for s in speedups],
                         "median_us_per_expert": {f"{x:g} MB": round(y, 1) for x, y in zip(xs, ys)},
                         "records": len(fitted), "residual_us": residual, "dram_shared_with_copies": shared}}
