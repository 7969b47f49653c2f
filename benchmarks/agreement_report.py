"""spice's speed against its quality across thresholds: markdown tables from bench records and CPU quality runs.

    python benchmarks/agreement_report.py --records docs/benchmarks/cpu-lane/agreement/native/results.partial.json \
        [--quality docs/benchmarks/cpu-lane/agreement/quality-cpu/*.json] [--target-agreement 0.9]

One table per link. A row per `spice` (and `spice_no_lore`) record, one per bench run variant (τ_approx, τ_prefetch,
lookahead, lane offer): its TPOT against the `on_demand` and `lru` records given, GB copied per token, miss split,
greedy agreement with `resident` (measured on the GPU; on the CPU for a modeled bench run) with a bootstrap interval
over prompts, and, where a CPU quality run (`benchmarks/headline_quality.py`) has the same τ_approx, τ_prefetch and
lookahead, that run's perplexity change, greedy agreement, teacher-forced top-1 agreement and the token where each
prompt's text first diverged (one early near-tie flip costs a prompt most of its positional agreement). A setting
measured twice keeps the record over more prompts (a run cut short by its time limit leaves a shorter one). Then
the fastest setting over the full prompts whose agreement reaches the target, or a line saying none did. Every
number comes from the files named; computed here are only ratios and the bootstrap intervals.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))        # bench_args, when imported from elsewhere

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.errors import ConfigError  # noqa: E402
from spice_core.tools.bench_config import load_results, read_json  # noqa: E402


def _load_records(path: Path) -> list[dict]:
    """A bench results.json's records, checked (a ConfigError that names the file otherwise)."""
    return load_results(path, "--records")


def _setting(rec: dict) -> tuple:
    s = rec.get("settings") or {}
    return (round(float(s.get("tau_approx", 0.0)), 4), round(float(s.get("tau_prefetch", 0.0)), 4),
            int(s.get("max_lookahead", 0)))


def _quality_rows(paths: list[Path]) -> dict[tuple, dict]:
    """(tau_approx, tau_prefetch, max_lookahead, link, budget) -> the CPU quality row of that setting."""
    out = {}
    for p in paths:
        q = read_json(p, "--quality", dict, limit_bytes=10_000_000)
        st = q.get("settings") or {}
        for row in q.get("rows", []):
            key = (round(float(st.get("tau_approx", row.get("tau_approx", 0.0))), 4),
                   round(float(st.get("tau_prefetch", 0.0)), 4), int(st.get("max_lookahead", 0)),
                   row.get("link"), round(float(row.get("budget_frac", 0.0)), 4))
            out[key] = row
    return out


def agreement_ci(per_prompt: list[float], n_resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of the mean greedy agreement over prompts (resampling whole prompts: one
    early flip moves a prompt's agreement a lot, so the prompts, not the tokens, are the independent samples)."""
    if len(per_prompt) < 2:
        return None
    rng = np.random.default_rng(seed)
    a = np.asarray(per_prompt, dtype=float)
    means = a[rng.integers(0, len(a), size=(n_resamples, len(a)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def _divergence(q: dict | None) -> str:
    """The token at which each prompt's greedy text first left the exact one ("·": never), from a CPU quality row."""
    firsts = (q or {}).get("first_divergence")
    if not firsts:
        return "–"
    return " ".join("·" if f is None else str(f) for f in firsts)


def _ci(rec: dict) -> str:
    ci = agreement_ci(((rec.get("raw") or {}).get("agreements")) or [])
    return "" if ci is None else f" [{ci[0]:.2f}, {ci[1]:.2f}]"


def _fmt(x, spec: str = ".2f", none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _complete(records: list[dict]) -> list[dict]:
    """Each (policy, variant, link, budget) once: the record over the most prompts (a run cut short by its time limit
    leaves a row of fewer prompts, which a later run of the same setting replaces)."""
    best: dict[tuple, dict] = {}
    for r in records:
        key = (r.get("policy"), r.get("variant", ""), r.get("link"), r.get("budget_frac"))
        if key not in best or r.get("n_runs", 0) > best[key].get("n_runs", 0):
            best[key] = r
    return list(best.values())


def report(records: list[dict], quality: dict[tuple, dict], target: float) -> str:
    """One section per link: the table, then the fastest setting reaching ``target`` among the rows over as many
    prompts as the link's most (a row over fewer prompts is shown, never picked)."""
    records = _complete(records)
    rows = [r for r in records if r.get("policy") in ("spice", "spice_no_lore")]
    if not rows:
        raise SystemExit("no spice or spice_no_lore record in the files given")
    out = []
    for link in sorted({r.get("link") for r in rows}, key=str):
        out += _section(link, [r for r in records if r.get("link") == link], quality, target)
    return "\n".join(out) + "\n"


def _section(link: str, records: list[dict], quality: dict[tuple, dict], target: float) -> list[str]:
    base = {r["policy"]: r for r in records
            if r.get("policy") in ("on_demand", "lru") and r.get("variant", "") in ("", "headline")}
    rows = [r for r in records if r.get("policy") in ("spice", "spice_no_lore")]
    timing = "/".join(sorted({str(r.get("timing")) for r in rows}))
    full = max(r.get("n_runs", 0) for r in rows)
    lines = ["| policy (variant) | τ_approx | τ_prefetch | lookahead | prompts | TPOT median ms [95% CI] | "
             "× on_demand | × lru | GB / token | hit rate | miss split approx/cpu/copy | "
             "greedy agreement [95% CI over prompts] | "
             "identical prefix, median tokens | CPU: ppl Δ % | CPU: greedy agreement | "
             "CPU: teacher-forced top-1 agreement | CPU: first divergence per prompt |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    met = []
    od, lru = base.get("on_demand"), base.get("lru")
    for r in sorted(rows, key=lambda r: r["tpot_ms_median"]):
        ta, tp, la = _setting(r)
        q = quality.get((ta, tp, la, r.get("link"), round(float(r.get("budget_frac", 0.0)), 4)))
        if r["policy"] == "spice_no_lore":
            q = None
        ms, ci = r["tpot_ms_median"], r.get("tpot_ms_median_ci95") or [None, None]
        split = r.get("miss_split") or {}
        agree, n = r.get("greedy_agreement"), r.get("n_runs", 0)
        label = r["policy"] + (f" ({r['variant']})" if r.get("variant") else "")
        lines.append(
            f"| {label} | {ta:g} | {tp:g} | {la} | {n}{'' if n == full else ' (cut short)'} | "
            f"{ms:.2f} [{_fmt(ci[0])}, {_fmt(ci[1])}] | "
            f"{_fmt(od['tpot_ms_median'] / ms if od else None)} | "
            f"{_fmt(lru['tpot_ms_median'] / ms if lru else None)} | "
            f"{r.get('bytes_per_token', 0) / 1e9:.2f} | {_fmt(r.get('hit_rate'))} | "
            f"{split.get('approx', 0)}/{split.get('cpu', 0)}/{split.get('copy', 0)} | {_fmt(agree, '.3f')}{_ci(r)} | "
            f"{_fmt(r.get('identical_prefix_tokens_median'), 'g')} | "
            f"{_fmt(q.get('ppl_delta_pct') if q else None, '+.2f')} | "
            f"{_fmt(q.get('greedy_agreement') if q else None, '.3f')} | "
            f"{_fmt(q.get('top1_agreement') if q else None, '.3f')} | {_divergence(q)} |")
        if r["policy"] == "spice" and n == full and agree is not None and agree >= target - 1e-9:
            met.append(r)
    out = [f"### Link {link} (timing {timing})", "",
           f"Baselines from the same records: on_demand {_fmt(od['tpot_ms_median'] if od else None)} ms, "
           f"lru {_fmt(lru['tpot_ms_median'] if lru else None)} ms.", "", *lines, ""]
    if met:
        best = min(met, key=lambda r: r["tpot_ms_median"])
        ta, tp, la = _setting(best)
        out.append(f"Fastest `spice` setting with greedy agreement ≥ {target:g} ({link}): τ_approx {ta:g}, "
                   f"τ_prefetch {tp:g}, "
                   f"lookahead {la} ({best.get('variant') or 'default'}): {best['tpot_ms_median']:.2f} ms"
                   + (f", {od['tpot_ms_median'] / best['tpot_ms_median']:.2f}× on_demand" if od else "")
                   + f", agreement {best['greedy_agreement']:.3f}{_ci(best)}.")
    else:
        out.append(f"No `spice` setting reached greedy agreement ≥ {target:g} ({link}).")
    return out + [""]


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=Path, nargs="+", required=True, help="bench results.json files")
    ap.add_argument("--quality", type=Path, nargs="*", default=[], help="headline_quality.py outputs (CPU)")
    ap.add_argument("--target-agreement", type=ca.fraction, default=0.9,
                    help="the greedy agreement a setting must reach, in [0, 1]")
    args = ap.parse_args(argv)
    for p in [*args.records, *args.quality]:
        if not p.is_file():
            print(f"{p}: no such file", file=sys.stderr)
            return 2
    try:
        records = [r for p in args.records for r in _load_records(p)]
        quality = _quality_rows(args.quality)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(report(records, quality, args.target_agreement), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
