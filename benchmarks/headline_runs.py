"""Which shards are parts of one run: bench's config digest, less the keys that only choose outputs.

bench stamps every record with a digest of its config without the run blocks (`bench_records.provenance`), and
`merge_records` merges only records of one digest. Two slices of one cell whose configs differ only in what they
write beside the measurement (``export_traces``, ``export_trace_prompts``: traces are written from a prompt's finished
record, after its run) measured the same thing, yet carry different digests. For every committed ``config-*.json``
this recomputes bench's digest and the digest without those keys; records whose configs agree on the second merge as
one run. A digest that no committed config reproduces is left as it is (its shards merge only with their own).

The GPU a shard ran on is read from the ``env.txt`` beside its results (`shard_gpu`): shards of one config merge only
when they ran on one kind of GPU (`refuse_mixed_gpus`), and the report names each cell's.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

from spice_core.tools.bench_config import load_config_file
from spice_core.tools.bench_records import provenance

OUTPUT_KEYS = ("export_traces", "export_trace_prompts")   # what a config writes, not what it measures


def _digest(cfg: dict) -> str:
    return provenance(dict(cfg, hw_profile=cfg.get("hw_profile")), [], "")["config"]


def run_digests(d: Path) -> dict[str, str]:
    """bench's config digest → the digest of the same config without `OUTPUT_KEYS`, for every committed config
    in ``d``, as bench computes it (no --hw-profile given on the command line)."""
    out = {}
    for path in sorted(d.glob("config-*.json")):
        cfg = load_config_file(path)
        out[_digest(cfg)] = _digest({k: v for k, v in cfg.items() if k not in OUTPUT_KEYS})
    return out


def join_output_variants(records: list[dict], digests: dict[str, str]) -> dict[str, set[str]]:
    """In place, before the merge: where committed configs differ only in `OUTPUT_KEYS`, their records' config
    digest becomes the output-free one they share. Returns output-free digest → the digests its records ran under."""
    twins: dict[str, set[str]] = {}
    for full, free in digests.items():
        twins.setdefault(free, set()).add(full)
    joined: dict[str, set[str]] = {}
    for r in records:
        prov = r.get("provenance") or {}
        free = digests.get(prov.get("config"))
        if free is not None and len(twins[free]) > 1:
            joined.setdefault(free, set()).add(prov["config"])
            r["provenance"] = dict(prov, config=free)
    return joined


def note_configs(joined: dict[str, set[str]], merged: list[dict]) -> None:
    """After the merge: each merged record names the config digests its shards ran under, where they differ."""
    for m in merged:
        ran = joined.get((m.get("provenance") or {}).get("config"))
        if ran and len(ran) > 1:
            m["provenance"] = dict(m["provenance"], configs_as_run=sorted(ran))


# Every shard the headline ran before its folders kept an env.txt ran on one H200 (the README of each round says so).
GPU_BEFORE_ENV_FILES = "H200"


def shard_gpu(folder: Path) -> str:
    """The GPU a shard ran on ("H100", "H200"), from the nvidia-smi line of its ``env.txt``."""
    env = folder / "env.txt"
    found = re.search(r"NVIDIA ([A-Z]\d+)", env.read_text()) if env.exists() else None
    return found.group(1) if found else GPU_BEFORE_ENV_FILES


def refuse_mixed_gpus(runs: dict[str, list[dict]]) -> None:
    """Raise ValueError when the shards of one run (``runs``: config digest -> records, each with its ``gpu``) ran on
    different GPUs: their steps would merge into one median of two machines."""
    for config, records in runs.items():
        gpus = sorted({r.get("gpu") or GPU_BEFORE_ENV_FILES for r in records})
        if len(gpus) > 1:
            raise ValueError(f"the shards of config {config} ran on {' and '.join(gpus)}: merge only shards of one "
                             "kind of GPU (run the cell's remaining shards on the GPU its first ones ran on)")
