"""`bench --merge`: shards of one run (each a bench --out folder) combined into one results.json, exactly.

    --merge A B ... --out M ─► each folder's results.json (or the results.partial.json of a run cut short)
      ─► load_results (checked) ─► merge_records (bench_records.py: medians over the union of steps, provenance
         checked) ─► M/results.json, M/results.md
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from spice_core.errors import ConfigError
from spice_core.tools.bench_config import load_results
from spice_core.tools.bench_records import markdown_table, merge_records, missing_shards


def merge_folders(dirs: list[Path], out: Path) -> list[dict]:
    """The records of ``dirs`` (shards of one run, each a bench --out folder) merged into ``out``'s results.json and
    results.md, exactly (`merge_records`); refuses a folder that is ``out``, one given twice, one with no results, and
    one whose results.json an interrupted later run left beside its results.partial.json."""
    records, sources = [], []
    seen: dict[Path, Path] = {}
    for d in dirs:
        if d.resolve() == out.resolve():
            raise ConfigError(f"--out {out} is one of the --merge folders: write the merge to a folder of its own "
                              "(it would replace that shard's results)")
        path, partial = d / "results.json", d / "results.partial.json"
        if path.is_file() and partial.is_file():
            _check_same_run(d, path, partial)
        if not path.is_file():
            path = partial
        if not path.is_file():
            raise ConfigError(f"--merge {d}: no results.json or results.partial.json there: run the shard first")
        real = path.resolve()
        if real in seen:
            raise ConfigError(f"--merge {d}: given twice (as {seen[real].parent} too): give each shard once")
        seen[real] = path
        shard = load_results(path, "--merge")
        records += shard
        sources += [str(path)] * len(shard)
    merged = merge_records(records, sources)
    missing = missing_shards(records)
    if missing:
        print(f"note: shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} not given: the merged records hold "
              "only the prompts of the shards given", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(merged, indent=1, default=float))
    timing = merged[0]["timing"] if merged else "measured"
    (out / "results.md").write_text(markdown_table(merged, {"timing": timing}))
    return merged


def _runs_of(path: Path) -> set[str]:
    """The provenances (config, prompts, code digests) of a results file's records, as comparable strings."""
    return {json.dumps(r.get("provenance"), sort_keys=True) for r in load_results(path, "--merge")}


def _check_same_run(d: Path, done: Path, partial: Path) -> None:
    """A results.partial.json beside a results.json: what a run leaves if it stops between writing the one and
    removing the other (the same run: results.json stands), or what a later run into the folder left when it was
    cut short. Then results.json is an older run's, of another config or code: refused rather than merged unsaid."""
    try:
        later = _runs_of(partial)
    except ConfigError:
        later = {"unreadable"}
    if not later <= _runs_of(done):
        raise ConfigError(f"--merge {d}: its results.partial.json is from another run than its results.json (another "
                          "config, prompts or code): a later run into that folder was cut short. Move the one you do "
                          "not mean out of the folder, then merge again")

