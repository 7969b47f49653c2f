"""`python -m spice_core calibrate`: build a model's SPICE artifacts beside it.

    model ─► routing traces (predictor/traces.py) ─► draft heads (predictor/draft.py)
                         │                       └─► LoRE factors (spice_core.lore.fit, when installed)
                         └─► expert popularity ─► spice-calibration.json
    ─► <out>/spice-draft.safetensors, spice-lore.safetensors, spice-calibration.json

Loads the model with the plain loader, not the engine, so stale artifacts (another model,
older shapes) never stop their own rebuild. Knows nothing of policies or timing.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import shutil
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import torch

from spice_core.tools import args as ca
from spice_core.errors import ConfigError
from spice_core.model.shipped import model_argument
from spice_core.tools.generate import MODEL_HELP
from spice_core.units import format_bytes
from spice_core.user_files import check_writable_dir, file_problem

log = logging.getLogger(__name__)

DEFAULT_LORE_MAX_RANK = 16


def add_cli(sub) -> None:
    p = sub.add_parser("calibrate", help="build draft heads, LoRE factors and routing statistics beside a model",
                       description="Trace the model's routing over a calibration text set, distil the draft "
                                   "heads, fit LoRE surrogates, and save the artifacts beside the model.")
    p.add_argument("--model", type=model_argument, default=None, help=MODEL_HELP)
    p.add_argument("--device", type=ca.device, default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--text", type=ca.utf8_text_file, default=None,
                   help="UTF-8 text file to calibrate on (documents separated by blank lines); default: the shipped "
                        "model's held-out split, or a built-in prompt set for other models")
    p.add_argument("--max-tokens", type=ca.int_in(256, 100_000_000), default=24_576, help="tokens of calibration text to trace (default 24576)")
    p.add_argument("--seq-len", type=ca.int_in(8, 1_000_000), default=256, help="tokens per traced row (default 256)")
    p.add_argument("--distances", type=int, default=8, help="draft heads per MoE layer: distances 1..D (default 8)")
    p.add_argument("--epochs", type=ca.int_in(1, 100_000), default=12, help="draft training epochs (default 12)")
    p.add_argument("--train-seconds", type=ca.positive_float, default=240.0,
                   help="stop draft training after this long, keeping the best epoch (default 240)")
    p.add_argument("--lore-max-rank", type=ca.positive_int, default=DEFAULT_LORE_MAX_RANK,
                   help=f"largest LoRE rank to fit (default {DEFAULT_LORE_MAX_RANK})")
    p.add_argument("--no-lore", action="store_true", help="skip LoRE fitting")
    p.add_argument("--lore-only", action="store_true",
                   help="keep the existing draft heads and only (re)fit LoRE beside them")
    p.add_argument("--out", type=ca.path, default=None, help="output folder (default: beside the model, where the "
                                                          "engine looks for them)")
    p.add_argument("--threads", type=ca.threads, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--seed", type=ca.seed, default=0)
    p.add_argument("--json", action="store_true", help="print the calibration report as JSON")
    p.set_defaults(func=run)


def calibrate_lore_only(model=None, *, device: str = "cpu", text: Path | None = None, max_tokens: int = 24_576,
                        seq_len: int = 256, lore_max_rank: int = DEFAULT_LORE_MAX_RANK, out: Path | None = None,
                        command: str = "") -> dict:
    """Fit LoRE beside draft heads that already exist (their calibration record is kept and
    extended): for adding LoRE to a model calibrated with --no-lore without retraining the draft."""
    from spice_core.model.loader import load_model
    from spice_core.predictor.artifacts import (CALIBRATION_FILE, DRAFT_FILE, LORE_FILE, calibrate_command_at,
                                                load_draft, model_fingerprint, read_calibration)
    from spice_core.predictor.traces import traces_for_model

    t0 = time.perf_counter()
    lm = load_model(model, device)
    _check_against_model(lm, seq_len, lore_max_rank)
    out = Path(out) if out is not None else Path(lm.path)
    rebuild = calibrate_command_at(lm, out)      # the whole set, where --lore-only looks for it
    cal_path = out / CALIBRATION_FILE
    if not (out / DRAFT_FILE).exists() or not cal_path.exists():
        raise ConfigError(f"--lore-only needs draft artifacts in {out}: run `{rebuild}` first (it fits both)")
    fp = model_fingerprint(lm)      # before the tracing: heads made for another model are refused now, not at use
    read_calibration(cal_path, lm, fp, rebuild)
    load_draft(out / DRAFT_FILE, lm, fp, rebuild)
    traces = traces_for_model(lm, text_file=text, max_tokens=max_tokens, seq_len=seq_len)
    with _staged(out) as stage:     # the new factors and the record replace the old ones together
        lore_report = _fit_lore(lm, traces, lore_max_rank, stage)
        lore_report["traces"] = {"source": traces.source, "tokens": traces.n_tokens, "seq_len": seq_len}
        lore_report["command"] = command
        cal = json.loads(cal_path.read_text())
        cal["lore"] = lore_report
        cal["files_bytes"] = {name: (d / name).stat().st_size for name, d in
                              ((DRAFT_FILE, out), (LORE_FILE, stage)) if (d / name).exists()}
        (stage / CALIBRATION_FILE).write_text(json.dumps(cal, indent=1))
    return {"lore": lore_report, "files_bytes": cal["files_bytes"], "total_s": round(time.perf_counter() - t0, 1),
            "folder": str(out), "beside_model": out.resolve() == Path(lm.path).resolve(), "kept": [DRAFT_FILE]}


def _check_args(args) -> None:
    from spice_core.predictor.draft import check_distances

    check_distances(args.distances)
    if args.max_tokens < 256:
        raise ConfigError(f"--max-tokens {args.max_tokens} is too small: use at least 256 (a few thousand is better)")
    if args.seq_len < 8:
        raise ConfigError(f"--seq-len {args.seq_len} is too small: use at least 8")
    if args.lore_max_rank < 1:
        raise ConfigError(f"--lore-max-rank {args.lore_max_rank} is out of range: use an integer >= 1")
    if args.epochs < 1:
        raise ConfigError(f"--epochs {args.epochs} is out of range: use an integer >= 1")
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads {args.threads} is out of range: use an integer >= 1")
    if args.text is not None and not Path(args.text).is_file():
        raise ConfigError(f"--text {args.text}: {file_problem(args.text)}: pass a UTF-8 text file")
    if args.lore_only and args.no_lore:
        raise ConfigError("--lore-only and --no-lore contradict each other: pass one of them")
    if args.out is not None:
        check_writable_dir(args.out, "--out")
    from spice_core.tools.generate import check_local_model
    check_local_model(args.model)


def _check_against_model(lm, seq_len: int, lore_max_rank: int | None) -> None:
    """What only the loaded model can bound, checked before the long tracing starts."""
    if seq_len > lm.max_context_tokens:
        raise ConfigError(f"--seq-len {seq_len} is longer than the model's context ({lm.max_context_tokens} tokens): "
                          f"use --seq-len <= {lm.max_context_tokens}")
    limit = min(lm.layout.intermediate, lm.layout.hidden)
    if lore_max_rank is not None and lore_max_rank > limit:
        raise ConfigError(f"--lore-max-rank {lore_max_rank} is above this model's expert width ({limit}): "
                          f"use --lore-max-rank <= {limit}")


def _umask() -> int:
    """This process's file-creation mask: read from /proc where it is there, else by setting it back at once (for
    an instant another thread's new file would get 022)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def _staged(out: Path):
    """A scratch folder inside ``out`` the artifacts are written to; when the block ends without an error (or a
    Ctrl-C) each replaces its namesake in ``out``, so an interrupted calibration leaves the old set whole, never old
    LoRE factors and a calibration record beside new draft heads. The scratch folder goes either way."""
    from spice_core.predictor.artifacts import CALIBRATION_FILE

    stage = out / f".spice-calibrate-{os.getpid()}.part"
    stage.mkdir(exist_ok=True)
    try:
        yield stage
        mode = 0o666 & ~_umask()        # as any new file: safetensors writes its files readable by the owner only
        for path in sorted(stage.iterdir(), key=lambda p: p.name == CALIBRATION_FILE):   # the record last
            path.chmod(mode)
            os.replace(path, out / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _fit_lore(lm, traces, max_rank: int, out: Path) -> dict:
    """LoRE factors via spice_core.lore (when this build has it), saved beside the draft."""
    try:
        from spice_core.lore.bank import save_lore_bank
        from spice_core.lore.fit import fit_lore_bank
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("spice_core.lore"):
            raise
        return {"skipped": "this build has no LoRE support (spice_core.lore)"}
    from spice_core.predictor.artifacts import LORE_FILE

    t0 = time.perf_counter()
    bank = fit_lore_bank(lm, traces.hidden_by_layer(), max_rank)
    save_lore_bank(bank, out / LORE_FILE)
    return {"file": LORE_FILE, "max_rank": max_rank, "fit_s": round(time.perf_counter() - t0, 1),
            **dict(getattr(bank, "info", {}) or {})}


def calibrate(model=None, *, device: str = "cpu", text: Path | None = None, max_tokens: int = 24_576,
              seq_len: int = 256, distances: int = 8, epochs: int = 12, train_seconds: float | None = 240.0,
              lore_max_rank: int = DEFAULT_LORE_MAX_RANK, lore: bool = True, out: Path | None = None,
              seed: int = 0, lm=None, command: str = "") -> dict:
    """Build and save the artifacts; returns the report written to spice-calibration.json."""
    from spice_core.model.loader import load_model
    from spice_core.predictor.artifacts import (CALIBRATION_FILE, DRAFT_FILE, LORE_FILE, model_fingerprint,
                                                save_draft, write_calibration)
    from spice_core.predictor.draft import DraftTrainConfig, train_draft
    from spice_core.predictor.traces import traces_for_model

    t0 = time.perf_counter()
    if lm is None:
        lm = load_model(model, device)
    _check_against_model(lm, seq_len, lore_max_rank if lore else None)
    out = Path(out) if out is not None else Path(lm.path)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create the folder ({e}): pass a writable folder") from e
    if not os.access(out, os.W_OK):
        raise ConfigError(f"--out {out}: the folder is not writable: pass a writable folder with --out")
    fp = model_fingerprint(lm)

    traces = traces_for_model(lm, text_file=text, max_tokens=max_tokens, seq_len=seq_len)
    t_traces = time.perf_counter() - t0
    cfg = DraftTrainConfig(distances=distances, epochs=epochs, seed=seed, time_budget_s=train_seconds)
    routers = [lm.moe_block(layer).gate.weight.detach() for layer in lm.moe_layers]
    torch.manual_seed(seed)
    draft, draft_report = train_draft(traces, cfg, init_routers=routers, device=lm.device)
    with _staged(out) as stage:     # the artifacts replace the old ones together, at the end (or not at all)
        save_draft(stage / DRAFT_FILE, draft, fp)
        lore_report = _fit_lore(lm, traces, lore_max_rank, stage) if lore else {"skipped": "--no-lore"}
        report = _report(lm, traces, distances, draft, cfg, draft_report, lore_report, stage, seq_len, t_traces, t0,
                         command)
        write_calibration(stage / CALIBRATION_FILE, fp, traces.popularity(), **report)
    # Where they went, for the summary printed (not in the record: a folder may move)
    return dict(report, folder=str(out), beside_model=out.resolve() == Path(lm.path).resolve(),
                kept=[] if lore else [LORE_FILE])      # --no-lore leaves the factors already there as they were


def _report(lm, traces, distances, draft, cfg, draft_report, lore_report, stage: Path, seq_len: int,
            t_traces: float, t0: float, command: str) -> dict:
    """What spice-calibration.json records of a calibration (the files' sizes as staged)."""
    from spice_core.predictor.artifacts import DRAFT_FILE, LORE_FILE

    freq = traces.expert_frequency()
    files = {}
    for name in (DRAFT_FILE, LORE_FILE):     # as staged, or (LoRE kept by --no-lore) already beside the model
        path = next((d / name for d in (stage, stage.parent) if (d / name).exists()), None)
        if path is not None:
            files[name] = path.stat().st_size
    return {
        "model": lm.name,
        "traces": {"source": traces.source, "tokens": traces.n_tokens, "seq_len": seq_len,
                   "trace_s": round(t_traces, 1)},
        "draft": {"file": DRAFT_FILE, "heads": len(lm.moe_layers) * distances, "device_bytes": draft.nbytes,
                  "config": asdict(cfg), **draft_report},
        "lore": lore_report,
        "expert_frequency": [[round(float(v), 5) for v in row] for row in freq],
        "files_bytes": files,
        "total_s": round(time.perf_counter() - t0, 1),
        "environment": {"python": platform.python_version(), "torch": torch.__version__,
                        "transformers": _version("transformers"), "threads": torch.get_num_threads(),
                        "device": str(lm.device)},
        "command": command,
    }


def _version(name: str) -> str:
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:  # noqa: BLE001 - metadata may be missing in odd installs
        return "unknown"


def _command_line(args) -> str:
    """The command as a user would retype it (options that differ from the defaults)."""
    parts = ["python -m spice_core calibrate"]
    if args.model is not None:
        parts.append(f"--model {args.model}")
    for flag, default in (("device", "cpu"), ("text", None), ("max_tokens", 24_576), ("seq_len", 256),
                          ("distances", 8), ("epochs", 12), ("train_seconds", 240.0),
                          ("lore_max_rank", DEFAULT_LORE_MAX_RANK), ("out", None), ("threads", None), ("seed", 0)):
        v = getattr(args, flag)
        if v != default:
            parts.append(f"--{flag.replace('_', '-')} {v}")
    if args.no_lore:
        parts.append("--no-lore")
    if getattr(args, "lore_only", False):
        parts.append("--lore-only")
    return " ".join(parts)


def run(args) -> int:
    _check_args(args)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.lore_only:
        rep = calibrate_lore_only(args.model, device=args.device, text=args.text, max_tokens=args.max_tokens,
                                  seq_len=args.seq_len, lore_max_rank=args.lore_max_rank, out=args.out,
                                  command=_command_line(args))
        if args.json:
            print(json.dumps(_json_report(rep), indent=1))
        else:
            _print_lore_and_files(rep)
        return 0
    report = calibrate(args.model, device=args.device, text=args.text, max_tokens=args.max_tokens,
                       seq_len=args.seq_len, distances=args.distances, epochs=args.epochs,
                       train_seconds=args.train_seconds, lore_max_rank=args.lore_max_rank, lore=not args.no_lore,
                       out=args.out, seed=args.seed, command=_command_line(args))
    if args.json:
        print(json.dumps(_json_report(report), indent=1))
        return 0
    d = report["draft"]
    rec = ", ".join(f"d={k}: {v:.3f}" for k, v in d["heldout_recall_at_k"].items())
    print(f"traced {report['traces']['tokens']} tokens of {report['traces']['source']} "
          f"in {report['traces']['trace_s']} s")
    print(f"draft: {d['heads']} heads, {format_bytes(d['device_bytes'])} on the device, trained in {d['train_s']} s "
          f"(best epoch {d['best_epoch']}); held-out recall@k {rec}")
    _print_lore_and_files(report)
    return 0


def _json_report(report: dict) -> dict:
    """What --json prints of a calibration's report (the per-expert frequencies and the placement flag left out)."""
    return {k: v for k, v in report.items() if k not in ("expert_frequency", "beside_model")}


def _print_lore_and_files(report: dict) -> None:
    lo = report["lore"]
    print("LoRE: " + (f"skipped ({lo['skipped']})" if "skipped" in lo else f"{lo['file']} (max rank {lo['max_rank']})"))
    folder = Path(report["folder"])
    for name, size in report["files_bytes"].items():
        print(f"{'kept' if name in report.get('kept', ()) else 'wrote'} {folder / name}: {format_bytes(size)}")
    if not report["beside_model"]:
        print(f"not beside the model: pass --artifacts {shlex.quote(str(folder))} to generate, tune, quality "
              "and the app to use them")
    print(f"done in {report['total_s']} s")
