"""Speed–quality of SPICE's miss orchestration (LoRE surrogates, CPU lane) against the baselines.

    python benchmarks/speed_quality.py [--model assets/spice-mini] [--shape deepseek-v2-lite]
        [--profiles rtx4090-pcie4x16 rtx5090-pcie4x8 h200-pcie5x16] [--cache-frac 0.25]
        [--taus 0 0.02 0.05 0.1 0.2] [--ranks 16 32] [--prompts 8] [--max-new-tokens 64]
        [--quality-tokens 512] [--jobs 2] [--out docs/benchmarks/speed-quality]

For every profile (one worker process each, ``--jobs`` at a time), at one cache budget:
  baselines   lru, cpu_compute, spice_prefetch (exact)
  spice       tau_approx x LoRE rank x CPU lane on/off (tau 0 is exact, so one run per lane)
TPOT is **modeled**: the engine runs the model exactly on this CPU and the timing model replays
its decisions as if every expert had the ``--shape``'s size on the profile's hardware (so the
numbers are deterministic and one repetition suffices). Quality is measured on the model itself:
teacher-forced perplexity delta and mean KL against the exact model on held-out text (decoded one
token per step, so the same cache, prefetch and miss decisions as generation), and greedy
agreement with the exact model's tokens on the same prompts the TPOT runs use.

Writes ``<out>.json`` (every record), ``<out>.results.md`` (tables, the target check, the exact
command) and ``<out>.html`` (the Pareto plot; plotly, imported only here) plus ``<out>.png`` when
kaleido can render offline.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.config import MAX_NEW_TOKENS_LIMIT, SETTING_RANGES  # noqa: E402
from spice_core.errors import SpiceError  # noqa: E402
from spice_core.predictor.traces import MIN_CALIBRATION_TOKENS  # noqa: E402
from spice_core.timing.profiles import profile_names, shape_names  # noqa: E402

BASELINES = ("lru", "cpu_compute", "spice_prefetch")
PCIE4_PROFILES = ("rtx4090-pcie4x16", "rtx5090-pcie4x8")
PPL_BUDGET_PCT = 1.0
SPEEDUP_TARGET = 1.5


def configs(taus, ranks, extra_ranks=()) -> list[dict]:
    """The policy grid: baselines, then spice per (tau, rank, lane). tau 0 is exact whatever the
    rank (one run per lane, at the largest rank, whose bytes the budget then carries); the
    ``extra_ranks`` run with the CPU lane on only."""
    top = max(ranks)
    out = [dict(policy=p, tau_approx=0.0, lore_rank=top, cpu_lane=True) for p in BASELINES]
    for lane in (True, False):
        for tau in taus:
            rs = [top] if tau == 0 else sorted(set(ranks) | (set(extra_ranks) if lane else set()))
            out += [dict(policy="spice", tau_approx=tau, lore_rank=r, cpu_lane=lane) for r in rs]
    return out


def _prompts(lm, n: int) -> list[list[int]]:
    try:
        from prefetch_modeled import heldout_prompts     # the prompts the prefetch benchmark uses
    except ImportError:
        heldout_prompts = None
    if heldout_prompts is not None:
        return heldout_prompts(lm, n)
    from spice_core.tools.quality import eval_set
    return [list(p) for p in eval_set(_Eng(lm), n_prompts=n).prompts]


class _Eng:   # eval_set only needs .lm
    def __init__(self, lm):
        self.lm = lm


def load(args):
    import torch

    from spice_core.engine import SpiceEngine
    from spice_core.model.loader import load_model

    torch.set_num_threads(1)
    dtype = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16}[args["dtype"]]
    lm = load_model(args["model"], "cpu", dtype=dtype)
    engine = SpiceEngine(lm, timing="modeled")
    engine.load_artifacts()
    notes = []
    if engine.artifacts is None or engine.artifacts.lore is None:
        if not args["fit_lore"]:
            from spice_core.errors import ArtifactError
            raise ArtifactError(f"{lm.name} has no LoRE factors beside it: build them with: python -m spice_core "
                                f"calibrate --model {args['model']} (or pass --fit-lore to fit them here)")
        from types import SimpleNamespace

        from spice_core.lore import fit_lore_bank
        from spice_core.predictor.traces import traces_for_model
        bank = fit_lore_bank(lm, traces_for_model(lm, max_tokens=args["fit_tokens"]), args["fit_rank"])
        if engine.artifacts is None:
            engine.artifacts = SimpleNamespace(lore=bank, draft=None, popularity=None)
        else:
            engine.artifacts.lore = bank
        notes.append(f"LoRE fitted by this benchmark on {args['fit_tokens']} calibration tokens (rank {args['fit_rank']})")
    return engine, notes


def usable_ranks(engine, wanted) -> tuple[list[int], str]:
    bank = engine.artifacts.lore
    limit = min(bank.max_rank, bank.expert_width)
    ok = [r for r in wanted if r <= limit]
    dropped = [r for r in wanted if r > limit]
    note = ""
    if dropped:
        why = f"the expert width is {bank.expert_width}" + (
            f" and the LoRE factors go to rank {bank.max_rank}" if bank.max_rank < bank.expert_width else "")
        if not ok:
            ok = [limit]
        note = f"ranks {dropped} do not fit ({why}): used {ok}"
    return ok, note


def run_profile(args: dict, profile: str) -> dict:
    """Every config on one profile: TPOT runs over the prompts, then quality. One process."""
    from dataclasses import replace

    from spice_core.api import RunSettings
    from spice_core.tools.quality import EvalSet, agreement, eval_set, evaluate, exact_reference

    t0 = time.perf_counter()
    engine, notes = load(args)
    lm = engine.lm
    ranks, rank_note = usable_ranks(engine, args["ranks"])
    extra, _ = usable_ranks(engine, args["extra_ranks"])
    if rank_note:
        notes.append(rank_note)
    prompts = _prompts(lm, args["prompts"])
    base = RunSettings(policy="lru", cache_frac=args["cache_frac"], profile=profile, shape=args["shape"],
                       max_new_tokens=args["max_new_tokens"], tau_prefetch=args["tau_prefetch"],
                       max_lookahead=args["max_lookahead"])
    held = eval_set(engine, max_tokens=args["quality_tokens"], window=args["window"], n_prompts=1)
    data = EvalSet(held.windows, tuple(tuple(p) for p in prompts), held.source)
    ref = exact_reference(engine, data, new_tokens=0, base=base)            # teacher-forced exact logits
    exact_tokens = [[s.token_id for s in engine.start_ids(p, replace(base, policy="resident", cache_frac=1.0))]
                    for p in prompts]
    records = []
    for cfg in configs(args["taus"], ranks, [r for r in extra if r not in ranks]):
        s = replace(base, **cfg)
        steps, hits, misses, copied, stall, split, same, total, firsts, run_notes = [], 0, 0, 0, 0.0, {}, 0, 0, [], set()
        for p, ex in zip(prompts, exact_tokens):            # TPOT runs (modeled timing)
            run = engine.start_ids(p, s)
            st = list(run)
            dec = st[1:] if len(st) > 1 else st
            steps += [x.step_ms for x in dec]
            hits += sum(x.hits for x in dec)
            misses += sum(x.misses for x in dec)
            copied += sum(x.bytes_copied for x in dec)
            stall += sum(x.stall_ms for x in dec)
            for x in dec:
                for o in x.outcomes:
                    split[o.outcome] = split.get(o.outcome, 0) + 1
            k, first = agreement(ex, [x.token_id for x in st])
            same, total = same + k, total + max(len(ex), len(st))
            firsts.append(first)
            run_notes.update(run.summary().notes)
        q = evaluate(engine, s, ref)                        # teacher-forced quality
        n_dec = max(1, len(steps))
        dec_q = statistics.quantiles(steps, n=10) if len(steps) > 1 else [steps[0]] * 9
        records.append({
            "profile": profile, **cfg, "tpot_ms": statistics.median(steps), "tpot_p90_ms": dec_q[8],
            "hit_rate": hits / max(1, hits + misses), "experts_copied_per_token": copied / lm.layout.nbytes / n_dec,
            "stall_ms_per_token": stall / n_dec,
            "per_token": {k: v / n_dec for k, v in sorted(split.items())},
            "ppl": q.ppl, "ppl_exact": q.ppl_exact, "ppl_delta_pct": q.ppl_delta_pct, "mean_kl": q.mean_kl,
            "top1_agreement": q.top1_agreement, "forced_miss_split": q.miss_split,
            "greedy_agreement": same / max(1, total), "diverged_prompts": sum(f is not None for f in firsts),
            "first_divergence": firsts, "notes": sorted(run_notes | set(q.notes))})
        r = records[-1]
        print(f"[{profile}] {cfg['policy']} tau={cfg['tau_approx']} r={cfg['lore_rank']} lane={cfg['cpu_lane']}: "
              f"TPOT {r['tpot_ms']:.2f} ms, ppl {r['ppl_delta_pct']:+.2f}%, KL {r['mean_kl']:.4f}, "
              f"greedy {r['greedy_agreement']:.3f}", flush=True)
    bank = engine.artifacts.lore
    return {"profile": profile, "records": records, "notes": notes, "ranks": ranks, "seconds": time.perf_counter() - t0,
            "info": {"model": lm.name, "expert_width": lm.layout.intermediate, "hidden": lm.layout.hidden,
                     "n_experts": lm.n_experts, "top_k": lm.top_k, "moe_layers": len(lm.moe_layers),
                     "lore_max_rank": bank.max_rank, "lore_info": bank.info,
                     "has_draft": bool(engine.artifacts and getattr(engine.artifacts, "draft", None) is not None),
                     "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
                     "quality_tokens": sum(len(w) - 1 for w in data.windows), "quality_source": data.source,
                     "dtype": str(lm.layout.dtype)}}


def lore_report(args: dict) -> dict:
    """LoRE's relative output error per rank vs plain SVD of the weights and a linear reduced-rank
    regression, on held-out activations (the eval half of the held-out text, never calibrated on):
    once with surrogates fitted on 75% of those tokens and scored on the rest, once for the
    shipped factors scored on all of them."""
    from spice_core.lore import lore_error_report
    from spice_core.predictor.traces import traces_for_model

    engine, _ = load(args)
    lm = engine.lm
    traces = traces_for_model(lm, max_tokens=args["lore_tokens"], part="eval")
    fitted = lore_error_report(lm, traces, args["lore_ranks"])
    shipped = lore_error_report(lm, traces, args["lore_ranks"], bank=engine.artifacts.lore)
    return {"fitted_here": fitted, "shipped": shipped, "tokens": traces.n_tokens, "source": traces.source}


def lore_markdown(rep: dict) -> list[str]:
    L = [f"## LoRE: relative output error per rank ({rep['tokens']} held-out tokens: {rep['source']})", "",
         "rel. error = sqrt(Σ‖E(x) − Ê(x)‖² / Σ‖E(x)‖²) over every (token, routed expert) pair; 1.0 = dropping "
         "the expert. *fitted here*: surrogates fitted on the first 75% of these tokens, scored on the last 25%; "
         "*shipped*: the factors beside the model (fitted on the calibration half), scored on all of them.", "",
         "| rank | LoRE (fitted here) | LoRE (shipped factors) | truncated SVD of the weights | linear RRR |",
         "|---|---|---|---|---|"]
    for a, b in zip(rep["fitted_here"], rep["shipped"]):
        if "skipped" in a:
            L.append(f"| {a['rank']} | skipped: {a['skipped']} | | | |")
            continue
        shipped = f"{b['lore_rel_err']:.3f}" if "lore_rel_err" in b else f"skipped: {b['skipped']}"
        L.append(f"| {a['rank']} | {a['lore_rel_err']:.3f} | {shipped} | {a['svd_rel_err']:.3f} | "
                 f"{a['linear_rel_err']:.3f} |")
    return L + [""]


# ---------------------------------------------------------------------- report
def best_spice(records, profile):
    """The fastest spice config within the perplexity budget on ``profile`` (None if none)."""
    ok = [r for r in records if r["profile"] == profile and r["policy"] == "spice"
          and r["ppl_delta_pct"] <= PPL_BUDGET_PCT]
    return min(ok, key=lambda r: r["tpot_ms"]) if ok else None


def _label(r) -> str:
    if r["policy"] != "spice":
        return r["policy"]
    return f"spice τ={r['tau_approx']:g}" + (f" r={r['lore_rank']}" if r["tau_approx"] > 0 else "") \
        + ("" if r["cpu_lane"] else " no-lane")


def markdown(results, args, argv) -> str:
    info = results[0]["info"]
    recs = [r for res in results for r in res["records"]]
    from spice_core.timing.profiles import get_shape
    shape = get_shape(args["shape"])
    cmd = ("python benchmarks/speed_quality.py " + " ".join(argv)).strip()
    notes = sorted({n for res in results for n in res["notes"]})
    L = [f"# Speed–quality: SPICE miss orchestration vs baselines ({info['model']}, modeled TPOT)", "", "```", cmd,
         "```", "",
         f"- model: {info['model']} ({info['moe_layers']} MoE layers × {info['n_experts']} experts of width "
         f"{info['expert_width']}, hidden {info['hidden']}, top-{info['top_k']}, {info['dtype']}); draft heads "
         f"{'present' if info['has_draft'] else 'absent (spice fell back to the gate predictor)'}; LoRE up to rank "
         f"{info['lore_max_rank']} ({info['lore_info'].get('method', '?')})",
         f"- TPOT **modeled** with shape {shape.name} ({shape.expert_bytes / 1e6:.1f} MB per expert) at "
         f"{args['cache_frac']:.0%} cache; LoRE and draft bytes charged inside the budget at that shape's size; "
         f"{info['prompts']} held-out prompts × {args['max_new_tokens']} greedy tokens, median / p90 over all decode "
         "steps; deterministic, one repetition",
         f"- quality **measured** on {info['model']} itself: {info['quality_tokens']} teacher-forced held-out tokens "
         f"({info['quality_source']}), decoded one token per step; greedy agreement with the exact model over the "
         "same prompts as TPOT",
         f"- LoRE ranks: {results[0]['ranks']}" + (f", and {args['extra_ranks']} with the CPU lane on only"
                                                  if args.get("extra_ranks") else "")] + [f"- note: {n}" for n in notes] + [""]
    L += ["## Target: at ≤ 1% perplexity increase, spice ≥ 1.5× faster than lru (25% cache, PCIe 4.0 profiles)", ""]
    for prof in args["profiles"]:
        lru = next(r for r in recs if r["profile"] == prof and r["policy"] == "lru")
        b = best_spice(recs, prof)
        if b is None:
            L.append(f"- {prof}: no spice setting stays within {PPL_BUDGET_PCT}% perplexity — **missed**")
            continue
        sp = lru["tpot_ms"] / b["tpot_ms"]
        verdict = ("met" if sp >= SPEEDUP_TARGET else "**missed**") if prof in PCIE4_PROFILES else "(not a target)"
        L.append(f"- {prof}: best within budget {_label(b)}: {b['tpot_ms']:.2f} ms vs lru {lru['tpot_ms']:.2f} ms = "
                 f"**{sp:.2f}×** (perplexity {b['ppl_delta_pct']:+.2f}%) — {verdict}")
    L.append("")
    for prof in args["profiles"]:
        rows = [r for r in recs if r["profile"] == prof]
        lru = next(r["tpot_ms"] for r in rows if r["policy"] == "lru")
        L += [f"## {prof}", "",
              "| setting | TPOT ms | p90 ms | × lru | hit rate | approx / cpu / copy per tok | stall ms/tok | "
              "ppl Δ % | mean KL | top-1 agree | greedy agree | diverged |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            pt = r["per_token"]
            L.append(f"| {_label(r)} | {r['tpot_ms']:.2f} | {r['tpot_p90_ms']:.2f} | {lru / r['tpot_ms']:.2f} | "
                     f"{r['hit_rate']:.3f} | {pt.get('approx', 0):.1f} / {pt.get('cpu', 0):.1f} / "
                     f"{pt.get('copy', 0):.1f} | {r['stall_ms_per_token']:.2f} | {r['ppl_delta_pct']:+.3f} | "
                     f"{r['mean_kl']:.5f} | {r['top1_agreement']:.4f} | {r['greedy_agreement']:.3f} | "
                     f"{r['diverged_prompts']}/{info['prompts']} |")
        L.append("")
    if results[0].get("lore_report"):
        L += lore_markdown(results[0]["lore_report"])
    L += [f"Ran on {platform.machine()} CPU, torch 1 thread per profile, {args['jobs']} profile(s) at a time; "
          f"{max(res['seconds'] for res in results):.0f} s for the slowest profile.", ""]
    return "\n".join(L)


def pareto(points):
    """Non-dominated (ppl delta, tpot) points, sorted by ppl delta."""
    front, best = [], float("inf")
    for p in sorted(points, key=lambda r: (r["ppl_delta_pct"], r["tpot_ms"])):
        if p["tpot_ms"] < best:
            front.append(p)
            best = p["tpot_ms"]
    return front


def plot(results, args, out: Path) -> list[str]:
    """Speed-up over lru against perplexity increase, one panel per profile, with the Pareto front
    of the spice settings (HTML; PNG when kaleido renders offline). Returns what was written."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    profs = args["profiles"]
    recs = [r for res in results for r in res["records"]]
    fig = make_subplots(rows=1, cols=len(profs), subplot_titles=profs)
    colors = {True: "#d62728", False: "#1f77b4"}
    small = min(results[0]["ranks"] + list(args.get("extra_ranks") or []))
    for i, prof in enumerate(profs, start=1):
        rows = [r for r in recs if r["profile"] == prof]
        lru = next(r["tpot_ms"] for r in rows if r["policy"] == "lru")
        for r in rows:
            r["speedup"] = lru / r["tpot_ms"]
        for lane in (True, False):
            pts = [r for r in rows if r["policy"] == "spice" and r["cpu_lane"] == lane]
            fig.add_trace(go.Scatter(
                x=[r["ppl_delta_pct"] for r in pts], y=[r["speedup"] for r in pts], mode="markers+text",
                text=[f"τ{r['tau_approx']:g}" + (f" r{r['lore_rank']}" if r["tau_approx"] else "") for r in pts],
                textposition="top center", textfont=dict(size=9),
                marker=dict(color=colors[lane], size=9,
                            symbol=["circle" if r["lore_rank"] == small else "diamond" for r in pts]),
                name="spice, CPU lane " + ("on" if lane else "off"), legendgroup=str(lane), showlegend=i == 1), 1, i)
        front = pareto([r for r in rows if r["policy"] == "spice"])
        fig.add_trace(go.Scatter(x=[r["ppl_delta_pct"] for r in front], y=[r["speedup"] for r in front],
                                 mode="lines", line=dict(color="gray", dash="dot"), name="Pareto front (spice)",
                                 legendgroup="front", showlegend=i == 1), 1, i)
        base = [r for r in rows if r["policy"] in BASELINES]
        fig.add_trace(go.Scatter(x=[r["ppl_delta_pct"] for r in base], y=[r["speedup"] for r in base],
                                 mode="markers+text", text=[r["policy"] for r in base], textposition="bottom right",
                                 textfont=dict(size=9), marker=dict(color="black", symbol="x", size=9),
                                 name="baselines (exact)", legendgroup="base", showlegend=i == 1), 1, i)
        fig.add_hline(y=SPEEDUP_TARGET, line=dict(color="green", dash="dash"), row=1, col=i)
        fig.add_vline(x=PPL_BUDGET_PCT, line=dict(color="green", dash="dash"), row=1, col=i)
        fig.update_xaxes(title_text="perplexity increase % (measured)", row=1, col=i)
        fig.update_yaxes(title_text="TPOT speed-up over lru (modeled)" if i == 1 else None, rangemode="tozero",
                         row=1, col=i)
    fig.update_layout(height=480, width=460 * len(profs), legend=dict(orientation="h", y=-0.2),
                      margin=dict(t=40, l=60, r=20, b=90))
    written = []
    html = out.with_suffix(".html")
    fig.write_html(str(html), include_plotlyjs="cdn", full_html=True)
    written.append(html.name)
    try:
        fig.write_image(str(out.with_suffix(".png")), scale=1)
        written.append(out.with_suffix(".png").name)
    except Exception as e:  # noqa: BLE001 - kaleido missing, or it cannot find/launch a browser offline
        msg = (str(e).splitlines() or [repr(e)])[0][:160]
        written.append(f"no PNG (kaleido could not render it here: {type(e).__name__}: {msg})")
    return written


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=bench_args.model, default=str(ROOT / "assets" / "spice-mini"))
    ap.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"),
                    help="weights' dtype here (float32 runs faster on CPUs; TPOT is modeled from --shape anyway)")
    ap.add_argument("--shape", type=bench_args.one_of(shape_names(), "shape"), default="deepseek-v2-lite")
    ap.add_argument("--profiles", nargs="+", type=bench_args.one_of(profile_names(), "profile"),
                    default=["rtx4090-pcie4x16", "rtx5090-pcie4x8", "h200-pcie5x16"])
    ap.add_argument("--cache-frac", type=ca.float_in(*SETTING_RANGES["cache_frac"]), default=0.25)
    ap.add_argument("--taus", nargs="+", type=ca.float_in(*SETTING_RANGES["tau_approx"]),
                    default=[0.0, 0.02, 0.05, 0.1, 0.2], help="tau_approx values (the engine's range)")
    ap.add_argument("--ranks", nargs="+", type=ca.positive_int, default=[16, 32])
    ap.add_argument("--extra-ranks", nargs="*", type=ca.positive_int, default=[],
                    help="more LoRE ranks, CPU lane on only (e.g. 1: on 24-wide experts, what rank ~59 is on "
                         "DeepSeek-V2-Lite's 1408-wide ones)")
    ap.add_argument("--prompts", type=ca.positive_int, default=8)
    ap.add_argument("--max-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=64)
    ap.add_argument("--quality-tokens", type=ca.int_in(2), default=512,
                    help="teacher-forced held-out tokens per setting")
    ap.add_argument("--window", type=ca.int_in(2), default=128)
    ap.add_argument("--tau-prefetch", type=ca.float_in(*SETTING_RANGES["tau_prefetch"]), default=0.2)
    ap.add_argument("--max-lookahead", type=ca.int_in(*SETTING_RANGES["max_lookahead"]), default=4)
    ap.add_argument("--fit-lore", action="store_true", help="fit LoRE here when the model has none beside it")
    ap.add_argument("--fit-tokens", type=ca.int_in(MIN_CALIBRATION_TOKENS), default=8192)
    ap.add_argument("--fit-rank", type=ca.positive_int, default=16)
    ap.add_argument("--lore-ranks", nargs="+", type=ca.positive_int, default=[8, 16, 32, 64])
    ap.add_argument("--lore-tokens", type=ca.int_in(MIN_CALIBRATION_TOKENS), default=8192,
                    help="held-out tokens for the LoRE error table")
    ap.add_argument("--jobs", type=ca.positive_int, default=2,
                    help="profiles run in parallel, one process (1 thread) each")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "speed-quality")
    ap.add_argument("--from-json", type=ca.existing_file, default=None,
                    help="rewrite the report and plot from a saved run")
    args = vars(ap.parse_args(argv))
    # <out>.json, <out>.results.md, <out>.html beside one another: their folder must take them before the run
    bench_args.check_out_dir(ap, args["out"].parent, "--out")
    if args["from_json"] is not None:
        saved = _saved_run(ap, args["from_json"])
        args.update(saved["args"])
        args["out"].parent.mkdir(parents=True, exist_ok=True)
        try:
            return _report(saved["results"], args, saved["argv"], args["out"])
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:     # a field missing or malformed
            ap.error(f"--from-json {args['from_json']}: a field the report needs is missing or malformed "
                     f"({type(e).__name__}: {e}): pass a JSON this benchmark wrote")
    args["ranks"] = sorted(set(args["ranks"]))
    args["extra_ranks"] = sorted(set(args["extra_ranks"]))
    if args["jobs"] > 1 and len(args["profiles"]) > 1:
        import multiprocessing as mp
        with ProcessPoolExecutor(max_workers=min(args["jobs"], len(args["profiles"])),
                                 mp_context=mp.get_context("spawn")) as pool:
            results = list(pool.map(run_profile, [args] * len(args["profiles"]), args["profiles"]))
    else:
        results = [run_profile(args, p) for p in args["profiles"]]
    results[0]["lore_report"] = lore_report(args) if args["lore_ranks"] else None
    out: Path = args["out"]
    out.parent.mkdir(parents=True, exist_ok=True)
    argv_doc = [a if not a.startswith(str(ROOT)) else str(Path(a).relative_to(ROOT)) for a in argv]
    out.with_suffix(".json").write_text(json.dumps(
        {"argv": argv_doc, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in args.items()
                                    if k not in ("out", "model", "from_json")}, "results": results},
        indent=1, default=str) + "\n")
    return _report(results, args, argv_doc, out)


def _saved_run(ap, path: Path) -> dict:
    """A run's JSON (``--from-json``): an object with the run's argv, args and results, else ``ap.error``."""
    from spice_core.user_files import read_json

    try:
        saved = read_json(path, "--from-json")
    except SpiceError as e:
        ap.error(str(e))
    kinds = {"argv": list, "args": dict, "results": list}
    bad = [k for k, kind in kinds.items() if not isinstance(saved.get(k), kind)]
    if bad or not saved["results"]:
        ap.error(f"--from-json {path}: {'no ' + repr(bad[0]) + ' of the right kind' if bad else 'no results'}: "
                 "pass the <out>.json this benchmark wrote")
    return saved


def _report(results, args, argv_doc, out: Path) -> int:
    md = markdown(results, args, argv_doc)
    written = plot(results, args, out)
    md += "\nPlot: " + ", ".join(written) + "\n"
    out.with_suffix(".results.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
