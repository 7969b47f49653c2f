"""Run-to-run spread: a shard run twice, its second run beside its first.

``DIR/repeats/<shard>/`` is a second run of ``DIR/raw/<shard>/``'s configuration on the same prompts and engine code
(e.g. a machine taken back mid-run, the slice started again from its first prompt). Repeats are never merged into
the results (they would count the same prompts twice); this table shows how far the same cell moves between two
runs, so a reader can tell a difference between policies from noise.
"""
from __future__ import annotations

import json
from pathlib import Path

KEY_FIELDS = ("model", "link", "budget_frac", "workload", "variant", "policy")


def shard_records(folder: Path) -> list[dict]:
    """A shard's records: its results.json, or the results.partial.json of a run cut short."""
    for name in ("results.json", "results.partial.json"):
        if (folder / name).exists():
            return json.loads((folder / name).read_text())
    return []


def _key(r: dict) -> tuple:
    return tuple(r.get(f) for f in KEY_FIELDS)


def repeat_pairs(d: Path) -> list[tuple[str, dict, dict]]:
    """(shard, first run's record, repeat's record) for every record present in both runs of a shard, same
    prompts (the records' ``n_runs`` and prompt digest equal), same engine code."""
    pairs = []
    root = d / "repeats"
    if not root.is_dir():
        return pairs
    for rep_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        first = {_key(r): r for r in shard_records(d / "raw" / rep_dir.name)}
        for r in shard_records(rep_dir):
            a = first.get(_key(r))
            if a is None or a.get("n_runs") != r.get("n_runs") or a.get("provenance") != r.get("provenance"):
                continue
            pairs.append((rep_dir.name, a, r))
    return pairs


def repeats_table(d: Path) -> str | None:
    """The README's run-to-run table, or None where no shard ran twice."""
    pairs = repeat_pairs(d)
    if not pairs:
        return None
    rows = ["| shard | link | budget | policy | prompts | TPOT first → repeat (ms) | change "
            "| hit rate first → repeat |",
            "|---|---|---|---|---|---|---|---|"]
    for shard, a, b in pairs:
        ta, tb = a["tpot_ms_median"], b["tpot_ms_median"]
        hits = f"{a.get('hit_rate', 0):.3f} → {b.get('hit_rate', 0):.3f}"
        rows.append(f"| `{shard}` | {a['link']} | {a['budget_frac']:.0%} | `{a['policy']}` | {a.get('n_runs')} | "
                    f"{ta:.1f} → {tb:.1f} | {(tb - ta) / ta:+.1%} | {hits} |")
    def change(pair) -> float:
        return abs(pair[2]["tpot_ms_median"] - pair[1]["tpot_ms_median"]) / pair[1]["tpot_ms_median"]
    worst = max(pairs, key=change)
    return "\n".join(rows) + (f"\n\nLargest change between the two runs: `{worst[1]['policy']}`, {change(worst):.1%}; "
                              "differences between policies smaller than this are within run-to-run noise.")
