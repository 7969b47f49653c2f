"""The headline run's report: merge the shards, attach quality, write results, tables, figures, README.

    python benchmarks/headline_report.py [--dir docs/benchmarks/headline]

Reads every shard under ``DIR/raw/*/results{,.partial}.json`` (a shard cut short by its time limit
keeps each prompt it finished: all policies of that prompt), merges records of the same
configuration exactly (every decode step kept, medians recomputed: `bench_records.merge_records`),
attaches the quality of the lossy settings from ``DIR/quality*.json`` (one file per model)
(`benchmarks/headline_quality.py`) and writes ``results.json`` (bench's record format),
``tpot-<model>-<link>.html`` (plotly, one figure per model and link: TPOT per policy and budget, p90
whiskers, the three-lane floor marked) and ``README.md``. Every number in the README comes from those files.
Two models: the miniature lifted to DeepSeek-V2-Lite's shapes (10/25/50% budgets) and the second miniature
lifted to Qwen2-57B-A14B's (25% at least); every table, target and floor is per model.

Beside BENCHMARK.md's two-lane floor (compute, link) each record gets the three-lane floor
(`three_lane_floor`: compute, the link and the CPU lane sharing host DRAM) and its TPOT as a multiple
of it; peer rows (`benchmarks/peers.py`, a ``peer`` field) are listed apart; the first headline's
25% numbers (``docs/benchmarks/full-scale/headline/results.json``) are kept as history.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

from headline_repeats import repeats_table, shard_records
from headline_runs import (GPU_BEFORE_ENV_FILES, join_output_variants, note_configs, refuse_mixed_gpus, run_digests,
                           shard_gpu)
from headline_text import (CODE_NOTE, COMMANDS, FLOOR_NOTE, HEADER, HISTORY_NOTE, PEERS_MISSING, PEERS_NOTE,
                           QUALITY_NOTE, ROUTING_NOTE, TIME_SPLIT_NOTE)

from spice_core.api import POLICIES
from spice_core.tools.bench_config import LINKS_GBPS
from spice_core.tools.bench_records import FLOOR3_FIELDS, add_floors, merge_records, three_lane_floor

PROTOCOL_PROMPTS = 8           # BENCHMARK.md: 8 held-out prompts x 64 new tokens
PROTOCOL_BUDGETS = (0.10, 0.25, 0.50)
# The protocol's models: what each lifted miniature stands for, its short name in file names, its budgets.
MODELS = {"lift:spice-mini": ("DeepSeek-V2-Lite", "dsv2-lite", PROTOCOL_BUDGETS),
          "lift:spice-mini-qwen2": ("Qwen2-57B-A14B", "qwen2-57b", (0.25,))}
PROTOCOL_LINKS = ("native", "pcie4x8")
LOSSY = ("spice", "spice_no_cpu")
NATIVE_GBPS_FALLBACK = 53.8    # the H200's measured pinned host-to-device rate (full-scale README)


def load_shards(raw_dir: Path) -> list[dict]:
    records = []
    for shard in sorted(p for p in raw_dir.iterdir() if p.is_dir()):
        gpu = shard_gpu(shard)
        for r in shard_records(shard):
            r["shard"], r["gpu"] = shard.name, gpu
            records.append(r)
    return records


def fill_floor_inputs(records: list[dict], native_gbps: float) -> None:
    """Shard files written before bench put the floor's inputs into partial results lack them (these
    fill in only what is missing): routed bytes per token is what on_demand copies
    (it keeps nothing, so every routed selection is a copy); the link's rate is the emulated one, or
    the machine's measured pinned rate for the native link."""
    routed = {r["model"]: r["bytes_per_token"] for r in records if r["policy"] == "on_demand" and r.get("bytes_per_token")}
    for r in records:
        r.setdefault("routed_bytes_per_token", routed.get(r["model"]))
        r.setdefault("link_gbps", LINKS_GBPS.get(r["link"]) or native_gbps)


def model_name(model: str | None) -> str:
    """What a lifted miniature stands for ("DeepSeek-V2-Lite"), or the model's own name."""
    return MODELS[model][0] if model in MODELS else str(model)


def models_of(records: list[dict]) -> list[str]:
    """The records' models, the protocol's first (in MODELS order), then any other."""
    present = {r.get("model") for r in records}
    return [m for m in MODELS if m in present] + sorted(m for m in present - set(MODELS) if m)


QUALITY_MODEL = "lift:spice-mini"     # quality.json rows without a "model" are the first headline's model's


def attach_quality(records: list[dict], quality: dict | None) -> None:
    """ppl_delta_pct / mean_kl: 0 where no miss was approximated (every output exact), else the quality
    run of the same model, link and budget for the lossy policies, else None (not measured)."""
    rows = {(q.get("model", QUALITY_MODEL), q["link"], round(q["budget_frac"], 3)): q
            for q in (quality or {}).get("rows", [])}
    for r in records:
        if (r.get("miss_split") or {}).get("approx", 0) == 0:
            r["ppl_delta_pct"], r["mean_kl"] = 0.0, 0.0
            continue
        q = rows.get((r.get("model"), r["link"], round(r["budget_frac"], 3)))
        if q is not None and r["policy"] not in q.get("policies", LOSSY):
            q = None
        r["ppl_delta_pct"] = q["ppl_delta_pct"] if q else None
        r["mean_kl"] = q["mean_kl"] if q else None
        if q:
            r["quality_greedy_agreement"] = q["greedy_agreement"]


def gpu_ppl(r: dict) -> tuple[float | None, str]:
    """(perplexity change %, where it was measured) of a lossy row: the GPU quality pass on held-out text where the
    cell ran one, else on resident's continuation (GPU), else the CPU quality run of its setting."""
    for key, where in (("text_ppl_delta_pct", "GPU, held-out text"),
                       ("tf_ppl_delta_pct", "GPU, resident's continuation"), ("ppl_delta_pct", "CPU quality run")):
        if r.get(key) is not None:
            return r[key], where
    return None, ""


def _order(r: dict) -> int:
    """Engine policies in the API's order, peers after them."""
    return POLICIES.index(r["policy"]) if r["policy"] in POLICIES else len(POLICIES)


def by_key(records):
    return {(r.get("model"), r["workload"], r["link"], round(r["budget_frac"], 3), r["policy"]): r for r in records}


def _f(v, fmt=".1f"):
    return "–" if v is None else format(v, fmt)


def _span(values) -> str:
    """"7" or "7–8" (policies of one setting can differ where a shard was cut)."""
    vs = sorted(set(values))
    return str(vs[0]) if len(vs) == 1 else f"{vs[0]}–{vs[-1]}"


N_POLICIES = 10               # the protocol's engine policies (BENCHMARK.md)


def coverage(records: list[dict]) -> tuple[str, list[str]]:
    """The coverage table (model x link x budget x workload against the protocol) and what is still to run, one
    line per gap. The `engine code` column is the digest of spice_core the rows ran on (bench's provenance):
    shards merge only within one digest, so a cell's remaining prompts run on that code (or the cell again)."""
    lines = ["| model | link | budget | workload | prompts run (of 8) | decode steps per policy | policies | GPU | engine code |",
             "|---|---|---|---|---|---|---|---|---|"]
    gaps = []
    seen = {}
    for r in records:
        seen.setdefault((r.get("model"), r["link"], r["budget_frac"], r["workload"]), []).append(r)
    for model in list(MODELS) + [m for m in models_of(records) if m not in MODELS]:
        budgets = sorted(set(MODELS.get(model, ("", "", PROTOCOL_BUDGETS))[2])
                         | {b for (m, _, b, _) in seen if m == model})
        for link in PROTOCOL_LINKS:
            for b in budgets:
                for wl in ("prompts", "long"):
                    if wl == "long" and b != 0.25:
                        continue
                    rs = seen.get((model, link, b, wl))
                    cell = f"{model_name(model)}, {link}, {b:.0%}, {'8 prompts' if wl == 'prompts' else 'the long prompt'}"
                    if not rs:
                        lines.append(f"| {model_name(model)} | {link} | {b:.0%} | {wl} | **not run** | 0 | 0 | – | – |")
                        gaps.append(f"{cell}: not run")
                        continue
                    runs = _span(r["n_runs"] for r in rs)
                    steps = _span(r["n_decode_tokens"] for r in rs)
                    code = ", ".join(sorted({(r.get("provenance") or {}).get("code") or "?" for r in rs}))
                    gpu = ", ".join(sorted({r.get("gpu") or GPU_BEFORE_ENV_FILES for r in rs}))
                    lines.append(f"| {model_name(model)} | {link} | {b:.0%} | {wl} | "
                                 f"{runs if wl == 'prompts' else '1 (448 tokens)'} | {steps} | {len(rs)} | {gpu} | `{code}` |")
                    short = [why for why in (
                        f"{min(r['n_runs'] for r in rs)} of {PROTOCOL_PROMPTS} prompts"
                        if wl == "prompts" and min(r["n_runs"] for r in rs) < PROTOCOL_PROMPTS else "",
                        f"{len(rs)} of {N_POLICIES} policies" if len(rs) < N_POLICIES else "") if why]
                    if short:
                        gaps.append(f"{cell}: {', '.join(short)} (engine code `{code}`)")
    return "\n".join(lines), gaps


def coverage_table(records: list[dict]) -> str:
    return coverage(records)[0]


def _tf(r: dict) -> str:
    """The GPU quality pass's top-1 agreement, strict (with resident's exact ties agreeing), or – where none ran."""
    if r.get("tf_top1_agreement") is None:
        return "–"
    return f"{r['tf_top1_agreement']:.3f} ({r['tf_top1_agreement_ties']:.3f})"


def policy_table(records: list[dict], workload: str = "prompts") -> str:
    head = ("| link | GPU | budget | policy | TPOT median ms [95% CI] | p90 | tokens/s | hit rate | GB/token | stall ms/token | "
            "misses approx/cpu/copy | floor ms | 3-lane floor ms | × 3-lane floor | host µs/layer | greedy agr. | "
            "GPU teacher-forced top-1 (ties agreeing) | GPU mean KL | GPU ppl Δ % (held-out text) | ppl Δ % | "
            "mean KL | executor |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted((r for r in records if r["workload"] == workload),
                    key=lambda r: (PROTOCOL_LINKS.index(r["link"]), r["budget_frac"], _order(r))):
        # (one model's records: render_readme gives each model its own table)
        ci = r.get("tpot_ms_median_ci95")
        ms = r.get("miss_split") or {}
        fast = any(n.startswith("fast path: decode steps replay") for n in r.get("notes", []))
        eager = any(n.startswith("fast path off") for n in r.get("notes", []))
        lines.append(
            f"| {r['link']} | {r.get('gpu') or GPU_BEFORE_ENV_FILES} | {r['budget_frac']:.0%} | {r['policy']} | {_f(r['tpot_ms_median'])} "
            f"[{_f(ci[0]) if ci else '–'}, {_f(ci[1]) if ci else '–'}] | {_f(r['tpot_ms_p90'])} | {_f(r.get('tokens_per_s'))} | "
            f"{_f(r['hit_rate'], '.3f')} | {_f(r['bytes_per_token'] / 1e9, '.2f')} | {_f(r['stall_ms_per_token'])} | "
            f"{ms.get('approx', 0)}/{ms.get('cpu', 0)}/{ms.get('copy', 0)} | {_f(r.get('floor_ms'))} | "
            f"{_f(r.get('floor3_ms'))} | {_f(r.get('tpot_over_floor3'), '.2f')} | {_f(r.get('host_us_per_layer'), '.0f')} | "
            f"{_f(r.get('greedy_agreement'), '.3f')} | {_tf(r)} | {_f(r.get('tf_kl_mean'), '.5f')} | "
            f"{_f(r.get('text_ppl_delta_pct'), '+.2f')} | {_f(r.get('ppl_delta_pct'), '+.2f')} | "
            f"{_f(r.get('mean_kl'), '.4f')} | "
            f"{'graphed' if fast and not eager else 'eager' if eager else '?'} |")
    return "\n".join(lines)


def peer_table(peers: list[dict], engine: list[dict]) -> str:
    """The peers in their own columns (they have no router trace, lane or host step), each beside the
    engine's `spice` and `resident` of the same link, budget and workload where this round measured them."""
    eng = by_key(engine)
    head = ("| model | peer | GPU budget | runs × decode steps | TPOT median ms [95% CI] | p90 | tokens/s | TTFT ms | GB copied/token | "
            "GPU peak GB | greedy agr. with the engine's resident | experts impl. | cache | the engine's row beside it | its TPOT ms | "
            "peer ÷ engine |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    order = list(MODELS)
    for r in sorted(peers, key=lambda r: (order.index(r.get("model")) if r.get("model") in order else len(order),
                                          r["budget_frac"], r["policy"])):
        ci = r.get("tpot_ms_median_ci95")
        setup = r.get("peer_setup") or {}
        if r["budget_frac"] >= 1.0:      # every expert on the GPU: beside the engine's resident (25%'s, else any budget's)
            name = "resident"
            mine = eng.get((r.get("model"), r["workload"], r["link"], 0.25, "resident")) or next(
                (e for k, e in sorted(eng.items(), key=lambda kv: str(kv[0]))
                 if k[:3] == (r.get("model"), r["workload"], r["link"]) and k[4] == "resident"), None)
        else:
            name = f"spice at {r['budget_frac']:.0%}"
            mine = eng.get((r.get("model"), r["workload"], r["link"], round(r["budget_frac"], 3), "spice"))
        ratio = r["tpot_ms_median"] / mine["tpot_ms_median"] if mine else None
        lines.append(
            f"| {model_name(r.get('model'))} | {r['policy']} | {r['budget_frac']:.0%} | {r['n_runs']} × {r['n_decode_tokens'] / max(1, r['n_runs']):g} | "
            f"{_f(r['tpot_ms_median'])} [{_f(ci[0]) if ci else '–'}, {_f(ci[1]) if ci else '–'}] | {_f(r['tpot_ms_p90'])} | "
            f"{_f(r.get('tokens_per_s'))} | {_f(r.get('ttft_ms_median'))} | {_f(r['bytes_per_token'] / 1e9, '.2f')} | "
            f"{_f((r.get('gpu_peak_mb') or 0) / 1e3, '.1f')} | {_f(r.get('greedy_agreement'), '.3f')} | "
            f"{setup.get('experts_implementation', '–')} | {setup.get('cache', '–')} | "
            f"{name} | {_f(mine['tpot_ms_median']) if mine else 'not run'} | {_f(ratio, '.1f') + '×' if ratio else '–'} |")
    return "\n".join(lines)


ROUTING_REALISM = Path("docs/benchmarks/routing-realism/results.json")
PUBLISHED_LRU_25 = {"spice-mini": ("DeepSeek-V2-Lite", "≈ 47.7%"), "spice-mini-qwen2": ("Qwen2-57B-A14B", "≈ 45.0%")}


def routing_realism_table(path: Path = ROUTING_REALISM) -> str:
    """The miniatures' LRU hit rates beside the published figures for the real models (benchmarks/routing_realism.py)."""
    if not path.exists():
        return "Not measured yet: `python benchmarks/routing_realism.py --out docs/benchmarks/routing-realism`."
    doc = json.loads(path.read_text())
    lines = ["| model (stands for) | budget | engine `lru` hit rate (measured, CPU) | per-layer LRU | static oracle | "
             "published LRU, real model |", "|---|---|---|---|---|---|"]
    for m in doc["models"]:
        real, published = PUBLISHED_LRU_25.get(m["model"], ("?", "–"))
        for b in m["budgets"]:
            per_layer = b.get("lru_per_layer_hit_rate")
            lines.append(f"| {m['model']} ({real}) | {b['budget']:.0%} | {b['engine_lru_hit_rate']:.1%} | "
                         f"{'–' if per_layer is None else format(per_layer, '.1%')} | {b['static_oracle_hit_rate']:.1%} | "
                         f"{published if abs(b['budget'] - 0.25) < 1e-9 else '–'} |")
    ent = [m["routing_skew"]["summary"]["entropy_norm"] for m in doc["models"]]
    at25 = [b["engine_lru_hit_rate"] for m in doc["models"] for b in m["budgets"] if abs(b["budget"] - 0.25) < 1e-9]
    return "\n".join(lines) + "\n\n" + ROUTING_NOTE.format(
        ent=f"{min(e['min'] for e in ent):.2f}–{max(e['max'] for e in ent):.2f}",
        lru25=f"{min(at25):.1%}–{max(at25):.1%}" if at25 else "–")


# The lane's compute time per job, fitted on both lifts' measured cpu_compute records (model-check/README.md, "The CPU
# lane fitted on two expert sizes"): a fixed cost per job plus the expert's bytes at a rate.
CPU_LANE_FIT = Path("docs/benchmarks/headline/model-check/h200-graphed-refit-native-lane.json")
HOST_DRAM_GBPS = 81.0          # the H200 host's DRAM read rate (FACTS.md, probes/cpu_expert.py)


def lane_fit(path: Path = CPU_LANE_FIT) -> tuple[float, float] | None:
    """(fixed ms per job, GB/s) of the fitted lane, or None where the fit is not there."""
    if not path.exists():
        return None
    prof = json.loads(path.read_text())
    fixed_us, gbps = prof.get("cpu_job_compute_us"), prof.get("cpu_mem_gbps")
    return (float(fixed_us) / 1e3, float(gbps)) if fixed_us is not None and gbps else None


def lane_ms_for(fit: tuple[float, float]):
    """One expert of ``expert_bytes`` through the fitted lane, in ms: the floors' lane time for each model's experts
    (the measured whole-expert time of one size, scaled in proportion to another's bytes, put Qwen2-57B-A14B's
    55 MB experts at 2.27 ms where its records measure 0.94-1.34, and some rows below their own floor)."""
    fixed_ms, gbps = fit
    return lambda expert_bytes: fixed_ms + expert_bytes / (gbps * 1e6)


def targets(records: list[dict]) -> tuple[str, list[dict]]:
    """BENCHMARK.md's targets at 25%, each marked met or missed."""
    k = by_key(records)
    rows, marks = [], []
    for model, link in ((m, lk) for m in models_of(records) for lk in PROTOCOL_LINKS):
        g = lambda p: k.get((model, "prompts", link, 0.25, p))   # noqa: E731
        sp, od, lru, orc, spp, res = (g(p) for p in ("spice", "on_demand", "lru", "oracle_prefetch", "spice_prefetch",
                                                    "resident"))
        if not all((sp, od, lru, orc, spp)):
            continue
        # A cell whose GPU cannot hold resident's slots (the Qwen2 lift on an H100) has no resident row: what needs
        # it is not measured there, and greedy agreement is with on_demand, which the fast path keeps bitwise
        # identical to resident (tests/runtime).
        t = lambda r: r["tpot_ms_median"]   # noqa: E731
        t_res = t(res) if res else None
        vs_od, vs_lru = (3.12, 1.5) if link == "native" else (3.5, 2.0)
        ppl, ppl_where = gpu_ppl(sp)
        agr = sp.get("greedy_agreement")
        gap = t(lru) - t(orc)
        closed = (t(lru) - t(spp)) / gap if gap > 0 else None
        checks = [
            (f"`spice` ≥ {vs_od}× faster than `on_demand`", t(od) / t(sp), f"{t(od) / t(sp):.2f}×", t(od) / t(sp) >= vs_od),
            (f"`spice` ≥ {vs_lru}× faster than `lru`", t(lru) / t(sp), f"{t(lru) / t(sp):.2f}×", t(lru) / t(sp) >= vs_lru),
            ("`spice` within 1.25× of `oracle_prefetch`", t(sp) / t(orc), f"{t(sp) / t(orc):.2f}× (spice / oracle)",
             t(sp) / t(orc) <= 1.25),
            ("`spice` ≤ 1% perplexity increase", ppl, "not measured" if ppl is None else f"{ppl:+.2f}% ({ppl_where})",
             ppl is not None and ppl <= 1.0),
            ("`spice` greedy agreement with `resident` ≥ 0.9 (GPU, 64 tokens)", agr,
             "not measured" if agr is None else f"{agr:.3f}" + ("" if res else " (with `on_demand`)"),
             agr is not None and agr >= 0.9),
            ("`spice_prefetch` closes ≥ 80% of the `lru` → `oracle_prefetch` gap", closed,
             "no gap" if closed is None else f"{closed:.0%}", closed is not None and closed >= 0.8),
            ("`resident` ≤ 8 ms", t_res, "not measured" if res is None else f"{t_res:.2f} ms",
             res is not None and t_res <= 8.0),
        ]
        for pol, bound in (("spice", 100.0), ("resident", 25.0)):
            h = (g(pol) or {}).get("host_us_per_layer")
            checks.append((f"`{pol}` host ≤ {bound:.0f} µs per MoE layer (GPU idle)", h,
                           "not measured" if h is None else f"{h:.0f} µs", h is not None and h <= bound))
        for pol in ("on_demand", "lru"):
            r = g(pol)
            name = f"`{pol}` within 10% of its link floor (transfer + unhidden compute)"
            if res is None:
                checks.append((name, None, "not measured", False))
            elif r.get("routed_bytes_per_token") and r.get("link_gbps"):
                # bytes copied per token / link rate, plus the compute a policy that copies on demand cannot hide
                link_floor = (1 - r["hit_rate"]) * r["routed_bytes_per_token"] / (r["link_gbps"] * 1e6) + t_res
                over = t(r) / link_floor - 1
                checks.append((name, over, f"{over:+.0%} over {link_floor:.1f} ms", over <= 0.10))
        f3 = [r for r in records if r.get("model") == model and r["link"] == link and r["workload"] == "prompts"
              and round(r["budget_frac"], 3) == 0.25 and r.get("tpot_over_floor3")]
        within = [r for r in f3 if 1.0 <= r["tpot_over_floor3"] <= 1.5]
        below = len([r for r in f3 if r["tpot_over_floor3"] < 1.0])    # faster than its floor: the floor is off there
        if f3:
            checks.append(("every row within 1.5× of its three-lane floor", len(within) / len(f3),
                           f"{len(within)} of {len(f3)} rows" + (f" ({below} below 1×)" if below else ""),
                           len(within) == len(f3)))
        # A cell still short of the protocol's prompts says so beside every number it gives.
        part = f" ({sp['n_runs']} of {PROTOCOL_PROMPTS} prompts)" if sp.get("n_runs", PROTOCOL_PROMPTS) < PROTOCOL_PROMPTS else ""
        for name, value, shown, met in checks:
            # A target with nothing measured is neither met nor missed yet: it says so ("met": None in targets.json).
            state = "**not measured**" if value is None and shown == "not measured" else "**met**" if met else "**missed**"
            tag = part if shown != "not measured" and "perplexity" not in name else ""   # quality: its own run
            rows.append(f"| {model_name(model)} | {link} | {name} | {shown}{tag} | {state} |")
            marks.append({"model": model, "link": link, "target": name, "value": value,
                          "met": None if state == "**not measured**" else bool(met)})
    table = "| model | link | target (25% budget) | measured | |\n|---|---|---|---|---|\n" + "\n".join(rows)
    return table, marks


def needed_for_312(records: list[dict]) -> str:
    """The floor arithmetic of the target over on_demand (3.12x native, 3.5x x8): the TPOT it means, and the GB
    per token that the link could move in that time if every copy were hidden behind compute."""
    k = by_key(records)
    lines = ["What the speed-up target over `on_demand` would take (floor arithmetic, 25%):", ""]
    for model, link in ((m, lk) for m in models_of(records) for lk in PROTOCOL_LINKS):
        od, sp, res = (k.get((model, "prompts", link, 0.25, p)) for p in ("on_demand", "spice", "resident"))
        if not (od and sp):
            continue
        x = 3.12 if link == "native" else 3.5
        goal_ms = od["tpot_ms_median"] / x
        gb_at_goal = goal_ms * sp["link_gbps"] / 1e3
        ms = sp.get("miss_split") or {}
        lines.append(
            f"- **{model_name(model)}, {link}**: {od['tpot_ms_median']:.1f} / {x} = {goal_ms:.1f} ms per token. In that time the link "
            f"({sp['link_gbps']:.1f} GB/s) moves at most {gb_at_goal:.2f} GB; `spice` copied "
            f"{sp['bytes_per_token'] / 1e9:.2f} GB per token ({sp['bytes_per_token'] / 1e9 / gb_at_goal:.0%} of that), "
            f"sent {ms.get('cpu', 0) / sp['n_decode_tokens']:.1f} experts per token to the CPU lane and approximated "
            f"{ms.get('approx', 0) / sp['n_decode_tokens']:.1f}, and took {sp['tpot_ms_median']:.1f} ms "
            f"(three-lane floor {_f(sp.get('floor3_ms'))} ms)"
            + (f", with `resident`'s step at {res['tpot_ms_median']:.1f} ms." if res else " (no `resident` row here)."))
    return "\n".join(lines)


def history_table(records: list[dict], history: list[dict] | None) -> str:
    """Each policy's TPOT, this headline beside the first (same model, protocol and settings), for every link and
    budget both measured."""
    if not history:
        return "No earlier headline to compare with."
    now, then = by_key(records), by_key(history)
    lines = ["| link | budget | policy | first headline, ms | this headline, ms | change |", "|---|---|---|---|---|---|"]
    model = QUALITY_MODEL          # the first headline measured this model only
    for link in PROTOCOL_LINKS:
        for budget in PROTOCOL_BUDGETS:
            for pol in POLICIES:
                a, b = (d.get((model, "prompts", link, round(budget, 3), pol)) for d in (then, now))
                if not (a and b):
                    continue
                lines.append(f"| {link} | {budget:.0%} | {pol} | {a['tpot_ms_median']:.1f} | {b['tpot_ms_median']:.1f} | "
                             f"{b['tpot_ms_median'] / a['tpot_ms_median'] - 1:+.0%} |")
    return "\n".join(lines)


def write_figures(records: list[dict], out: Path) -> list[str]:
    try:
        import plotly.graph_objects as go
    except ImportError:
        print("plotly is not installed: no figures (pip install plotly)", file=sys.stderr)
        return []
    names = []
    for model, link in ((m, lk) for m in models_of(records) for lk in PROTOCOL_LINKS):
        rs = [r for r in records if r.get("model") == model and r["link"] == link and r["workload"] == "prompts"
              and not r.get("peer")]
        if not rs:
            continue
        fig = go.Figure()
        for b in sorted({r["budget_frac"] for r in rs}):
            sel = sorted((r for r in rs if r["budget_frac"] == b), key=_order)
            pols = [r["policy"] for r in sel]
            fig.add_bar(name=f"budget {b:.0%} (n={min(r['n_decode_tokens'] for r in sel)} steps)", x=pols,
                        y=[r["tpot_ms_median"] for r in sel],
                        error_y=dict(type="data", symmetric=False,
                                     array=[r["tpot_ms_p90"] - r["tpot_ms_median"] for r in sel]),
                        hovertemplate="%{x}: %{y:.1f} ms median (whisker: p90)<extra></extra>")
            fig.add_scatter(name=f"three-lane floor, {b:.0%}", x=pols, y=[r.get("floor3_ms") for r in sel],
                            mode="markers", marker=dict(symbol="line-ew-open", size=26, line=dict(width=3)),
                            hovertemplate="%{x}: three-lane floor %{y:.1f} ms<extra></extra>")
        gpus = sorted({r.get("gpu") or GPU_BEFORE_ENV_FILES for r in rs})
        fig.update_layout(title=f"TPOT per policy, {link} link (measured, one {' / '.join(gpus)}, lifted miniature at "
                                f"{model_name(model)} shapes)",
                          barmode="group", yaxis_title="TPOT median, ms (measured)", xaxis_title="policy",
                          legend=dict(orientation="h", y=-0.3), margin=dict(t=60))
        name = f"tpot-{MODELS[model][1] if model in MODELS else 'model'}-{link}.html"
        fig.write_html(out / name, include_plotlyjs="cdn")
        names.append(name)
    return names


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("docs/benchmarks/headline"))
    ap.add_argument("--history", type=Path, default=Path("docs/benchmarks/full-scale/headline/results.json"),
                    help="an earlier headline's results.json, shown as history (25%% budget)")
    args = ap.parse_args(argv)
    d = args.dir
    if not (d / "raw").is_dir():
        print(f"error: no {d / 'raw'}: copy each shard's output folder there", file=sys.stderr)
        return 2
    records = load_shards(d / "raw")
    if not records:
        print(f"error: no shard results under {d / 'raw'}: copy each shard's output folder there", file=sys.stderr)
        return 2
    fill_floor_inputs(records, NATIVE_GBPS_FALLBACK)
    for r in records:
        r.pop("shard", None)
    joined = join_output_variants(records, run_digests(d))   # slices differing only in traces written: one run
    runs: dict[str, list[dict]] = {}        # shards of one config merge; configs (links, budgets) stay apart
    for r in records:
        runs.setdefault(json.dumps((r.get("provenance") or {}).get("config")), []).append(r)
    try:
        refuse_mixed_gpus(runs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    merged = [m for run in runs.values() for m in merge_records(run)]
    note_configs(joined, merged)
    for model in models_of(merged):       # each model's floor has its own compute (its resident step)
        add_floors([r for r in merged if r.get("model") == model])
    fit = lane_fit()
    for r in merged:                      # bench's own three-lane floor (per run) gives way to the report's (per model)
        for field in FLOOR3_FIELDS:
            r.pop(field, None)
    three_lane_floor(merged, lane_ms_for(fit) if fit is not None else None, HOST_DRAM_GBPS)   # none without the fit
    quality = load_quality(d)
    attach_quality(merged, quality)
    order = models_of(merged)
    merged.sort(key=lambda r: (order.index(r.get("model")), r["workload"] != "prompts", PROTOCOL_LINKS.index(r["link"]),
                               r["budget_frac"], _order(r)))
    (d / "results.json").write_text(json.dumps(merged, indent=1, default=float) + "\n")
    figs = write_figures(merged, d)
    table, marks = targets(merged)
    (d / "targets.json").write_text(json.dumps(marks, indent=1) + "\n")
    history = json.loads(args.history.read_text()) if args.history.exists() else None
    (d / "README.md").write_text(render_readme(merged, table, figs, quality, history, fit, repeats_table(d)))
    print(f"wrote {d / 'results.json'} ({len(merged)} records), {d / 'README.md'}, {', '.join(figs) or 'no figures'}")
    return 0


def load_quality(d: Path) -> dict | None:
    """Every ``quality*.json`` of the folder (benchmarks/headline_quality.py, one per model) as one {"rows": [...]}
    (each row keeps its file's command)."""
    rows = []
    for path in sorted(d.glob("quality*.json")):
        doc = json.loads(path.read_text())
        rows += [dict(q, command=doc.get("command"), file=path.name) for q in doc.get("rows", [])]
    return {"rows": rows} if rows else None


def time_split_table(records: list[dict]) -> str:
    """Where each row's decode tokens' time went (bench's ``time_split_ms_per_token``, trace.occupancy), for the rows
    that carry it (records from before it carry none: then ""). ms per token; the states add up to the clock's token
    window, which the row's TPOT exceeds by the bookkeeping after it."""
    rows = [r for r in records if r.get("time_split_ms_per_token")]
    if not rows:
        return ""
    states = list(rows[0]["time_split_ms_per_token"])
    head = ("| link | budget | workload | policy | token window ms | " + " | ".join(f"{s} ms" for s in states)
            + " | bound | link busy ms (hidden under GPU) | CPU lane busy ms |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in sorted(rows, key=lambda r: (PROTOCOL_LINKS.index(r["link"]), r["budget_frac"], r["workload"] != "prompts",
                                         _order(r))):
        split, busy = r["time_split_ms_per_token"], r["busy_ms_per_token"]
        top = max(states, key=lambda s: split[s])
        lines.append(f"| {r['link']} | {r['budget_frac']:.0%} | {r['workload']} | {r['policy']} | "
                     f"{_f(busy['token window'], '.2f')} | " + " | ".join(_f(split[s], '.2f') for s in states)
                     + f" | {top} | {_f(busy['link'], '.2f')} ({_f(busy['link hidden under GPU work'], '.2f')}) | "
                     f"{_f(busy['CPU lane'], '.2f')} |")
    return "\n".join(lines)


def render_readme(records, target_table, figs, quality, history, lane, repeats=None) -> str:
    q_rows = (quality or {}).get("rows", [])
    q_table = "\n".join(
        f"| {model_name(q.get('model', QUALITY_MODEL))} | {q['link']} | {q['budget_frac']:.0%} | {', '.join(q.get('policies', LOSSY))} | "
        f"{q['ppl_exact']:.3f} → {q['ppl']:.3f} ({q['ppl_delta_pct']:+.2f}%) | {q['mean_kl']:.4f} | "
        f"{q['greedy_agreement']:.3f} | {q['approx_share']:.0%} |" for q in q_rows)
    engine = [r for r in records if not r.get("peer")]
    peers = [r for r in records if r.get("peer")]
    cov, gaps = coverage(engine)
    per_model = []
    for model in models_of(engine):
        mine = [r for r in engine if r.get("model") == model]
        name = model_name(model)
        per_model.append(f"## {name}: every policy, 8 held-out prompts × 64 tokens\n\n" + policy_table(mine, "prompts"))
        if any(r["workload"] == "long" for r in mine):
            per_model.append(f"## {name}: the 448-token prompt, 25% budget\n\n" + policy_table(mine, "long"))
        split = time_split_table(mine)
        if split:
            per_model.append(f"## {name}: where a decode token's time goes\n\n" + split + "\n\n" + TIME_SPLIT_NOTE)
    oracle = (by_key(records).get(("lift:spice-mini", "prompts", "pcie4x8", 0.25, "oracle_prefetch")) or {}).get(
        "tpot_over_floor3")
    per_model[0] += "\n\n" + FLOOR_NOTE.format(
        lane=f"{lane[0] * 1e3:.0f} µs + an expert's bytes ÷ {lane[1]:g} GB/s" if lane else "not fitted (no floor)",
        dram=HOST_DRAM_GBPS, fit=CPU_LANE_FIT, oracle=f"{oracle:.2f}×" if oracle else "not measured")
    parts = [HEADER,
             "## Coverage: what ran, against the protocol\n\n" + cov + "\n\n" + coverage_note(gaps),
             "## Targets (BENCHMARK.md), 25% budget\n\n" + target_table + "\n\n" + needed_for_312(records),
             *per_model,
             *(["## Run-to-run spread: a slice run twice (`repeats/`, not merged)\n\n" + repeats] if repeats else []),
             "## Peers: what users run today\n\n" + (peer_table(peers, engine) + "\n\n" + PEERS_NOTE if peers else PEERS_MISSING),
             "## Routing realism: the miniatures' LRU hit rate beside the real models'\n\n" + routing_realism_table(),
             "## Quality of the lossy setting (measured on the miniature, same settings)\n\n"
             "| model | link | budget | policies | perplexity exact → spice | mean KL (nats/token) | greedy agreement | "
             "selections approximated |\n|---|---|---|---|---|---|---|---|\n" + (q_table or "| – | – | – | – | not measured | | | |")
             + "\n\n" + QUALITY_NOTE,
             "## History: the first headline beside this one\n\n" + history_table(engine, history) + "\n\n" + HISTORY_NOTE,
             "## Figures\n\n" + ("\n".join(f"- [`{f}`]({f}): TPOT median per policy (whiskers: p90), the three-lane floor "
                                           "marked (plotly; open in a browser)" for f in figs) or "plotly was not installed: none"),
             "## Commands\n\n" + COMMANDS]
    return "\n\n".join(parts) + "\n"


def coverage_note(gaps: list[str]) -> str:
    """Whether the protocol is complete, and what is still to run (from `coverage`)."""
    if not gaps:
        head = "The protocol's runs are **complete**."
    else:
        head = "The protocol is **not complete**. Still to run, with the commands below:\n\n" + "\n".join(f"- {g}" for g in gaps)
    return head + "\n\n" + CODE_NOTE


if __name__ == "__main__":
    sys.exit(main())
