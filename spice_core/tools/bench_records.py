"""Benchmark records: the raw sums a record keeps, the metrics derived from them, and merging.

A record keeps, next to its derived metrics (TPOT median/p90, hit rate, bytes and stall per
token, miss split, greedy agreement, ...), the ``raw`` data they come from: every decode step's
time and the counters summed over its runs. Records of the same configuration made by
separate processes (``bench --shard K/N``, say one per GPU) can then be merged exactly
(``bench --merge DIR [DIR ...]``): medians and percentiles are recomputed from all steps, not
averaged from the shards'.

Pure: dicts in, dicts out (or a ConfigError for records that are not parts of one run).
"""
from __future__ import annotations

import hashlib
import json
import math
import random
import statistics

from spice_core.errors import ConfigError
from spice_core.trace.metrics import first_divergence, p90

# What identifies one configuration: records that share it are runs of the same thing.
KEY_FIELDS = ("model", "timing", "link", "budget_frac", "policy", "workload", "variant")


def raw_from_runs(runs) -> dict:
    """``runs``: (steps, greedy agreement or None, totals dict, RunSummary) per generation."""
    decode = [st for steps, *_ in runs for st in steps if st.index > 0]
    split = {"approx": 0, "cpu": 0, "copy": 0}
    for *_, summ in runs:
        for k in split:
            split[k] += int(summ.miss_split.get(k, 0))
    return {
        "step_ms": [st.step_ms for st in decode],
        "ttft_ms": [s.ttft_ms for *_, s in runs],
        "selections": sum(st.hits + st.misses for st in decode),
        "hits": sum(st.hits for st in decode),
        "bytes": sum(st.bytes_copied for st in decode),
        "stall_ms": sum(st.stall_ms for st in decode),
        "miss_split": split,
        "wasted_prefetch_bytes": sum(t.get("wasted_prefetch_bytes", 0) for _, _, t, _ in runs),
        "agreements": [a for _, a, _, _ in runs if a is not None],
        "identical_prefixes": [t["identical_prefix_tokens"] for _, _, t, _ in runs if "identical_prefix_tokens" in t],
        "gpu_peak_bytes": max((t.get("gpu_peak_bytes", 0) for _, _, t, _ in runs), default=0),
        "n_runs": len(runs),
        # the fast path's host step (run.host_step_totals): sums over MoE layers, so shards merge exactly
        "host_layers": sum(t.get("host_layers", 0) for _, _, t, _ in runs),
        "host_critical_us_sum": sum(t.get("host_critical_us", 0.0) * t.get("host_layers", 0) for _, _, t, _ in runs),
        "host_overlap_us_sum": sum(t.get("host_overlap_us", 0.0) * t.get("host_layers", 0) for _, _, t, _ in runs),
        "device_ms": [st.device_ms for st in decode],
        "prefetch_skipped_approx": sum(t.get("prefetch_skipped_approx", 0) for _, _, t, _ in runs),
        # the CPU lane's one-token jobs as measured (CpuJobs.lane_totals): sums, so shards merge exactly
        **{f: sum(t.get(f, 0) for _, _, t, _ in runs) for f in LANE_SUMS},
        **{f: sum(t.get(f, 0) for _, _, t, _ in runs) for f in SPLIT_SUMS},
        "lane_bytes_sum": sum(t.get("lane_experts", 0) * t.get("lane_expert_bytes", 0) for _, _, t, _ in runs),
        # bench's quality passes (bench_quality.py), where they ran
        **{f: sum(t.get(f, 0) for _, _, t, _ in runs) for f in QUALITY_SUMS if any(f in t for _, _, t, _ in runs)},
    }


def divergence_totals(reference, tokens) -> dict:
    """A run's tokens against the reference's (None: no reference): how many leading tokens it reproduced (the
    first divergence's position; the whole length when they never differ). Greedy agreement counts matching
    positions, so one early divergence costs every position after it; this says where that happened."""
    if reference is None:
        return {}
    first = first_divergence(reference, tokens)
    return {"identical_prefix_tokens": max(len(reference), len(tokens)) if first is None else first}


# Where the decode tokens' time went (trace.occupancy), as sums over them so shards merge exactly: the clock's token
# windows, each exclusive state's ms, and the link's and the CPU lane's busy ms (the link's also where it hid under
# GPU work). Records from before these sums carry none.
SPLIT_FIELDS = {"gpu": "split_gpu_ms_sum", "link": "split_link_ms_sum", "link + lane": "split_link_lane_ms_sum",
                "lane": "split_lane_ms_sum", "host": "split_host_ms_sum"}
SPLIT_SUMS = ("split_tokens", "split_wall_ms_sum", *SPLIT_FIELDS.values(), "split_link_busy_ms_sum",
              "split_link_hidden_ms_sum", "split_lane_busy_ms_sum")


def split_totals(events) -> dict:
    """A run's trace events -> its time split (trace.occupancy.time_split) as SPLIT_SUMS."""
    from spice_core.trace.occupancy import time_split

    s = time_split(events)
    n = s.tokens
    return {"split_tokens": n, "split_wall_ms_sum": s.wall_ms * n,
            **{field: s.ms[state] * n for state, field in SPLIT_FIELDS.items()},
            "split_link_busy_ms_sum": s.link_busy_ms * n, "split_link_hidden_ms_sum": s.link_hidden_ms * n,
            "split_lane_busy_ms_sum": s.lane_busy_ms * n}


def split_metrics(raw: dict) -> dict:
    """Per decode token: ms in each exclusive state (trace.occupancy.STATES; they add up to the clock's token window,
    which a measured TPOT exceeds by the bookkeeping after it) and the link's and lane's busy ms; None where no split
    was recorded."""
    n = raw.get("split_tokens", 0)
    if not n:
        return {"time_split_ms_per_token": None, "busy_ms_per_token": None}
    return {"time_split_ms_per_token": {state: raw[field] / n for state, field in SPLIT_FIELDS.items()},
            "busy_ms_per_token": {"token window": raw["split_wall_ms_sum"] / n,
                                  "link": raw["split_link_busy_ms_sum"] / n,
                                  "link hidden under GPU work": raw["split_link_hidden_ms_sum"] / n,
                                  "CPU lane": raw["split_lane_busy_ms_sum"] / n}}


LANE_SUMS = ("lane_experts", "lane_compute_us_sum", "lane_wait_us_sum", "lane_int8_experts",
             "lane_int8_compute_us_sum", "lane_int8_wait_us_sum", "lane_bursts", "lane_busy_us_sum",
             "lane_side_bursts", "lane_side_experts", "lane_side_busy_us_sum")


def lane_metrics(raw: dict) -> dict:
    """The CPU lane's measured cost per one-token job (BENCHMARK.md: its ms and GB/s per expert): compute on the
    worker, the host's wait for it, the bf16 weights read per second of compute; int8 jobs apart. None where no
    real lane job ran (older records have no lane sums). And what the lane delivers: its busy wall over the layers'
    bursts of jobs per expert and the weights it read per second of it (exact jobs only; None where a run had int8
    jobs, or its records predate the bursts). With experts side by side (the auto lane) a job's own time grows while
    the busy wall per expert falls: the busy wall is the lane's rate. Where the run had layers of both kinds, the
    lane's side-by-side speedup as measured (`side_speedup`): the profiles' ``cpu_side_speedup``."""
    n, n8 = raw.get("lane_experts", 0), raw.get("lane_int8_experts", 0)
    compute_us, busy_us = raw.get("lane_compute_us_sum", 0.0), raw.get("lane_busy_us_sum", 0.0)
    busy = busy_us > 0 and raw.get("lane_bursts", 0) > 0 and n and not n8
    return {
        "cpu_lane_ms_per_expert": compute_us / n / 1e3 if n else None,
        "cpu_lane_wait_ms_per_expert": raw.get("lane_wait_us_sum", 0.0) / n / 1e3 if n else None,
        "cpu_lane_gbps": raw.get("lane_bytes_sum", 0) / (compute_us * 1e3) if n and compute_us > 0 else None,
        "cpu_lane_int8_ms_per_expert": raw.get("lane_int8_compute_us_sum", 0.0) / n8 / 1e3 if n8 else None,
        "cpu_lane_busy_ms_per_expert": busy_us / n / 1e3 if busy else None,
        "cpu_lane_busy_gbps": raw.get("lane_bytes_sum", 0) / (busy_us * 1e3) if busy else None,
        "cpu_lane_side_speedup": side_speedup(raw) if busy else None,
    }


def serial_busy_us_per_expert(raw: dict) -> float | None:
    """The lane's busy wall per expert over the layers it ran one after another (None: no such layer recorded)."""
    n = raw.get("lane_experts", 0) - raw.get("lane_side_experts", 0)
    busy_us = raw.get("lane_busy_us_sum", 0.0) - raw.get("lane_side_busy_us_sum", 0.0)
    return busy_us / n if n > 0 and busy_us > 0 and raw.get("lane_bursts", 0) > raw.get("lane_side_bursts", 0) \
        else None


def side_speedup(raw: dict) -> float | None:
    """Busy wall per expert one after another over side by side, from one run's sums (None: the run lacks either
    kind of layer, or predates the side-by-side sums)."""
    side_n, side_us = raw.get("lane_side_experts", 0), raw.get("lane_side_busy_us_sum", 0.0)
    serial = serial_busy_us_per_expert(raw)
    return serial / (side_us / side_n) if serial and side_n > 0 and side_us > 0 else None


# The per-generation sums of bench's quality passes (bench_quality.quality_totals), merged by addition.
QUALITY_SUMS = ("tf_positions", "tf_top1", "tf_top1_ties", "tf_kl_sum", "tf_nll_sum", "tf_nll_ref_sum",
                "ref_positions", "ref_tie_positions", "diverged_runs", "diverged_at_tie",
                "text_positions", "text_nll_sum", "text_nll_ref_sum", "text_kl_sum", "text_top1")


def quality_metrics(raw: dict) -> dict:
    """A record's quality numbers from its raw sums (None where no quality pass ran: older records, or none asked)."""
    n, ref_n, t_n = raw.get("tf_positions", 0), raw.get("ref_positions", 0), raw.get("text_positions", 0)
    has_div = "diverged_runs" in raw
    return {
        "tf_top1_agreement": raw["tf_top1"] / n if n else None,
        "tf_top1_agreement_ties": raw["tf_top1_ties"] / n if n else None,
        "tf_kl_mean": raw["tf_kl_sum"] / n if n else None,
        "tf_ppl_delta_pct": 100.0 * math.expm1((raw["tf_nll_sum"] - raw["tf_nll_ref_sum"]) / n) if n else None,
        "divergences": raw["diverged_runs"] if has_div else None,
        "divergences_at_tie": raw.get("diverged_at_tie", 0) if has_div else None,
        "ref_tie_share": raw.get("ref_tie_positions", 0) / ref_n if ref_n else None,
        # held-out text (bench_quality.text_totals): perplexity against the exact policy's on the same windows
        "text_tokens": t_n if t_n else None,
        "text_ppl": math.exp(raw["text_nll_sum"] / t_n) if t_n else None,
        "text_ppl_delta_pct": 100.0 * math.expm1((raw["text_nll_sum"] - raw["text_nll_ref_sum"]) / t_n)
        if t_n else None,
        "text_kl_mean": raw["text_kl_sum"] / t_n if t_n else None,
        "text_top1_agreement": raw["text_top1"] / t_n if t_n else None,
    }


BOOTSTRAP_RESAMPLES = 1000


def median_ci95(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> list[float] | None:
    """Bootstrap 95% interval of the median of ``values`` (percentile method, fixed seed: the same
    steps always give the same interval)."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    n = len(values)
    meds = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(resamples))
    return [meds[int(0.025 * (resamples - 1))], meds[int(0.975 * (resamples - 1))]]


def derive(raw: dict) -> dict:
    """The reported metrics of a record, from its raw data."""
    tpots = sorted(raw["step_ms"])
    n = len(tpots)
    median = statistics.median(tpots) if tpots else None
    return {
        "tpot_ms_median": median,
        "tpot_ms_median_ci95": median_ci95(tpots),
        "tokens_per_s": 1e3 / median if median else None,
        "tpot_ms_p90": p90(tpots) if tpots else None,      # generate's and the app's p90 (trace/metrics.py)
        "ttft_ms_median": statistics.median(raw["ttft_ms"]) if raw["ttft_ms"] else None,
        "hit_rate": raw["hits"] / raw["selections"] if raw["selections"] else None,
        "bytes_per_token": raw["bytes"] / max(1, n),
        "stall_ms_per_token": raw["stall_ms"] / max(1, n),
        "miss_split": dict(raw["miss_split"]),
        "wasted_prefetch_bytes": raw["wasted_prefetch_bytes"],
        "greedy_agreement": statistics.mean(raw["agreements"]) if raw["agreements"] else None,
        "identical_prefix_tokens_median": statistics.median(raw["identical_prefixes"])
        if raw.get("identical_prefixes") else None,
        "gpu_peak_mb": raw["gpu_peak_bytes"] / 1e6 or None,
        "n_runs": raw["n_runs"], "n_decode_tokens": n,
        "host_us_per_layer": _per_layer(raw, "host_critical_us_sum"),
        "host_overlap_us_per_layer": _per_layer(raw, "host_overlap_us_sum"),
        "device_ms_median": statistics.median(raw["device_ms"]) if raw.get("device_ms") else None,
        # predicted experts the admission did not copy (their misses are approximated); None in older records
        "prefetch_skipped_approx_per_token": raw["prefetch_skipped_approx"] / max(1, n)
        if "prefetch_skipped_approx" in raw else None,
        **lane_metrics(raw),
        **split_metrics(raw),
        **quality_metrics(raw),
    }


def _per_layer(raw: dict, field: str) -> float | None:
    layers = raw.get("host_layers", 0)
    return raw.get(field, 0.0) / layers if layers else None


def _combine(a: dict, b: dict) -> dict:
    return {
        "step_ms": a["step_ms"] + b["step_ms"], "ttft_ms": a["ttft_ms"] + b["ttft_ms"],
        "selections": a["selections"] + b["selections"], "hits": a["hits"] + b["hits"],
        "bytes": a["bytes"] + b["bytes"], "stall_ms": a["stall_ms"] + b["stall_ms"],
        "miss_split": {k: a["miss_split"].get(k, 0) + b["miss_split"].get(k, 0)
                       for k in sorted({*a["miss_split"], *b["miss_split"]})},
        "wasted_prefetch_bytes": a["wasted_prefetch_bytes"] + b["wasted_prefetch_bytes"],
        "agreements": a["agreements"] + b["agreements"],
        "identical_prefixes": a.get("identical_prefixes", []) + b.get("identical_prefixes", []),
        "gpu_peak_bytes": max(a["gpu_peak_bytes"], b["gpu_peak_bytes"]),
        "n_runs": a["n_runs"] + b["n_runs"],
        **{f: a.get(f, 0) + b.get(f, 0) for f in ("host_layers", "host_critical_us_sum", "host_overlap_us_sum")},
        "device_ms": a.get("device_ms", []) + b.get("device_ms", []),
        **({"prefetch_skipped_approx": a["prefetch_skipped_approx"] + b["prefetch_skipped_approx"]}
           if "prefetch_skipped_approx" in a and "prefetch_skipped_approx" in b else {}),
        # sums neither part recorded (records from before them) stay absent rather than made up as zeros
        **{f: a.get(f, 0) + b.get(f, 0) for f in (*LANE_SUMS, "lane_bytes_sum", *SPLIT_SUMS) if f in a or f in b},
        **{f: a.get(f, 0) + b.get(f, 0) for f in QUALITY_SUMS if f in a or f in b},
        # the [prompt, repetition] runs each part holds (absent in records from before it: not made up)
        **({"units": a["units"] + b["units"]} if "units" in a and "units" in b else {}),
    }


# What one bench config fixes for all its records: shards that differ in any of these are not parts of
# one run, and blending them would invent medians nobody measured. (The transformers reference record
# has no profile or shape: a missing value is not a difference.)
RUN_FIELDS = ("model", "timing", "profile", "shape", "provenance")
# What the records of one configuration must agree on besides their key (the floor's inputs, the lift
# check, whether the policy is exact).
RECORD_FIELDS = ("routed_bytes_per_token", "link_gbps", "lift_check", "ppl_delta_pct", "settings", "max_new_tokens")


def provenance(cfg: dict, prompt_ids: list[list[int]], code_digest: str) -> dict:
    """What makes shards parts of one run, as digests a record can carry (``"provenance"``): the config
    without its run blocks (a block may name the prompts a resumed run still lacks), every prompt's ids
    (before sharding), and the engine's code. `merge_records` refuses records whose provenance differs."""
    def digest(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]

    fixed = {k: v for k, v in cfg.items() if k not in ("runs", "comment")}
    return {"config": digest(fixed), "prompts": digest(prompt_ids), "code": code_digest}


def _show(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_mixed_runs(records: list[dict], sources: list[str]) -> None:
    for field in RUN_FIELDS:
        # Peers (benchmarks/peers.py, records with a "peer") are a run of their own beside bench's, on the same
        # model: their provenance is compared among peers only, every other run field across all records.
        for side in ((False, True) if field == "provenance" else (None,)):
            seen: dict[str, str] = {}
            for r, src in zip(records, sources):
                if r.get(field) is not None and (side is None or bool(r.get("peer")) == side):
                    seen.setdefault(_show(r[field]), src)
            if len(seen) > 1:
                (a, src_a), (b, src_b) = list(seen.items())[:2]
                raise ConfigError(f"--merge: the shards are not parts of one run: {field} is {a} in {src_a} but {b} "
                                  f"in {src_b}: merge only shards of one config, model, prompt set and code")


def merge_records(records: list[dict], sources: list[str] | None = None) -> list[dict]:
    """One record per configuration, its raw data combined and its metrics derived again.
    Records without raw data (e.g. the transformers reference) are kept once, as they are.

    Refuses (ConfigError) what would not be an exact recombination: records of different runs
    (`RUN_FIELDS`), records of one configuration that disagree on `RECORD_FIELDS`, and the same
    runs twice (equal step and first-token times: a shard given twice). ``sources`` names where
    each record came from, for those messages."""
    sources = list(sources) if sources is not None else [f"record {i}" for i in range(len(records))]
    _refuse_mixed_runs(records, sources)
    _refuse_repeated_shards(records, sources)
    merged: dict[tuple, dict] = {}
    parts: dict[tuple, list[tuple[dict, str]]] = {}
    for r, src in zip(records, sources):
        key = tuple(r.get(k) for k in KEY_FIELDS)
        for earlier, earlier_src in parts.get(key, []):
            for field in RECORD_FIELDS:
                if earlier.get(field) != r.get(field):
                    raise ConfigError(f"--merge: {src} and {earlier_src} differ in {field} ({_show(earlier.get(field))}"
                                      f" vs {_show(r.get(field))}) for {r.get('policy')} at budget "
                                      f"{r.get('budget_frac')}: merge only shards of one config")
            _refuse_overlap(earlier, earlier_src, r, src)
        parts.setdefault(key, []).append((r, src))
        if key not in merged:
            merged[key] = dict(r)
        elif ("raw" in r) != ("raw" in merged[key]):     # one part's steps would be dropped from the merged record
            with_raw, without = (src, parts[key][0][1]) if "raw" in r else (parts[key][0][1], src)
            raise ConfigError(f"--merge: {with_raw} holds the per-step data (raw) of {r.get('policy')} at budget "
                              f"{r.get('budget_frac')} and {without} does not: merge records written by bench, not "
                              "summaries of them")
        elif "raw" in r:
            merged[key]["raw"] = _combine(merged[key]["raw"], r["raw"])
    for key, m in merged.items():
        if len(parts[key]) > 1:            # a combined record holds every part's shards, not the first part's
            shards = sorted({tuple(x) for r, _ in parts[key] for x in _shards_of(r)})
            m.pop("shard", None)
            if shards:
                m["shards"] = [list(x) for x in shards]
            notes = sorted({str(n) for r, _ in parts[key] for n in r.get("notes") or ()})     # every part's
            if notes:
                m["notes"] = notes
        if "raw" in m:
            m.update(derive(m["raw"]))     # also a lone record: what derive reports may have grown since
    out = list(merged.values())
    inputs = next((r["floor3_inputs"] for r in out if r.get("floor3_inputs")), None)
    # One copy's bytes, as the shards were floored with (a run without an on_demand record cannot read it off one)
    copy_bytes = (inputs or {}).get("copy_bytes") or next((r["copy_bytes"] for r in out if r.get("copy_bytes")), None)
    add_floors(out, copy_bytes)
    if inputs is not None:         # the shards' three-lane floor, again over the merged steps and lane jobs
        add_three_lane_floor(out, inputs["expert_bytes"], inputs["profile_lane_ms"], inputs["dram_gbps"],
                             inputs.get("copy_bytes"))
    return out


def _refuse_overlap(a: dict, src_a: str, b: dict, src_b: str) -> None:
    """Two records of one configuration holding the same prompt's run (the same repetition): blending them would
    count it twice (an unsharded run merged with one of its shards, or overlapping prompt slices)."""
    ua, ub = (r.get("raw", {}).get("units") for r in (a, b))
    if not ua or not ub:
        return                     # records from before runs were listed: only `_refuse_repeated_shards` applies
    both = sorted({tuple(u) for u in ua} & {tuple(u) for u in ub})
    if both:
        shown = ", ".join(f"prompt {p}" + (f" (repetition {r})" if r else "") for p, r in both[:4])
        raise ConfigError(f"--merge: {src_a} and {src_b} both hold {shown}{' and more' if len(both) > 4 else ''} for "
                          f"{b.get('policy')} at budget {b.get('budget_frac')}: merge shards that split the prompts, "
                          "not a run with its own shards or overlapping slices")


def _shards_of(record: dict) -> list:
    """The [K, N] shards a record holds: a merged record's "shards", a shard run's "shard" ([] for older records)."""
    return record.get("shards") or ([record["shard"]] if record.get("shard") else [])


def missing_shards(records: list[dict]) -> list[str]:
    """The K/N shards of the records' one --shard split that none of them is; none where the records are not all
    shards of one split (records from before shards were noted, or prompt slices run with "prompt_indices", whose
    overlaps `merge_records` refuses)."""
    runs = [r for r in records if "raw" in r and not r.get("peer")]
    if not runs or any(not _shards_of(r) for r in runs):
        return []
    seen = {tuple(x) for r in runs for x in _shards_of(r)}
    counts = {x[1] for x in seen}
    if len(counts) != 1 or None in counts or counts == {1}:
        return []
    n = counts.pop()
    return [f"{k}/{n}" for k in range(n) if (k, n) not in seen]


def _refuse_repeated_shards(records: list[dict], sources: list[str]) -> None:
    """Two sources whose records hold the same runs (equal raw data for every configuration both have):
    the same shard twice, which would count every step twice. Different prompts never time, hit and
    copy alike in every configuration, so a real pair of shards always differs somewhere."""
    by_source: dict[str, dict[tuple, dict]] = {}
    for r, src in zip(records, sources):
        if "raw" in r:
            by_source.setdefault(src, {})[tuple(r.get(k) for k in KEY_FIELDS)] = r["raw"]
    names = list(by_source)
    for i, a in enumerate(names):
        for b in names[:i]:
            common = by_source[a].keys() & by_source[b].keys()
            if common and all(by_source[a][k] == by_source[b][k] for k in common):
                raise ConfigError(f"--merge: {a} holds the same runs as {b} (the same shard twice would count "
                                  "every step twice): give each shard once")


def copy_bytes_of(records: list[dict]) -> float | None:
    """One copy's bytes as ``bytes_per_token`` counts them (the model as loaded), read off an `on_demand` record
    (it keeps nothing and prefetches nothing, so each of its misses is one copy); None without one."""
    for r in records:
        ms = r.get("miss_split") or {}
        if r.get("policy") == "on_demand" and ms.get("copy") and r.get("n_decode_tokens") and r.get("bytes_per_token"):
            return r["bytes_per_token"] / (ms["copy"] / r["n_decode_tokens"])
    return None


def carried_experts_per_token(r: dict, copy_bytes: float | None) -> float | None:
    """Experts a decode token had to bring to the GPU's work exactly, by the link or the CPU lane: its exact misses
    (copied, or run on the lane) and the prefetched experts it used (a prefetch hit crossed the link too, only
    earlier). Approximated misses move nothing; prefetches evicted unused are left out, and those still unused when a
    run ends count as used (at most the cache's slots a run). ``copy_bytes``: one copy's bytes in ``bytes_per_token``
    (None: the prefetches are not counted, only the misses). None where the record has no decode tokens."""
    n = r.get("n_decode_tokens")
    if not n:
        return None
    ms = r.get("miss_split") or {}
    copied = ms.get("copy", 0) / n
    if copy_bytes and r.get("bytes_per_token") is not None:
        used = (r["bytes_per_token"] - (r.get("wasted_prefetch_bytes") or 0) / n) / copy_bytes
        copied = max(copied, used)
    return copied + (ms.get("cpu", 0) + ms.get("cpu_int8", 0)) / n


def add_floors(records: list[dict], copy_bytes: float | None = None) -> None:
    """Physical floor over compute and the link: max(compute, carried share x routed bytes per token / link
    bandwidth), where compute is the fastest resident record of the same workload (it copies nothing, so any link or
    budget) and the carried share is the share of a token's selections it had to bring exactly
    (`carried_experts_per_token`: exact misses and used prefetches; an approximated miss moves nothing; a miss run on
    the CPU is charged as a copy here, the two-lane world having no CPU lane, and `three_lane_floor` gives it its
    lane). ``copy_bytes``: one copy's bytes (default: read off the `on_demand` record, `copy_bytes_of`). Needs
    ``routed_bytes_per_token`` and ``link_gbps`` on the records; a record without its step counts (older ones) is
    charged its misses only, from its hit rate."""
    resident = [r for r in records if r["policy"] == "resident" and r.get("tpot_ms_median") is not None]
    copy_bytes = copy_bytes or copy_bytes_of(records)
    for r in records:
        if r.get("hit_rate") is None or not r.get("link_gbps") or not r.get("routed_bytes_per_token"):
            continue
        selections = (r.get("raw") or {}).get("selections")
        carried = carried_experts_per_token(r, copy_bytes)
        if carried is not None and selections:
            share = carried / (selections / r["n_decode_tokens"])
        else:
            split = r.get("miss_split") or {}
            missed = sum(split.get(k, 0) for k in ("approx", "cpu", "cpu_int8", "copy"))
            share = (1 - r["hit_rate"]) * (1.0 - split.get("approx", 0) / missed if missed else 1.0)
        transfer = share * r["routed_bytes_per_token"] / (r["link_gbps"] * 1e6)
        same = [x["tpot_ms_median"] for x in resident if x.get("workload", "prompts") == r.get("workload", "prompts")]
        r["floor_ms"] = max(min(same) if same else 0.0, transfer)


def three_lane_floor(records: list[dict], lane_ms, dram_gbps: float | None = None,
                     lane_bytes: float | None = None, expert_bytes: float | None = None,
                     copy_bytes: float | None = None) -> None:
    """`three_lane_floor_one` for each model's records apart (each has its own compute and expert size).
    ``lane_ms``: the lane's ms per expert, or a function of an expert's bytes giving it (a fixed cost per job plus
    the bytes at a rate: a time measured on one expert size does not scale in proportion to another's).
    ``lane_bytes`` (with a number): the bytes of the expert ``lane_ms`` was measured on; a model whose experts are
    larger gets the lane's time scaled by bytes; None: ``lane_ms`` is taken for every model's expert as it is.
    ``expert_bytes``: one expert's bytes, where the caller knows them (else read off the model's `on_demand`
    record); ``copy_bytes``: one copy's bytes in ``bytes_per_token`` (the model as loaded; else read off that
    record)."""
    groups: dict = {}
    for r in records:
        groups.setdefault(r.get("model"), []).append(r)
    for rs in groups.values():
        three_lane_floor_one(rs, lane_ms, dram_gbps, lane_bytes, expert_bytes, copy_bytes)


def three_lane_floor_one(records: list[dict], lane_ms, dram_gbps: float | None = None,
                         lane_bytes: float | None = None, expert_bytes: float | None = None,
                         copy_bytes: float | None = None) -> None:
    """``floor3_ms`` and ``tpot_over_floor3`` on every record with the inputs: the fastest a token could go
    when the N experts it had to bring exactly (`carried_experts_per_token`: exact misses, copied or computed on
    the CPU, and used prefetches) are split between the link (a ms per expert) and the CPU lane (c ms per expert)
    so that both finish together, both reading host DRAM:

        floor3 = max(compute, N a c / (a + c), N B / DRAM)

    compute being the fastest `resident` step of the workload and B an expert's bytes (``expert_bytes``, else
    on_demand's bytes per copy). Approximated misses move nothing. Every lane is taken as perfectly overlapped: a
    floor, not a plan. ``dram_gbps`` None: no DRAM term (the machine's is not known)."""
    resident = {}
    for r in records:
        if r["policy"] == "resident" and r.get("tpot_ms_median"):
            wl = r.get("workload", "prompts")
            resident[wl] = min(resident.get(wl, float("inf")), r["tpot_ms_median"])
    copy_bytes = copy_bytes or copy_bytes_of(records)
    expert_bytes = expert_bytes or copy_bytes
    if expert_bytes is None or lane_ms is None:
        return
    if callable(lane_ms):
        lane_ms = lane_ms(expert_bytes)
    elif lane_bytes:
        lane_ms = lane_ms * expert_bytes / lane_bytes
    for r in records:
        n_tok = r.get("n_decode_tokens")
        compute = resident.get(r.get("workload", "prompts"))
        if not n_tok or not r.get("link_gbps") or compute is None or r.get("peer") or r.get("tpot_ms_median") is None:
            continue
        n = carried_experts_per_token(r, copy_bytes)
        a = expert_bytes / (r["link_gbps"] * 1e6)
        lanes = n * a * lane_ms / (a + lane_ms) if n else 0.0
        dram = n * expert_bytes / (dram_gbps * 1e6) if dram_gbps else 0.0
        r["floor3_ms"] = max(compute, lanes, dram)
        r["tpot_over_floor3"] = r["tpot_ms_median"] / r["floor3_ms"]


def add_three_lane_floor(records: list[dict], expert_bytes: float, profile_lane_ms: float | None,
                         dram_gbps: float | None, copy_bytes: float | None = None) -> None:
    """`three_lane_floor` for one bench run's records, with the CPU lane's time per expert as this run measured it
    (the median over its records of the lane's busy wall per expert where any record has it, which is what a lane
    running experts side by side delivers, else of `cpu_lane_ms_per_expert`: compute on the worker, a floor's view;
    never a median of the two kinds, ``lane_basis`` says which) where any record ran the lane, else
    ``profile_lane_ms`` (the profile's lane rate). Each floored record keeps the inputs (``floor3_inputs``: the
    lane's ms and where it came from, DRAM, the expert's and one copy's bytes), so `merge_records` floors the merged
    records again from them."""
    for r in records:
        for field in FLOOR3_FIELDS:
            r.pop(field, None)
    busy = [r["cpu_lane_busy_ms_per_expert"] for r in records if r.get("cpu_lane_busy_ms_per_expert")]
    measured = busy or [r["cpu_lane_ms_per_expert"] for r in records if r.get("cpu_lane_ms_per_expert")]
    lane_ms, source = (statistics.median(measured), "measured") if measured else (profile_lane_ms, "profile")
    three_lane_floor(records, lane_ms, dram_gbps, expert_bytes=expert_bytes, copy_bytes=copy_bytes)
    inputs = {"lane_ms": lane_ms, "lane_source": source,
              "lane_basis": ("busy wall per expert" if busy else "compute per job") if measured else None,
              "profile_lane_ms": profile_lane_ms, "dram_gbps": dram_gbps,
              "expert_bytes": expert_bytes, "copy_bytes": copy_bytes}
    for r in records:
        if "floor3_ms" in r:
            r["floor3_inputs"] = dict(inputs)


FLOOR3_FIELDS = ("floor3_ms", "tpot_over_floor3", "floor3_inputs")


def markdown_table(records: list[dict], cfg: dict) -> str:
    """bench's results.md: one row per record (quality columns stay empty where no quality pass ran)."""
    from spice_core.api import POLICIES

    cols = ["workload", "variant", "link", "budget_frac", "policy", "tpot_ms_median", "tpot_ms_p90", "hit_rate",
            "bytes_per_token", "stall_ms_per_token", "device_ms_median", "host_us_per_layer",
            "host_overlap_us_per_layer", "greedy_agreement", "identical_prefix_tokens_median", "divergences",
            "divergences_at_tie", "tf_top1_agreement", "tf_top1_agreement_ties", "tf_kl_mean", "tf_ppl_delta_pct",
            "text_ppl", "text_ppl_delta_pct", "text_kl_mean", "floor_ms", "floor3_ms", "cpu_lane_ms_per_expert",
            "cpu_lane_gbps", "cpu_lane_busy_ms_per_expert", "cpu_lane_busy_gbps", "cpu_lane_side_speedup"]
    split_head = "time split ms/token (" + " / ".join(SPLIT_FIELDS) + ")"
    head = "| " + " | ".join(cols) + f" | miss split (approx/cpu/copy) | {split_head} |\n|" + "---|" * (len(cols) + 2) \
        + "\n"
    rows = []
    for r in sorted(records, key=lambda r: (r.get("workload", "prompts") != "prompts", r["link"], r["budget_frac"],
                                            POLICIES.index(r["policy"])
                                            if r["policy"] in POLICIES else -1)):
        cells = []
        for c in cols:
            v = r.get(c)
            cells.append("" if v is None else (f"{v:.3f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int)
                                               else str(v)))
        ms = r.get("miss_split") or {}
        split = r.get("time_split_ms_per_token")
        split_cell = " / ".join(f"{split[k]:.2f}" for k in SPLIT_FIELDS) if split else ""
        rows.append("| " + " | ".join(cells) + f" | {ms.get('approx', '')}/{ms.get('cpu', '')}/{ms.get('copy', '')} | "
                    f"{split_cell} |")
    return (f"timing: **{cfg['timing']}**; model: {records[0]['model'] if records else ''}\n\n" + head
            + "\n".join(rows) + "\n" + notes_section(records))


def notes_section(records: list[dict]) -> str:
    """What the runs' notes say (a fallback, a lane not offered, an uncalibrated model's predictor), each note once
    with the rows that carry it: a row reads as its policy's full method unless its notes say otherwise."""
    rows_of: dict[str, list[str]] = {}
    for r in records:
        row = f"{r.get('workload', 'prompts')} {r.get('link', '')} {r.get('budget_frac', 0):.0%} {r['policy']}"
        for note in r.get("notes") or ():
            rows_of.setdefault(str(note), []).append(row)
    if not rows_of:
        return ""
    n = len(records)
    lines = [f"- {note} ({'every row' if len(rows) == n else '; '.join(rows)})" for note, rows in rows_of.items()]
    return "\nNotes of the runs:\n\n" + "\n".join(lines) + "\n"
