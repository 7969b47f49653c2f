"""The tuner in the app: a quality budget from the page, one tune as a job of the engine's runner, the picks
kept for every visitor (those saved beside the model among them), saving a pick there, and the words the pages
show about a pick.

    page (sweep or chat side bar) ──► budget(ppl %, agreement) ──► TuneBook.find: a pick for this model,
        cache, profile, shape and budget already made? ──► reuse it (the tuner is deterministic)
                                  └─ else ──► runner.start(owner, TuneJob) ──► pump thread iterates the job
                                              job: a thread runs spice_core.api.tune(...)
                                                   progress ──► TuneProgress items ──► stream.take()
                                              Stop ──► stream.cancel ──► job.cancel ──► should_stop()
    app start ──► TuneBook.offer_saved: the picks in spice-tuned.json beside the model (`python -m spice_core tune`
                  wrote them, or "Save this pick beside the model" did) ──► kept like picks made here, so the
                  pages offer the one that fits and a tune with its budget reuses it
    "Save this pick beside the model" ──► save_beside_model ──► spice_core.api.save_tuned into that same file

Why a job of the runner and not a thread of its own: the runner is the app's one-generation-at-a-time rule
(pages.runner). A tune started through it waits for, or is refused by, another visitor's reply like any
generation; while it runs, other visitors are told "the engine is busy with a tune" and their messages
wait in the engine's queue; Stop, a closed page (unload) and a reader that went away (the orphan
watchdog) end it between two measured settings. The tuner itself takes the engine's lock per measured
setting (tools.quality), so it can never run inside someone else's generation either.

Why a small screening (APP_EVAL) and a confirmation as long as the chat's replies (APP_CONFIRM): the app runs on a
shared 2-core machine. The screening measures each of the shipped model's 19 settings on 64 teacher-forced tokens and
2 prompts x 8 greedy tokens (about 50 s there); agreement over 8 tokens runs high (a greedy reply that diverges from
the exact one does so later and rarely comes back), so it only sorts out what is plainly too lossy. A lossy setting
is within the budget only once it also held on 6 held-out chat requests x the chat's reply length (the base's max
new tokens: 192 by default) and 256 teacher-forced tokens: measured, the screening passed every lossy setting of the
shipped model at the default budget, and on chat replies every one of them missed it (spice_core.tuner says more).
The confirmation re-measures the least lossy candidate first, so when it fails nothing else is measured: one tune of
the shipped model takes 2 to 8 minutes there (APP_TUNE_WORDS); the CLI's default evaluation is larger and
is what docs/benchmarks/tune/ reports.

What a pick holds for (spice_core.tuned): an exact pick is within any budget; a lossy one only for replies no
longer than those it was confirmed on. So a pick is reused for the same budget and reply length (`pick_key`); one
saved beside the model that was never confirmed (an older file, or `tune --no-confirm`) is offered with that caveat,
and never applied by Auto as within the budget: Auto tunes again.

Knows nothing of Gradio; the engine, the tuner and its file are reached through `spice_core.api` only.
"""
from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

from spice_core.api import (DEFAULT_BUDGET_AGREEMENT, DEFAULT_BUDGET_PPL_PCT, Budget, EngineInfo,
                            RunSettings, TuneRecord, load_tuned, save_tuned, stale_tuned, tune, tuned_path)
from spice_core.errors import ConfigError, SpiceError
from pages.limits import bounded_number
from pages.runner import CANCEL_REASONS

log = logging.getLogger(__name__)

# The app's screening per tune (see the module's docstring for why it is small).
APP_EVAL = {"max_tokens": 64, "n_prompts": 2, "new_tokens": 8, "speed_tokens": 32}
# The app's confirmation (spice_core.tuner.Confirm's fields): greedy replies as long as the base's max new tokens.
APP_CONFIRM = {"max_tokens": 256, "n_prompts": 6, "prompts": "chat", "max_settings": 3}
# How long one tune of the shipped model takes on a 2-core machine (measured from the sweep page's handler at the
# default budget and the chat's 192 tokens: 122-141 s, about 50 s of it the screening; 57 s before the confirmation;
# a review measured 254 s at cache 0.25 and 416 s at cache 0.75, where three confirmations of ~90 s each ran: up to
# APP_CONFIRM's max_settings of them); other work on the same cores makes it slower.
APP_TUNE_WORDS = "2 to 8 minutes"
MAX_PPL_PCT = 100.0    # the budget box's range: a perplexity increase beyond 100 % is no budget
DEFAULT_PPL_PCT = DEFAULT_BUDGET_PPL_PCT
DEFAULT_AGREEMENT = DEFAULT_BUDGET_AGREEMENT
MAX_PICKS = 64         # picks kept for reuse (oldest dropped)
MAX_HANDOFFS = 256     # "use this setting in chat" requests waiting for the visitor's chat page
READ_ONLY_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)    # a folder this app may not write


def budget(ppl_pct, agreement) -> Budget:
    """The budget from the two boxes (an empty box: not constrained); ConfigError naming the box otherwise."""
    empty = lambda v: v is None or (isinstance(v, str) and not v.strip())    # noqa: E731
    ppl = None if empty(ppl_pct) else bounded_number(ppl_pct, "Perplexity increase at most (%)", 0.0, MAX_PPL_PCT)
    agr = None if empty(agreement) else bounded_number(agreement, "Greedy agreement at least", 0.0, 1.0)
    if ppl is None and agr is None:
        raise ConfigError("Budget: both boxes are empty; give a perplexity increase (e.g. 1 %) and/or a greedy "
                          "agreement (e.g. 0.9)")
    return Budget(ppl_pct=ppl, agreement=agr)


def picked_settings(record: TuneRecord, current: RunSettings) -> RunSettings:
    """``current`` with the pick applied: policy spice, the tuned knobs, and the cache, profile and shape it was
    tuned for (the pick holds only there)."""
    return replace(record.settings(current), cache_frac=record.cache_frac, profile=record.profile,
                   shape=record.shape)


@dataclass(frozen=True)
class TuneProgress:
    """One line of the tuner's progress: ``done`` of about ``total`` settings measured."""

    message: str
    done: int
    total: int


class TuneJob:
    """A tune driven like a generation by pages.runner.RunStream: iterating it runs the tuner (on a thread of
    its own, so its progress callback can be yielded) and yields TuneProgress; ``record`` holds the result."""

    run_id = ""

    def __init__(self, engine, base: RunSettings, tune_budget: Budget, evaluation: dict | None = None,
                 confirm: dict | None = None) -> None:
        self.engine, self.base, self.budget = engine, base, tune_budget
        self.evaluation = dict(APP_EVAL if evaluation is None else evaluation)
        self.confirm = dict(APP_CONFIRM if confirm is None else confirm)
        self.record: TuneRecord | None = None
        self.last = TuneProgress("starting", 0, 0)
        self._stop = threading.Event()
        self._items: queue.Queue = queue.Queue()

    # --- the Generation protocol (pages.runner drives it) ----------------------------------
    def __iter__(self):
        worker = threading.Thread(target=self._work, name="spice-tune", daemon=True)
        worker.start()
        try:
            while True:
                item = self._items.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                self.last = item
                if not self._stop.is_set():      # once stopped, the runner takes no more items
                    yield item
        finally:
            self._stop.set()
            worker.join()

    def cancel(self) -> None:
        self._stop.set()

    def update_settings(self, settings: RunSettings) -> None:
        """A tune takes no settings while it runs."""

    def summary(self):
        return None

    def progress_words(self) -> str:
        """For visitors who wait (pages.runner.RunStream.progress_text)."""
        p = self.last
        return f"{p.done} of about {p.total} settings measured" if p.total else "starting"

    # --- the worker thread ----------------------------------------------------------------
    def _work(self) -> None:
        try:
            self.record = tune(self.engine, self.base, self.budget,
                               progress=lambda m, d, t: self._items.put(TuneProgress(m, d, t)),
                               should_stop=self._stop.is_set, confirm=self.confirm, **self.evaluation)
        except BaseException as exc:    # handed to the iterating thread, which raises it there
            self._items.put(exc)
        finally:
            self._items.put(None)


def pick_key(model_key: str, where, tune_budget: Budget) -> tuple:
    """What a pick depends on: the model, cache, profile, shape, budget and reply length (``where``: the base
    RunSettings, whose max_new_tokens is the reply length, or a TuneRecord, which names its cache, profile and shape
    alike, and the reply length it was confirmed for: 0, never asked for, when it was not). The base's exact knobs
    only seed the tuner's search over them, so picks are shared across them (as the file beside the model shares
    them)."""
    return (model_key, where.cache_frac, where.profile, where.shape, tune_budget.ppl_pct, tune_budget.agreement,
            reply_tokens_of(where))


def reused_for(record: TuneRecord, reply_tokens: int) -> bool:
    """Whether a tune for replies of ``reply_tokens`` (same model, cache, profile, shape and budget) reuses ``record``:
    it was tuned for that reply length and is within its budget there (`run`)."""
    return record.reply_tokens == reply_tokens and record.within_budget_for(reply_tokens)


def reply_tokens_of(where) -> int:
    """The reply length of a base RunSettings (its max_new_tokens) or of a TuneRecord (what it was confirmed for)."""
    return where.reply_tokens if isinstance(where, TuneRecord) else where.max_new_tokens


def budget_of(record: TuneRecord) -> Budget:
    """The budget a record was tuned for (SpiceError for a record whose budget is empty)."""
    return Budget(record.budget["ppl_pct"], record.budget["agreement"])


def saved_path(info: EngineInfo) -> Path | None:
    """The file `python -m spice_core tune` writes by default and `generate --tuned` reads: spice-tuned.json in the
    model's folder (tools.generate.default_tuned_path); None when the model has no folder (a test double)."""
    return tuned_path(info.model_dir) if info.model_dir else None


@dataclass(frozen=True)
class Kept:
    """A pick in the book: ``made`` when (time.time()); ``saved_at`` the file beside the model it is in, or ""."""

    record: TuneRecord
    made: float
    saved_at: str = ""

    def how(self) -> str:
        """How a page that reuses it got it, in words."""
        if self.saved_at:
            return (f"reused the pick saved beside the model (`{self.saved_at}`) for the same cache, profile, shape, "
                    "budget and reply length")
        return (f"reused the pick made {_ago(time.time() - self.made)} for the same model, cache, profile, shape, "
                "budget and reply length (the tuner is deterministic)")


class TuneBook:
    """Picks made so far and those saved beside the models (shared by every visitor: same model, cache, profile,
    shape and budget, same pick), and the settings each visitor asked to use in the chat, waiting for their chat
    page to load."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._file_lock = threading.Lock()      # one save at a time (each reads the file, then replaces it)
        self._picks: OrderedDict[tuple, Kept] = OrderedDict()
        self._handoffs: OrderedDict[str, TuneRecord] = OrderedDict()
        self._offered: set[str] = set()         # model keys whose saved picks were read

    def find(self, key: tuple) -> Kept | None:
        with self._lock:
            return self._picks.get(key)

    def keep(self, key: tuple, record: TuneRecord, saved_at: str = "") -> None:
        if record.stopped:          # the best of a part only: never reused
            return
        with self._lock:
            self._picks.pop(key, None)
            self._picks[key] = Kept(record, time.time(), saved_at)
            while len(self._picks) > MAX_PICKS:
                self._picks.popitem(last=False)

    def offer_saved(self, model_key: str, info: EngineInfo) -> None:
        """Keep the picks saved beside the model (read once per model; its chat and sweep pages both ask), so that
        the pages offer the one fitting their cache, profile and shape (`saved_for`) and a tune with its budget
        reuses it. A file that cannot be read is logged and offers nothing."""
        path = saved_path(info)
        with self._lock:
            if path is None or model_key in self._offered:
                return
            self._offered.add(model_key)
        try:
            records = load_tuned(path) if path.is_file() else []
        except (SpiceError, OSError) as exc:
            log.warning("the tuned settings beside %s are not offered: %s", info.model_name, exc)
            return
        if len({r.model for r in records}) > 1:      # a file several models' tunes share: this model's picks only
            records = [r for r in records if r.model == info.model_name]
        for record in records:
            stale = stale_tuned(record, info.calibration)
            if stale:
                log.warning("a tuned setting in %s is not offered: %s", path, stale)
                continue
            try:
                key = pick_key(model_key, record, budget_of(record))
            except (SpiceError, KeyError, TypeError) as exc:
                log.warning("a tuned setting in %s is not offered (its budget: %s)", path, exc)
                continue
            self.keep(key, record, saved_at=str(path))

    def saved_for(self, model_key: str, settings: RunSettings) -> Kept | None:
        """The newest pick saved beside the model for ``settings``' cache, profile and shape (any budget), or None."""
        where = (model_key, settings.cache_frac, settings.profile, settings.shape)
        with self._lock:
            return next((k for key, k in reversed(self._picks.items()) if k.saved_at and key[:4] == where), None)

    def save_beside_model(self, model_key: str, info: EngineInfo, record: TuneRecord) -> str:
        """Write ``record`` into the model's spice-tuned.json (`saved_path`: the file and format the CLI's `tune`
        writes) and say where, in one line; or why not, in one line, changing nothing (the file is replaced only
        once the new one is written: spice_core.api.save_tuned)."""
        if record.stopped:
            return ("⚠ Not saved: this pick is the best of a stopped tune, part of the search only: run the tune to "
                    "its end to save it.")
        path = saved_path(info)
        if path is None:
            return ("⚠ Not saved: this model has no folder of its own to save beside; the pick stays on this page "
                    "(use it in chat).")
        try:
            with self._file_lock:
                save_tuned(record, path)
        except OSError as exc:
            why = "the model's folder is not writable here (a read-only Space, say)" if exc.errno in READ_ONLY_ERRNOS \
                else f"{exc.strerror or type(exc).__name__}"
            return (f"⚠ Not saved: cannot write `{path}`: {why}. The pick stays on this page (use it in chat); "
                    "`python -m spice_core tune` saves it where the folder is writable.")
        except SpiceError:       # a file of that name that is not a tuned-settings file (load_tuned): left as it is
            return (f"⚠ Not saved: `{path}` is there but is not a tuned-settings file, so it is left as it is: move "
                    "it away, then save again.")
        self.keep(pick_key(model_key, record, budget_of(record)), record, saved_at=str(path))
        return (f"Saved beside the model: `{path}` (`python -m spice_core generate --policy spice --tuned` reads it; "
                f"the app offers it when it loads this model).")

    def hand_to_chat(self, owner: str, record: TuneRecord) -> None:
        with self._lock:
            self._handoffs.pop(owner, None)
            self._handoffs[owner] = record
            while len(self._handoffs) > MAX_HANDOFFS:
                self._handoffs.popitem(last=False)

    def take_for_chat(self, owner: str) -> TuneRecord | None:
        with self._lock:
            return self._handoffs.pop(owner, None) if owner else None


# --- running one tune from a page's handler -------------------------------------------------
STATUS_INTERVAL_S = 1.0


def run(ctx, book: TuneBook, owner: str, base: RunSettings, tune_budget: Budget, should_stop):
    """A generator for a page's handler: yields progress lines (about once a second, so Gradio can end it when
    the page goes away) and returns (record | None, words for the page: why there is none, or how it was got).
    A pick already made (or saved beside the model) for the same key is reused at once."""
    key = pick_key(ctx.key, base, tune_budget)
    found = book.find(key)
    if found is not None and reused_for(found.record, base.max_new_tokens):
        return found.record, found.how()
    try:
        stream = ctx.runner.start(owner, base, lambda: TuneJob(ctx.engine, base, tune_budget), kind="tune")
    except SpiceError as exc:
        return None, f"not started: {exc}"
    job: TuneJob = stream.generation
    started = time.perf_counter()
    due = 0.0
    while True:
        if should_stop():
            stream.cancel("stop")
            job.cancel()        # now: the runner passes a cancel on only when the job next reports progress
        _steps, ended = stream.take(0.25)
        if ended:
            break
        if time.monotonic() >= due:
            due = time.monotonic() + STATUS_INTERVAL_S
            p = job.last
            yield (f"Tuning: {p.done} of about {p.total} settings measured · {time.perf_counter() - started:.0f} s · "
                   f"{p.message}", p.done, p.total)
    if stream.error:
        stopped = "stopped before" in stream.error
        return None, ("stopped before any setting was measured" if stopped else stream.error)
    if job.record is None:
        return None, f"stopped: {CANCEL_REASONS.get(stream.cancel_reason, stream.cancel_reason or 'no result')}"
    if not job.record.stopped:
        book.keep(key, job.record)
    return job.record, f"tuned in {job.record.tune_s:.0f} s"


def shown(gen, outputs):
    """Drive `run`'s generator for a page: yield ``outputs(line)`` for each progress line; return its
    (record | None, words). Use as ``record, how = yield from shown(run(...), outputs)``."""
    while True:
        try:
            line, _done, _total = next(gen)
        except StopIteration as end:
            return end.value
        yield outputs(line)


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


# --- words ------------------------------------------------------------------------------------
def setting_label(s: dict) -> str:
    """A short label for a plotted point: "τa 0.1 · r4" (lossy) or "exact · τp 0.2 · L4 · lane" (exact)."""
    if s["tau_approx"] > 0:
        return f"τa {s['tau_approx']:g} · r{s['lore_rank']}"
    return f"exact · τp {s['tau_prefetch']:g} · L{s['max_lookahead']} · {'lane' if s['cpu_lane'] else 'no lane'}"


def setting_words(s: dict) -> str:
    lane = "on" if s["cpu_lane"] else "off"
    approx = f"τ_approx {s['tau_approx']:g} (LoRE rank {s['lore_rank']})" if s["tau_approx"] > 0 else \
        "τ_approx 0 (exact)"
    return f"{approx}, τ_prefetch {s['tau_prefetch']:g}, max lookahead {s['max_lookahead']}, CPU lane {lane}"


def quality_words(record: TuneRecord) -> str:
    """The pick's quality and the sample it stands on."""
    if record.exact:
        return "the exact model's tokens (nothing approximated)"
    on = f"replies of {record.reply_tokens} tokens" if record.confirmed else "the short screening sample only"
    return f"perplexity {record.ppl_pct:+.2f} %, greedy agreement {record.agreement:.3f} on {on}"


def nothing_lossy_holds(record: TuneRecord) -> bool:
    """The pick is exact because every approximating setting re-measured on replies failed (or was ruled out)."""
    verdicts = [TuneRecord.verdict(t) for t in record.trials if t.get("stage") == "lossy"]
    return record.exact and "failed" in verdicts and "unconfirmed" not in verdicts


def caveat_markdown(record: TuneRecord, reply_tokens: int) -> str:
    """A warning line when the pick is not known to be within its budget for replies of ``reply_tokens`` ("")."""
    caveat = record.caveat(reply_tokens)
    return f"⚠ **Not known to be within the budget:** {caveat}." if caveat else ""


def in_use_caveat(session, settings: RunSettings) -> str:
    """The warning for a pick Auto applied that the chat still runs (its knobs unchanged) when ``settings`` ask for
    longer replies than it was confirmed on ("" otherwise; a pick whose knobs the user moved is forgotten). Review:
    raising Max new tokens after Auto kept a pick confirmed on 16-token replies without a word."""
    auto = getattr(session, "auto", None)
    record = getattr(auto, "applied", None)
    if record is None:
        return ""
    if settings.policy != record.policy or any(getattr(settings, k) != v for k, v in record.setting.items()):
        auto.applied = None
        return ""
    caveat = caveat_markdown(record, settings.max_new_tokens)
    return f"{caveat} Press Auto again to re-measure it on replies of {settings.max_new_tokens} tokens." if caveat else ""


def saved_markdown(kept: Kept, then: str, reply_tokens: int) -> str:
    """One line offering a pick saved beside the model: what it is, what it was tuned for, whether it is within that
    budget for replies of ``reply_tokens`` (`caveat_markdown`), and ``then`` (what the page does with it)."""
    r = kept.record
    caveat = caveat_markdown(r, reply_tokens)
    return (f"**Saved beside the model** for this cache, profile and shape: {setting_words(r.setting)} · "
            f"{r.speed_ms:.2f} ms per token, {r.speed_timing} · {quality_words(r)}, tuned for {budget_of(r).words()}. "
            + (f"{caveat} " if caveat else "") + then)


def pick_markdown(record: TuneRecord, how: str, reply_tokens: int) -> str:
    """What was picked and why (the record's reason), in words for the page; a warning when it is not known to be
    within its budget for replies of ``reply_tokens`` (the max new tokens it is used with)."""
    budget_words = budget_of(record).words()
    caveat = caveat_markdown(record, reply_tokens)
    plain = (f"**No approximating setting keeps this budget on replies of {record.reply_tokens} tokens, so the pick is "
             "the exact setting (τ_approx 0).**  \n" if nothing_lossy_holds(record) else "")
    checked = f"screened on {record.quality_measured_on}" + (
        f"; re-measured on {record.confirmed_on}" if record.confirmed_on else "")
    return (plain + f"**Picked: {setting_words(record.setting)}** (policy spice) · {record.speed_ms:.2f} ms per token, "
            f"{record.speed_timing} · {quality_words(record)}.  \n"
            f"**Why:** {record.reason}.  \n" + (f"{caveat}  \n" if caveat else "") +
            f"Budget: {budget_words} · cache {record.cache_frac:g}, {record.profile}, {record.shape} · {checked} · "
            f"{len(record.trials)} settings, {how}.")
