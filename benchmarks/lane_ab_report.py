"""Tables for an A/B of two CPU-lane shapes (docs/benchmarks/cpu-lane/auto-lane/): per run folder, each lane policy's
TPOT in both arms and the lane profile's wall per layer batch, read from the files (nothing typed in).

    python benchmarks/lane_ab_report.py docs/benchmarks/cpu-lane/auto-lane/run1-h100 docs/benchmarks/cpu-lane/auto-lane/run2-h100
    python benchmarks/lane_ab_report.py --ratios docs/benchmarks/cpu-lane/auto-lane/ratios-h100/results.partial.json
    python benchmarks/lane_ab_report.py docs/benchmarks/cpu-lane/auto-lane/gate-h100      # a lane profile alone

A run folder holds ``auto/results.json`` and ``fixed-1x0/results.json`` (bench's records, one arm each, the same config
on the same machine one after the other) and ``lane-profile.json`` (benchmarks/cpu_lane_profile.py); a folder
without the arms gets the profile's table alone.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_lane_profile import profile_side_speedup  # noqa: E402

ARMS = ("auto", "fixed-1x0")
LANE_POLICIES = ("cpu_compute", "spice_no_lore", "spice")


def _records(path: Path) -> dict[str, dict]:
    data = json.loads(path.read_text())
    recs = data if isinstance(data, list) else data["records"]
    return {r["policy"]: r for r in recs}


def tpot_table(run: Path) -> str:
    arms = {arm: _records(run / arm / "results.json") for arm in ARMS}
    lines = ["| policy | workload | auto: TPOT median ms [95% CI] | 1x0: TPOT median ms [95% CI] | auto / 1x0 | "
             "host µs per MoE layer, auto / 1x0 | lane experts, auto / 1x0 | greedy agreement, auto / 1x0 |",
             "|---|---|---|---|---|---|---|---|"]
    for pol in LANE_POLICIES:
        a, b = arms["auto"].get(pol), arms["fixed-1x0"].get(pol)
        if a is None or b is None:
            continue
        ci = lambda r: "[{:.2f}, {:.2f}]".format(*r["tpot_ms_median_ci95"])   # noqa: E731
        cpu = lambda r: r["miss_split"]["cpu"]   # noqa: E731
        lines.append(f"| {pol} | {a['n_runs']} prompts, {a['n_decode_tokens']} decode steps | "
                     f"{a['tpot_ms_median']:.2f} {ci(a)} | {b['tpot_ms_median']:.2f} {ci(b)} | "
                     f"{a['tpot_ms_median'] / b['tpot_ms_median']:.2f} | {a['host_us_per_layer']:.0f} / "
                     f"{b['host_us_per_layer']:.0f} | {cpu(a)} / {cpu(b)} | {a['greedy_agreement']:.3f} / "
                     f"{b['greedy_agreement']:.3f} |")
    return "\n".join(lines)


def profile_table(run: Path) -> str:
    d = json.loads((run / "lane-profile.json").read_text())
    rows = [r for r in d["lane"] if r["driver_busy_ms"] == 0]
    one = {r["experts"]: r for r in rows if r["workers"] == 1}
    auto = {r["experts"]: r for r in rows if r["workers"] == "auto"}
    k15 = max(d["kernel"], key=lambda k: k["threads"])
    speedup = profile_side_speedup(d)
    lines = [f"Kernel alone at {k15['threads']} threads: {k15['ms_per_expert']:.3f} ms an expert "
             f"({k15['gbps']:.1f} GB/s of {d['expert_mb']:.1f} MB). The auto lane's side_speedup (median 1x15 / auto "
             f"wall at 3-6 experts, the profiles' cpu_side_speedup): "
             f"{'–' if speedup is None else f'{speedup:.2f}'}.", "",
             "| experts a layer | 1x15: wall ms (GB/s) | auto: wall ms (GB/s) | auto / 1x15 |", "|---|---|---|---|"]
    for n in sorted(set(one) & set(auto)):
        a, b = auto[n], one[n]
        lines.append(f"| {n} | {b['wall_ms']:.2f} ({b['gbps']:.1f}) | {a['wall_ms']:.2f} ({a['gbps']:.1f}) | "
                     f"{a['wall_ms'] / b['wall_ms']:.2f} |")
    return "\n".join(lines)


def ratio_table(path: Path) -> str:
    """Every policy of one bench run beside `on_demand` and `lru` of the same run (issue 22's x8 ratios)."""
    recs = _records(path)
    base = {b: recs[b]["tpot_ms_median"] for b in ("on_demand", "lru") if b in recs}
    lines = ["| policy | prompts, decode steps | TPOT median ms [95% CI] | × on_demand | × lru | miss split approx/cpu/copy "
             "| lane ms per job (GB/s) | lane busy ms per expert (GB/s) | host µs per MoE layer "
             "| greedy agreement with resident |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for pol, r in recs.items():
        t, ms = r["tpot_ms_median"], r["miss_split"]
        ratio = lambda b: f"{base[b] / t:.2f}" if b in base else "–"   # noqa: E731
        lane = f"{r['cpu_lane_ms_per_expert']:.3f} ({r['cpu_lane_gbps']:.1f})" if r.get("cpu_lane_ms_per_expert") else "–"
        busy = f"{r['cpu_lane_busy_ms_per_expert']:.3f} ({r['cpu_lane_busy_gbps']:.1f})" \
            if r.get("cpu_lane_busy_ms_per_expert") else "–"       # runs before the busy wall was recorded: none
        lines.append(f"| {pol} | {r['n_runs']}, {r['n_decode_tokens']} | {t:.2f} "
                     "[{:.2f}, {:.2f}] | ".format(*r["tpot_ms_median_ci95"]) +
                     f"{ratio('on_demand')} | {ratio('lru')} | {ms['approx']}/{ms['cpu']}/{ms['copy']} | {lane} | {busy} | "
                     f"{r.get('host_us_per_layer') or 0:.0f} | {r['greedy_agreement']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = list(argv if argv is not None else sys.argv[1:])
    try:
        if args[:1] == ["--ratios"] and len(args) == 2:
            print(ratio_table(Path(args[1])))
            return 0
        runs = [Path(p) for p in args]
        if not runs:
            print(__doc__, file=sys.stderr)
            return 2
        for run in runs:
            # a folder with a lane profile and no A/B arms (a profile run of its own): the profile table alone
            tpot = f"{tpot_table(run)}\n\n" if (run / ARMS[0]).is_dir() else ""
            print(f"### {run.name}\n\n{tpot}{profile_table(run)}\n")
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"error: {err!r} reading {' '.join(args)}: give run folders holding auto/results.json, "
              "fixed-1x0/results.json and lane-profile.json, or --ratios and one bench results file", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
