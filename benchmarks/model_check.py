"""Timing model against measurement: modeled TPOT per policy next to the measured one.

    python benchmarks/model_check.py --measured M1/results.json [M2/results.json ...] \
        --modeled "calibrate-hw profile=A/results.json,B/results.json" \
        --modeled "recalibrated=C/results.json,D/results.json" [--target-pct 15] [--out FILE.md]

Records are matched on (link, budget, policy, workload). The modeled runs must replay the
same workload (model routing, prompts, tokens, thresholds) with the timing model; see
docs/benchmarks/full-scale/ for the configs. Prints a markdown table: measured TPOT median,
each modeled TPOT and its error in percent, and whether it is within the target.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _load(paths: list[str], model: str | None = None) -> dict[tuple, dict]:
    out = {}
    for p in paths:
        for r in json.loads(Path(p).read_text()):
            if r.get("tpot_ms_median") is None or r.get("peer") or (model is not None and r.get("model") != model):
                continue
            out[(r["link"], float(r["budget_frac"]), r["policy"], r.get("workload", "prompts"))] = r
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", nargs="+", required=True)
    ap.add_argument("--modeled", action="append", required=True, help="LABEL=results.json[,results.json...]")
    ap.add_argument("--target-pct", type=float, default=15.0)
    ap.add_argument("--measured-model", default=None,
                    help="only the measured records of this model (e.g. lift:spice-mini, where a results.json holds several)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    measured = _load(args.measured, args.measured_model)
    modeled = []
    for spec in args.modeled:
        label, _, files = spec.partition("=")
        modeled.append((label, _load(files.split(","))))
    head = "| link | budget | policy | measured ms | " + " | ".join(f"{lab} ms | error" for lab, _ in modeled) + " |"
    lines = [head, "|" + "---|" * (4 + 2 * len(modeled))]
    within = {lab: [0, 0] for lab, _ in modeled}
    for key in sorted(measured, key=lambda k: (k[3], k[0], k[1], k[2])):
        link, budget, pol, workload = key
        if workload != "prompts" or not any(key in recs for _, recs in modeled):
            continue
        m = measured[key]["tpot_ms_median"]
        cells = []
        for lab, recs in modeled:
            r = recs.get(key)
            if r is None:
                cells += ["", ""]
                continue
            err = (r["tpot_ms_median"] - m) / m * 100
            ok = abs(err) <= args.target_pct
            within[lab][0] += ok
            within[lab][1] += 1
            cells += [f"{r['tpot_ms_median']:.1f}", f"{err:+.0f}%" + ("" if ok else " ✗")]
        lines.append(f"| {link} | {budget:.0%} | {pol} | {m:.1f} | " + " | ".join(cells) + " |")
    lines.append("")
    for lab, (ok, n) in within.items():
        lines.append(f"- {lab}: {ok} of {n} policies within ±{args.target_pct:.0f}% of measured")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
