"""`python -m spice_core generate`: one prompt through the engine, text plus a summary."""
from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import sys
from pathlib import Path

from spice_core.tools import args as ca
from spice_core.tools.cli import Terminated
from spice_core.config import MAX_NEW_TOKENS_LIMIT, POLICIES, SETTING_RANGES, RunSettings, default_shape, own_shape
from spice_core.errors import ConfigError, SpiceError
from spice_core.model.shipped import NAMES, model_argument
from spice_core.units import format_bytes
from spice_core.user_files import check_writable_dir

log = logging.getLogger(__name__)
# Past this many trace events (~200 MB of plain JSON at ~280 bytes an event) --trace-dir writes the Chrome trace
# gzipped (~15x smaller).
GZIP_TRACE_EVENTS = 700_000
MAX_MODELED_STEP_MS = 86_400_000.0   # a modeled token slower than a day comes from a profile's absurd numbers
DEFAULTS = RunSettings()          # the one set of defaults the app and the API use too
MODEL_HELP = (f"a shipped model's name ({', '.join(NAMES)}), a checkpoint folder or a hub id "
              f"(default: the shipped {NAMES[0]})")

def add_engine_args(p: argparse.ArgumentParser) -> None:
    """Flags shared by every command that loads a model and runs a policy (ranges as RunSettings)."""
    p.add_argument("--model", type=model_argument, default=None, help=MODEL_HELP)
    p.add_argument("--device", type=ca.device, default=None, help="cuda or cpu (default: cuda when available)")
    p.add_argument("--artifacts", type=ca.path, default=None, metavar="DIR",
                   help="the model's calibration artifacts (draft heads, LoRE) when not beside it: the folder "
                        "`calibrate --out DIR` wrote (e.g. for a read-only checkpoint)")
    p.add_argument("--policy", default=DEFAULTS.policy, help=f"one of: {', '.join(POLICIES)}")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--cache-frac", type=ca.float_in(*SETTING_RANGES["cache_frac"]), default=None,
                   help="GPU budget as a fraction of all routed experts' bytes")
    g.add_argument("--cache-gb", type=ca.positive_float, default=None, help="GPU budget for routed experts in GB")
    p.add_argument("--profile", default=DEFAULTS.profile, help="hardware profile for modeled timing")
    p.add_argument("--shape", default=None,
                   help="target model shape for modeled timing, or native (default: the shape of the real model "
                        "whose routing the model has, e.g. qwen2-57b-a14b for spice-mini-qwen2; else native, the "
                        "model's own sizes)")
    p.add_argument("--executor", choices=("auto", "eager", "graphed"), default="auto",
                   help="auto: the CUDA-graph fast path for decode steps on a GPU with measured timing; eager: "
                        "per-expert PyTorch calls and per-expert trace detail (and the CPU lane)")
    p.add_argument("--timing", choices=("measured", "modeled"), default=None,
                   help="default: measured on CUDA, modeled elsewhere")
    p.add_argument("--tau-prefetch", type=ca.float_in(*SETTING_RANGES["tau_prefetch"]), default=DEFAULTS.tau_prefetch)
    p.add_argument("--tau-approx", type=ca.float_in(*SETTING_RANGES["tau_approx"]), default=DEFAULTS.tau_approx)
    p.add_argument("--tau-int8", type=ca.float_in(*SETTING_RANGES["tau_int8"]), default=DEFAULTS.tau_int8,
                   help="spice only, lossy: a miss below this router weight (and not below --tau-approx) may run on "
                        "the CPU lane from an int8 weight-only copy of the experts when that finishes first "
                        "(0 = off; the copy takes about half the experts' bytes of host memory)")
    p.add_argument("--max-lookahead", type=ca.int_in(*SETTING_RANGES["max_lookahead"]), default=DEFAULTS.max_lookahead)
    p.add_argument("--lore-rank", type=ca.positive_int, default=DEFAULTS.lore_rank)
    p.add_argument("--cpu-lane", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--hw-profile", type=ca.path, default=None,
                   help="profile JSON (calibrate-hw / recalibrate) that times modeled runs and drives decisions "
                        "in measured ones, in place of --profile")


def settings_from_args(args, engine, **over) -> RunSettings:
    if args.cache_gb is not None:       # finite and > 0 (cli_args.positive_float)
        frac = min(1.0, args.cache_gb * 1e9 / engine.routed_bytes)
    else:
        frac = 0.25 if args.cache_frac is None else args.cache_frac
    kw = dict(policy=args.policy, cache_frac=frac, tau_prefetch=args.tau_prefetch, tau_approx=args.tau_approx,
              tau_int8=args.tau_int8,
              max_lookahead=args.max_lookahead, lore_rank=args.lore_rank, cpu_lane=args.cpu_lane,
              profile=args.profile, shape=args.shape or default_shape(engine.info()))
    kw.update(over)
    return RunSettings(**kw)


def load_engine(args):
    from spice_core.engine import SpiceEngine
    from spice_core.timing.profiles import get_profile, get_shape

    # Cheap checks first: a typo must not wait for a model load.
    if args.policy not in POLICIES:
        raise ConfigError(f"--policy {args.policy!r} is unknown: choose one of {', '.join(POLICIES)}")
    get_profile(args.profile)
    if args.shape not in (None, "native"):
        get_shape(args.shape)
    if args.timing == "measured" and (args.device or ("cuda" if _cuda() else "cpu")).startswith("cpu"):
        raise ConfigError("--timing measured needs a CUDA device: use --timing modeled (or --device cuda on a GPU)")
    check_local_model(args.model)
    hw = None
    if getattr(args, "hw_profile", None) is not None:
        from spice_core.timing.profile_file import profile_from_file
        hw = profile_from_file(args.hw_profile)
    return SpiceEngine.load(args.model, device=args.device, timing=args.timing, hw_profile=hw,
                            executor=args.executor, artifacts=args.artifacts)


def check_local_model(model) -> None:
    """A local --model path: a folder with a usable config.json (named before the model loads).
    Hub ids and the default are resolved by the loader."""
    if model is None or not Path(str(model)).expanduser().exists():
        return
    from spice_core.model.loader import read_config, resolve_model_path
    read_config(resolve_model_path(model))


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def add_cli(sub) -> None:
    p = sub.add_parser("generate", help="generate text for one prompt and print a summary")
    add_engine_args(p)
    p.add_argument("--prompt", type=ca.utf8_text, required=True)
    form = p.add_mutually_exclusive_group()
    form.add_argument("--chat", action="store_true",
                      help="wrap the prompt with the tokenizer's chat template (the default when it has one)")
    form.add_argument("--raw", action="store_true", help="continue the prompt as plain text, without the chat template")
    p.add_argument("--max-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=64)
    p.add_argument("--temperature", type=ca.float_in(*SETTING_RANGES["temperature"]), default=0.0)
    p.add_argument("--top-p", type=ca.float_in(*SETTING_RANGES["top_p"]), default=1.0)
    p.add_argument("--repetition-penalty", type=ca.float_in(*SETTING_RANGES["repetition_penalty"]), default=None,
                   help="transformers' repetition penalty, 1.0 = none (default: the checkpoint's generation_config)")
    p.add_argument("--seed", type=ca.seed, default=0)
    p.add_argument("--stop", type=ca.nonempty_text, action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace-dir", type=ca.path, default=None, help="write Chrome trace, TensorBoard run and CSV here")
    p.add_argument("--tuned", nargs="?", const="", default=None, metavar="FILE",
                   help="use the setting `tune` saved for this profile, shape and cache (default file: spice-tuned.json "
                        "in the model's folder); overrides the threshold flags")
    p.set_defaults(func=run)


def run(args) -> int:
    if not args.prompt.strip():
        raise ConfigError("--prompt is empty: pass some text")
    if args.trace_dir is not None:
        check_writable_dir(args.trace_dir, "--trace-dir")     # before generating, not after
    if args.tuned and not Path(args.tuned).is_file():       # before the model loads
        raise ConfigError(f"--tuned {args.tuned}: no such file: pass the file `python -m spice_core tune` wrote")
    engine = load_engine(args)
    s = settings_from_args(args, engine, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           top_p=args.top_p, repetition_penalty=args.repetition_penalty, seed=args.seed,
                           stop=tuple(args.stop))
    tuned_note = ""
    if args.tuned is not None:
        s, tuned_note = apply_tuned(args, s, model=engine.lm.name, calibration=engine.info().calibration,
                                    profile=engine.machine.profile_key(s.profile))
    # A chat model answers a request only inside its template; as raw text it continues it off topic.
    has_template = bool(getattr(getattr(getattr(engine, "lm", None), "tokenizer", None), "chat_template", None))
    if args.chat and not has_template:
        raise ConfigError("--chat: this model's tokenizer has no chat template, so there is no chat to wrap the prompt "
                          "in: drop --chat (the prompt is then continued as plain text)")
    if args.chat or (has_template and not args.raw):
        gen = engine.start_chat([{"role": "user", "content": args.prompt}], s)
    else:
        gen = engine.start_prompt(args.prompt, s)
    steps = []
    try:
        for step in gen:
            steps.append(step)
            if not args.json:
                sys.stdout.write(step.text)
                sys.stdout.flush()
    except BaseException as e:      # Ctrl-C or an error mid-reply: its message goes on a line of its own
        if steps and not args.json:
            print(flush=True)
        if isinstance(e, KeyboardInterrupt) and not isinstance(e, Terminated) and args.trace_dir is not None:
            # The engine recorded the cut-short run ("cancelled"): its traces are what a long run stopped early
            # is traced for. A second Ctrl-C while they are written removes them (export_traces).
            gen.cancel()        # a Ctrl-C between two tokens (in this loop, not the run) leaves it paused: closed,
                                # it is recorded as cancelled (review)
            try:
                engine.get_record(gen.run_id)
            except SpiceError:
                raise KeyboardInterrupt("the run was not recorded, so no trace was written") from None
            files = export_traces(engine, gen.run_id, args.trace_dir)
            raise KeyboardInterrupt(f"the run's first {len(steps)} tokens were recorded; their traces: "
                                    + ", ".join(str(f) for f in files)) from None
        raise
    if not args.json:
        print()                     # ends the streamed text's line, before a summary or an error
    summ = gen.summary()
    check_times(steps, summ.timing, args)
    rec = engine.get_record(gen.run_id)
    notes = [n for n in (tuned_note, shape_note(summ.timing, summ.shape, engine.info()),
                         context_note(summ, args.max_new_tokens, engine.info().max_context_tokens)) if n]
    if args.json:
        steps = engine.get_steps(gen.run_id)
        obj = {
            "run_id": gen.run_id,       # the exports' names (spice-<run id>*) under --trace-dir
            "text": summ.text,
            "tokens": rec.token_ids,
            "summary": {
                "tpot_ms": summ.tpot_ms_median, "tpot_ms_p90": summ.tpot_ms_p90, "ttft_ms": summ.ttft_ms,
                "hit_rate": summ.hit_rate, "late_prefetch_rate": summ.late_prefetch_rate,
                "bytes_per_token": summ.bytes_per_token,
                # at the timed shape's sizes (modeled runs; the times above are for it), the model's own above
                "shape_bytes_per_token": summ.shape_bytes_per_token if summ.timing == "modeled" else None,
                "stall_ms_per_token": summ.stall_ms_per_token, "timing": summ.timing, "profile": summ.profile,
                "shape": summ.shape, "policy": summ.policy, "miss_split": summ.miss_split,
                "hit_rate_per_layer": {str(k): v for k, v in summ.hit_rate_per_layer.items()},
                "tokens_per_s": summ.tokens_per_s, "finish_reason": summ.finish_reason,
                "notes": list(summ.notes) + notes,
                "wasted_prefetch_bytes": rec.totals.get("wasted_prefetch_bytes", 0),
                "cpu_fallbacks": rec.totals.get("cpu_fallbacks", 0),
                "cache_slots": rec.totals.get("cache_slots"),
                "cache_capacity_bytes": rec.totals.get("cache_capacity_bytes"),
                "routed_bytes": rec.totals.get("routed_bytes"),
            },
            "per_token": [{"index": st.index, "token_id": st.token_id, "step_ms": st.step_ms, "hits": st.hits,
                           "misses": st.misses, "bytes_copied": st.bytes_copied, "stall_ms": st.stall_ms,
                           "lookahead_depth": st.lookahead_depth} for st in steps],
        }
        print(json.dumps(obj, allow_nan=False, default=lambda o: None))
    else:
        print(format_summary(summ))
        for note in notes:
            print(f"note: {note}")
        t = rec.totals
        print(f"GPU expert cache: {t.get('cache_slots')} slots = {format_bytes(t.get('cache_capacity_bytes', 0))} "
              f"of {format_bytes(t.get('routed_bytes', 0))} routed experts (native sizes)")
    if args.trace_dir is not None:      # after the result is out: a failed export (a full disk) must not lose it
        sys.stdout.flush()
        files = export_traces(engine, gen.run_id, args.trace_dir)
        print("traces written: " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0


def default_tuned_path(model) -> Path:
    """Where `tune` saves and `--tuned` reads by default: spice-tuned.json in the model's folder."""
    from spice_core.model.loader import resolve_model_path
    from spice_core.tuned import tuned_path

    return tuned_path(resolve_model_path(model))


def apply_tuned(args, settings: RunSettings, model: str | None = None,
                calibration: str | None = None, profile: str | None = None) -> tuple[RunSettings, str]:
    """``--tuned [FILE]``: ``settings`` with the saved pick for its profile (``profile``, the engine's `profile_key`:
    a --hw-profile file's name and digest; else ``settings.profile``), shape and cache (tuned on ``model``, and with the
    artifacts of digest ``calibration``, when given), and a note.

    A pick not known to be within its budget for replies of ``settings.max_new_tokens`` (a lossy one never confirmed,
    or confirmed on shorter replies: `TuneRecord.caveat`) is applied with a warning on stderr saying why and how to
    confirm it, and the note says so too."""
    from spice_core.tuned import find

    if settings.policy != "spice":
        raise ConfigError(f"--tuned sets spice's thresholds: use --policy spice, not {settings.policy}")
    if settings.tau_int8 > 0:      # the pick's quality was measured without the lossy int8 lane (tune refuses it)
        raise ConfigError(f"--tuned: the pick was measured with tau_int8 0, so its quality says nothing of "
                          f"--tau-int8 {settings.tau_int8:g}: drop --tau-int8")
    own = default_tuned_path(args.model)
    path = Path(args.tuned) if args.tuned else own
    # The file beside the model is its own whatever the folder is called now; one from elsewhere must name it.
    tuned_on = None if path.resolve() == own.resolve() else model
    rec = find(path, profile=profile or settings.profile, shape=settings.shape, cache_frac=settings.cache_frac,
               model=tuned_on, calibration=calibration, prefer=model)
    note = (f"tuned setting from {path}: {rec.reason}; measured quality perplexity {rec.ppl_pct:+.2f} %, "
            f"greedy agreement {rec.agreement:.3f}")
    reply_tokens = settings.max_new_tokens
    caveat = rec.caveat(reply_tokens)
    if caveat:
        # Applied all the same, as the app offers such a pick with its caveat: the user asked for it by name.
        log.warning("--tuned %s: the saved pick is not known to be within its budget for --max-new-tokens %d: %s; "
                    "to confirm it, run `python -m spice_core tune` with --confirm-new-tokens %d or more%s", path,
                    reply_tokens, caveat, reply_tokens,
                    f" (or pass --max-new-tokens {rec.reply_tokens} or fewer)" if rec.confirmed else
                    " and without --no-confirm")
        note += f"; not known to be within its budget for replies of {reply_tokens} tokens"
    return rec.settings(settings), note


def check_times(steps, timing: str, args) -> None:
    """Modeled times that are infinite, NaN or zero come from a hardware profile whose numbers are finite but
    absurd (a rate of 1e-308 TFLOP/s): refuse them rather than print "TPOT 0.000 ms" or fail in JSON."""
    if timing != "modeled" or not steps:
        return
    times = [st.step_ms for st in steps]
    if all(math.isfinite(t) and 0 < t < MAX_MODELED_STEP_MS for t in times):
        return
    source = f"--hw-profile {args.hw_profile}" if getattr(args, "hw_profile", None) else f"--profile {args.profile}"
    raise ConfigError(f"{source}: its numbers make modeled step times infinite, NaN, zero or "
                      "longer than a day (e.g. a rate near 0 or near the largest float): use measured values (python -m spice_core calibrate-hw)")


def context_note(summ, asked_tokens: int, context_tokens: int) -> str:
    """Why a run ended before ``asked_tokens`` when the model's context, not --max-new-tokens, was the limit."""
    if summ.finish_reason != "length" or summ.n_tokens >= asked_tokens or not context_tokens:
        return ""
    return (f"stopped at the model's context of {context_tokens} tokens: the prompt took "
            f"{context_tokens - summ.n_tokens}, so {summ.n_tokens} of the {asked_tokens} new tokens asked for fit")


def export_traces(engine, run_id: str, out_dir: Path) -> list[Path]:
    """The run's Chrome trace, TensorBoard run and CSV, all or none: an interrupted or failed export removes
    what it wrote (spice-<run id>*) and says so, so a partial set is never left looking complete. The Chrome trace
    is gzipped (Perfetto and chrome://tracing open it as is) when plain JSON would pass GZIP_TRACE_EVENTS' size:
    a long run's (~180 kB a token) reaches the ~512 MB a browser can parse as one string."""
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        gzipped = len(engine.get_record(run_id).events) > GZIP_TRACE_EVENTS
        return [engine.export_chrome_trace(run_id, out_dir, gzipped=gzipped),
                engine.export_tensorboard_zip(run_id, out_dir), engine.export_csv(run_id, out_dir)]
    except (KeyboardInterrupt, OSError, SpiceError) as e:
        for p in out_dir.glob(f"spice-{run_id}*"):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        what = f"the trace export to {out_dir} was incomplete, so its files (spice-{run_id}*) were removed"
        if isinstance(e, KeyboardInterrupt):        # Ctrl-C, or SIGTERM (cli.Terminated): the same kind, now saying so
            raise type(e)(what) from None
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"--trace-dir {out_dir}: writing failed ({reason}): {what}; check free space and "
                          "permissions") from e


def shape_note(timing: str, shape: str, info) -> str:
    """What modeled times at ``shape`` stand for when the shape is not the model's own ("" when it is)."""
    own = own_shape(info)
    if timing != "modeled" or shape in (own, "native"):
        return ""
    return (f"modeled at {shape}'s sizes on {info.model_name}'s routing, which is "
            + (f"{own}'s, not {shape}'s" if own else "no named real model's") + " (sizes only)")


def _bytes_rows(summ) -> list[tuple[str, str]]:
    """Bytes copied per token at the size the times beside them are for (a modeled shape's), this model's own after
    them (the app's and the CSV's order)."""
    own = ("bytes copied / token", f"{summ.bytes_per_token:,.0f}")
    if summ.timing != "modeled" or summ.shape == "native" or not summ.shape_bytes_per_token:
        return [own]
    return [(f"bytes copied / token at {summ.shape}", f"{summ.shape_bytes_per_token:,.0f}"),
            ("bytes copied / token (this model's sizes)", own[1])]


def format_summary(summ) -> str:
    rows = [("policy", summ.policy), ("timing", summ.timing), ("profile", summ.profile), ("shape", summ.shape),
            ("tokens", summ.n_tokens), ("TTFT ms", f"{summ.ttft_ms:.3f}"),
            ("TPOT ms (median)", f"{summ.tpot_ms_median:.3f}"), ("TPOT ms (p90)", f"{summ.tpot_ms_p90:.3f}"),
            ("tokens/s", f"{summ.tokens_per_s:.1f}"), ("hit rate (in time)", f"{summ.hit_rate:.3f}"),
            ("late prefetches", f"{summ.late_prefetch_rate:.3f}"),
            *_bytes_rows(summ),
            ("stall ms / token", f"{summ.stall_ms_per_token:.3f}"),
            ("misses (approx/cpu/copy)", "/".join(str(summ.miss_split.get(k, 0)) for k in ("approx", "cpu", "copy")))]
    if summ.miss_split.get("cpu_int8", 0):
        rows.append(("misses on the CPU from int8 (lossy)", str(summ.miss_split["cpu_int8"])))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"note: {n}" for n in summ.notes]
    return "\n".join(lines)
