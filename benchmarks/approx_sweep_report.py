"""How far approximating more misses with LoRE goes toward 3.12x over on_demand (modeled speed, measured quality).

    python benchmarks/approx_sweep_report.py [--dir docs/benchmarks/full-scale/approx-sweep]

Reads, for each tau_approx: the modeled bench of `spice` and `on_demand` (``modeled-tau<T>/results.json``;
tau 0.05 is the headline's own modeled run, ``../headline/modeled/results.json``) and the quality of the
same setting on the miniature (``quality-tau<T>.json``; tau 0.05: ``../headline/quality.json``), and writes
``README.md`` with one row per link and tau. Speeds are modeled (the timing model's fast-path profile at
DeepSeek-V2-Lite's shape: within 15% of measured for 11 of 12 policies, `spice` native 18% fast);
quality is measured (teacher-forced perplexity on held-out text).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TAUS = ("0.05", "0.10", "0.20")
TARGET_RATIO = 3.12
PPL_BAR_PCT = 1.0


def _load(d: Path, tau: str) -> tuple[list, dict] | None:
    bench = d / f"modeled-tau{tau}" / "results.json"
    quality = d / f"quality-tau{tau}.json"
    if tau == "0.05":
        bench, quality = d.parent / "headline" / "modeled" / "results.json", d.parent / "headline" / "quality.json"
    if not quality.exists():
        return None
    return (json.loads(bench.read_text()) if bench.exists() else []), json.loads(quality.read_text())


def rows(d: Path) -> list[dict]:
    out = []
    for tau in TAUS:
        got = _load(d, tau)
        if got is None:
            continue
        records, quality = got
        for link in ("native", "pcie4x8"):
            by = {r["policy"]: r for r in records if r["link"] == link and r["budget_frac"] == 0.25
                  and r["workload"] == "prompts"}
            q = next((x for x in quality["rows"] if x["link"] == link and x["budget_frac"] == 0.25), None)
            if q is None:
                continue
            row = {"tau": tau, "link": link, "ppl_delta_pct": q["ppl_delta_pct"], "approx_share": q["approx_share"],
                   "greedy_agreement": q["greedy_agreement"], "spice_ms": None}
            out.append(row)
            if "spice" not in by or "on_demand" not in by:
                continue              # quality only: its speed was not modeled
            s = by["spice"]
            row.update({"spice_ms": s["tpot_ms_median"], "on_demand_ms": by["on_demand"]["tpot_ms_median"],
                        "ratio": by["on_demand"]["tpot_ms_median"] / s["tpot_ms_median"],
                        "bytes_vs_on_demand": s["bytes_per_token"] / by["on_demand"]["bytes_per_token"]})
    return out


def render(table: list[dict]) -> str:
    lines = ["| link | τ_approx | spice ms (modeled) | on_demand ms (modeled) | ratio (target 3.12×) | bytes vs on_demand "
             "| perplexity Δ (measured, bar 1%) | selections approximated | greedy agreement |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(table, key=lambda r: (r["link"] != "native", r["tau"])):
        ok_ppl = "within" if r["ppl_delta_pct"] <= PPL_BAR_PCT else "**over**"
        if r["spice_ms"] is None:
            speed = "not modeled | | | "
        else:
            ok_ratio = "met" if r["ratio"] >= TARGET_RATIO else "missed"
            speed = (f"{r['spice_ms']:.1f} | {r['on_demand_ms']:.1f} | {r['ratio']:.2f}× ({ok_ratio}) | "
                     f"{r['bytes_vs_on_demand']:.1%}")
        lines.append(f"| {r['link']} | {r['tau']} | {speed} | {r['ppl_delta_pct']:+.2f}% ({ok_ppl}) | "
                     f"{r['approx_share']:.0%} | {r['greedy_agreement']:.3f} |")
    return "\n".join(lines)


def conclusion(table: list[dict]) -> str:
    out = []
    for link in ("native", "pcie4x8"):
        ok = [r for r in table if r["link"] == link and r["spice_ms"] is not None and r["ppl_delta_pct"] <= PPL_BAR_PCT]
        if not ok:
            continue
        best = max(ok, key=lambda r: r["ratio"])
        verdict = "reaches" if best["ratio"] >= TARGET_RATIO else "does not reach"
        out.append(f"- **{link}:** the fastest setting within the 1% perplexity bar is τ_approx {best['tau']}, modeled at "
                   f"{best['ratio']:.2f}× over `on_demand` ({best['ppl_delta_pct']:+.2f}% perplexity): it {verdict} 3.12×.")
    return "\n".join(out) + """
- The modeled `spice` time is optimistic on the native link (18% below measured in the headline's model
  check: the LoRE branch is not charged), so a measured ratio there would be lower still. A τ_approx
  where perplexity crosses 1% stands in for more than half of all routed selections (the quality rows
  above), so LoRE alone cannot buy the rest: 3.12× needs the CPU lane on the fast path (exact misses
  computed beside the GPU) or fewer wasted prefetches."""


HEADER = """# How far LoRE goes toward 3.12×: a τ_approx sweep (speed modeled, quality measured)

The headline run's `spice` (τ_approx 0.05, LoRE rank 4, no CPU lane on the fast path) is 2.12× (native)
and 2.43× (x8) faster than `on_demand`, measured; the target is 3.12× at ≤ 1% perplexity. Approximating
more misses (a higher τ_approx: a routed selection whose gate weight is below it and whose expert is not
on the GPU is computed by the shared expert plus its LoRE surrogate instead of being copied) copies
fewer bytes at a quality cost. This sweep measures that trade-off without a GPU:

- **Speed, modeled:** `bench` on the shipped miniature with the fast path's decision profile
  (`h200-pcie5x16-graphed`) at DeepSeek-V2-Lite's shape, 25% budget, both links, the headline's first 3
  held-out prompts × 64 tokens. τ_approx 0.05 is the headline's own modeled run
  (`../headline/modeled/`). "Bytes vs on_demand": bytes copied per token as a share of `on_demand`'s
  (which copies every routed selection).
- **Quality, measured:** `benchmarks/headline_quality.py` on the miniature at the same settings:
  teacher-forced perplexity change and greedy agreement against the exact model on the evaluation half
  of the held-out set (τ_approx 0.05: `../headline/quality.json`).

Generated by `benchmarks/approx_sweep_report.py` from the files beside it."""

COMMANDS = """## Commands

```bash
python -m spice_core bench --config docs/benchmarks/full-scale/approx-sweep/config-tau0.10.json \\
    --out docs/benchmarks/full-scale/approx-sweep/modeled-tau0.10
for t in 0.10 0.20; do
  python benchmarks/headline_quality.py --tau-approx $t --cases native:0.25 pcie4x8:0.25 \\
      --out docs/benchmarks/full-scale/approx-sweep/quality-tau$t.json
done
python benchmarks/approx_sweep_report.py
```

τ_approx 0.20 was not modeled for speed: its perplexity is already over the bar.
"""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("docs/benchmarks/full-scale/approx-sweep"))
    args = ap.parse_args(argv)
    table = rows(args.dir)
    if not table:
        print(f"error: no sweep results under {args.dir}: run the commands in its README first", file=sys.stderr)
        return 2
    (args.dir / "README.md").write_text(HEADER + "\n\n" + render(table) + "\n\n" + conclusion(table) + "\n\n" + COMMANDS)
    print(render(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
