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


class CheckError(Exception):
    """Input this check cannot use; main prints it as one line and exits 2."""


def _load(paths: list[str], timing: str, flag: str, model: str | None = None) -> dict[tuple, dict]:
    """The ``timing`` records of bench's results files ``paths`` (records of the other timing are left out; a file
    with none of this side's is refused), by (link, budget, policy, workload)."""
    out = {}
    for p in paths:
        try:
            records = json.loads(Path(p).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else "not JSON"
            raise CheckError(f"{flag} {p}: cannot be read ({reason}): give a bench results.json") from None
        if not isinstance(records, list) or not all(isinstance(r, dict) and "policy" in r for r in records):
            raise CheckError(f"{flag} {p}: not a bench results.json (a list of records with a policy each)")
        kept = 0
        for r in records:
            if r.get("tpot_ms_median") is None or r.get("peer") or (model is not None and r.get("model") != model):
                continue
            if r.get("timing", timing) != timing:
                continue
            out[(r["link"], float(r["budget_frac"]), r["policy"], r.get("workload", "prompts"))] = r
            kept += 1
        if not kept:
            raise CheckError(f"{flag} {p}: holds no {timing} record" + (f" of model {model}" if model else "")
                             + f": give the {timing} run's results.json")
    return out


def _base_model(record: dict) -> str | None:
    """The miniature a record ran, whatever its lift or folder prefix ("lift:assets/spice-mini" -> "spice-mini")."""
    model = record.get("model")
    return Path(model.removeprefix("lift:").rstrip("/")).name if isinstance(model, str) else None


def _check_same_workload(key: tuple, measured: dict, modeled: dict, label: str) -> None:
    a, b = _base_model(measured), _base_model(modeled)
    if a and b and a != b:
        raise CheckError(f"--modeled {label}: its {key[2]} record ran {modeled['model']} but the measured one "
                         f"{measured['model']}: model the measured run's own model")
    sa, sb = measured.get("settings"), modeled.get("settings")
    if isinstance(sa, dict) and isinstance(sb, dict) and sa != sb:
        raise CheckError(f"--modeled {label}: its {key[2]} record ran the thresholds {sb}, the measured one {sa}: "
                         "model the measured run's settings")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measured", nargs="+", required=True)
    ap.add_argument("--modeled", action="append", required=True, help="LABEL=results.json[,results.json...]")
    ap.add_argument("--target-pct", type=float, default=15.0)
    ap.add_argument("--measured-model", default=None,
                    help="only the measured records of this model (e.g. lift:spice-mini, where a results.json holds several)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        return _check(args)
    except CheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _check(args) -> int:
    measured = _load(args.measured, "measured", "--measured", args.measured_model)
    modeled = []
    for spec in args.modeled:
        label, eq, files = spec.partition("=")
        if not eq or not label or not files:
            raise CheckError(f"--modeled {spec!r}: use LABEL=results.json[,results.json...]")
        modeled.append((label, _load(files.split(","), "modeled", f"--modeled {label}=")))
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
            _check_same_workload(key, measured[key], r, lab)
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
