"""`python -m spice_core tune`: the fastest spice setting within a quality budget, saved beside the model.

    python -m spice_core tune --model M --budget-ppl 1 --budget-agreement 0.9 [--profile P | --timing measured]
        [--cache-frac F] [--out FILE]
    python -m spice_core generate --policy spice --tuned [FILE] --prompt ...

The search itself is `spice_core.tuner`; this module parses, prints progress and the pick, and writes
it (default: `spice-tuned.json` in the model's folder, one record per profile, shape and cache).
"""
from __future__ import annotations

import json
import signal
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from spice_core.tools import args as ca
from spice_core.errors import ConfigError


def add_cli(sub) -> None:
    from spice_core.tools.generate import add_engine_args
    from spice_core.tuner import DEFAULT_BUDGET_AGREEMENT, DEFAULT_BUDGET_PPL_PCT, DEFAULT_REPLY_TOKENS

    p = sub.add_parser("tune", help="find the fastest spice setting within a quality budget",
                       description="Search tau_approx, tau_prefetch, max lookahead, LoRE rank and the CPU lane for "
                                   "the fastest spice setting whose measured quality (held-out text, on the CPU path) "
                                   "meets the budget, at this model, cache, profile and shape; print and save it.")
    add_engine_args(p)
    p.add_argument("--budget-ppl", type=ca.float_in(0.0, 1000.0), default=DEFAULT_BUDGET_PPL_PCT,
                   help="largest perplexity increase over the exact model, in percent (default 1)")
    p.add_argument("--budget-agreement", type=ca.float_in(0.0, 1.0), default=DEFAULT_BUDGET_AGREEMENT,
                   help="smallest greedy agreement with the exact model (default 0.9)")
    p.add_argument("--max-tokens", type=ca.int_in(16, 100_000), default=256, help="teacher-forced tokens scored per setting")
    p.add_argument("--n-prompts", type=ca.int_in(1, 1000), default=4, help="prompts for greedy agreement")
    p.add_argument("--new-tokens", type=ca.int_in(1, 1024), default=24, help="greedy tokens per prompt")
    p.add_argument("--confirm-tokens", type=ca.int_in(16, 100_000), default=512,
                   help="teacher-forced tokens of the confirmation sample a lossy pick must also meet the budget on "
                        "(default 512)")
    p.add_argument("--confirm-prompts", type=ca.int_in(1, 1000), default=8,
                   help="prompts of the confirmation sample (default 8)")
    p.add_argument("--confirm-new-tokens", type=ca.int_in(1, 1024), default=DEFAULT_REPLY_TOKENS,
                   help="greedy tokens per prompt of the confirmation sample: the longest reply a lossy pick is "
                        "within the budget for (generate --max-new-tokens, the chat's Max new tokens); longer "
                        f"replies get a caveat (default {DEFAULT_REPLY_TOKENS}, the chat's default reply length)")
    p.add_argument("--confirm-settings", type=ca.int_in(1, 100), default=3,
                   help="screened settings re-measured on it at most: the least lossy of those faster than every "
                        "exact one first, then a bisection by speed (default 3)")
    p.add_argument("--no-confirm", action="store_true",
                   help="pick on the screening sample alone (faster; the record says it was not confirmed)")
    p.add_argument("--out", type=ca.path, default=None, help="tuned-settings file to write (default: spice-tuned.json "
                                                          "in the model's folder)")
    p.add_argument("--json", action="store_true", help="print the record as one JSON object")
    p.set_defaults(func=run, policy="spice")


def run(args) -> int:
    from spice_core.tools.generate import default_tuned_path, load_engine, settings_from_args
    from spice_core.tuned import check_can_save, save
    from spice_core.tuner import Budget, Confirm, tune

    if args.policy != "spice":
        raise ConfigError(f"tune searches spice's settings: drop --policy {args.policy} (or pass --policy spice)")
    if args.tau_int8 > 0:
        raise ConfigError(f"tune does not search tau_int8 (its exact stage would not be exact): drop --tau-int8 "
                          f"{args.tau_int8:g}")
    budget = Budget(ppl_pct=args.budget_ppl, agreement=args.budget_agreement)
    out = args.out if args.out is not None else default_tuned_path(args.model)
    if out.exists() and out.is_dir():
        raise ConfigError(f"--out {out} is a folder: pass a file path, e.g. {out / 'spice-tuned.json'}")
    if not out.parent.is_dir():
        raise ConfigError(f"--out {out}: its folder does not exist: create it or pass another path")
    if args.out is None:          # the pick goes beside the model: say so if that is what cannot be written
        from spice_core.user_files import check_writable_file

        try:
            check_writable_file(out, "--out")
        except ConfigError as e:
            raise ConfigError(f"tune saves its pick beside the model, as {out}, and cannot write there "
                              f"({str(e).split(': ', 1)[-1]}): pass --out FILE in a writable folder, then use it "
                              "with generate --tuned FILE") from None
    check_can_save(out)           # before the search, which takes minutes: not after it, losing the pick
    engine = load_engine(args)
    base = settings_from_args(args, engine)

    def progress(msg: str, done: int, total: int) -> None:
        if not args.json:
            print(f"[{done}/{total}] {msg}", file=sys.stderr, flush=True)

    confirm = None if args.no_confirm else Confirm(max_tokens=args.confirm_tokens, n_prompts=args.confirm_prompts,
                                                   new_tokens=args.confirm_new_tokens, max_settings=args.confirm_settings)
    with first_ctrl_c_stops() as stop:
        rec = tune(engine, base, budget, max_tokens=args.max_tokens, n_prompts=args.n_prompts,
                   new_tokens=args.new_tokens, progress=progress, confirm=confirm, should_stop=stop.is_set)
    # The result first: a save that fails after minutes of search (the file changed meanwhile, a full disk) must
    # not lose it (review).
    if args.json:
        print(json.dumps(rec.as_dict(), allow_nan=False), flush=True)
    else:
        print_result(rec)
    if rec.stopped:
        print(f"stopped (Ctrl-C): the best setting measured so far is above; not saved to {out} (run tune again "
              "to finish)", file=sys.stderr)
        return 130
    try:
        save(rec, out)
    except (OSError, ConfigError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ConfigError(f"--out {out}: the pick printed above could not be saved ({why}): pass a writable path, "
                          "or apply the printed flags by hand") from None
    if not args.json:
        print(f"saved to {out} (use it: python -m spice_core generate --policy spice --tuned ...)")
    return 0


def print_result(rec) -> None:
    s = rec.setting
    print(f"recommended: --tau-approx {s['tau_approx']:g} --lore-rank {s['lore_rank']} --tau-prefetch "
          f"{s['tau_prefetch']:g} --max-lookahead {s['max_lookahead']} {'--cpu-lane' if s['cpu_lane'] else '--no-cpu-lane'}")
    print(f"speed: {rec.speed_ms:.2f} ms per token, {rec.speed_timing}")
    print(f"quality: perplexity {rec.ppl_pct:+.2f} %, greedy agreement {rec.agreement:.3f} "
          + ("(exact: nothing approximated)" if s["tau_approx"] == 0 else
             f"(measured on {rec.confirmed_on or rec.quality_measured_on})"))
    print(f"why: {rec.reason}")
    print(f"tuned in {rec.tune_s:.0f} s over {len(rec.trials)} settings", flush=True)


@contextmanager
def first_ctrl_c_stops():
    """An Event the first Ctrl-C sets (the tuner stops at its next check, within a window or a prompt, and keeps the
    best so far); a second one interrupts as usual. Only in the main thread, where Python delivers signals."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, None):     # nohup, a handler from C: left as they are
        yield stop
        return

    def first(signum, frame):
        stop.set()
        print("stopping after the window or prompt under way (Ctrl-C again to interrupt now)", file=sys.stderr,
              flush=True)
        signal.signal(signal.SIGINT, previous)

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)
