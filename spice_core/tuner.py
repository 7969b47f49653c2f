"""The tuner: the fastest `spice` setting whose measured quality meets a budget on replies as long as the user's.

    budget (perplexity increase <= X %, greedy agreement >= Y), replies of N tokens (the base's max_new_tokens)
      stage 1, exact (tau_approx 0: quality is the exact model's, nothing to measure):
         coordinate search over tau_prefetch, max_lookahead and the CPU lane, speed only
      stage 2, lossy screening, from stage 1's best: for each LoRE rank (ascending), tau_approx ascending,
         speed and quality on a small sample from the same teacher-forced pass; a rank stops at its first failure
      stage 3, confirmation (`Confirm`): settings that passed the screening and are faster than the exact best are
         re-measured on a larger sample whose greedy generations are N tokens long: the least lossy first (when it
         fails, nothing lossier holds), then by bisection on speed; a failure rules out every setting at least as
         lossy (tau_approx >=, LoRE rank <=); at most `Confirm.max_settings` of them
      ─► the fastest setting within the budget: exact, or lossy and confirmed ─► TuneRecord
         (no confirmation asked for: the fastest that passed the screening, its record saying it is not confirmed)

Why this and not a grid: the exact knobs change speed only, so stage 1 skips every quality
measurement; the lossy knob's quality falls as tau_approx rises (more misses approximated), so once
one value fails a rank, larger ones are not tried; every setting is measured once (a cache keyed by
the setting). Quality is measured on held-out text on the CPU (`tools.quality`: teacher-forced
perplexity, greedy agreement, the project's definitions); speed is the *modeled* ms per
teacher-forced step (one decode-like token per forward pass, the same pass as the quality), or on a
GPU with measured timing, the *measured* TPOT of a generation. Every number says which.

Why a confirmation as long as the replies: greedy agreement (the share of identical tokens) falls with the length
of a generation, since a greedy reply that diverged from the exact one rarely finds its way back, and a perplexity
change measured on a hundred tokens is noise. Measured on the shipped model on the CPU: tau_approx 0.2 at LoRE rank 2
screened at agreement 0.938 over 2 prompts x 8 tokens and perplexity -3.75 % over 63 tokens; over 512 teacher-forced
tokens its perplexity was +3.1 %, over 8 held-out prompts x 64 tokens its agreement 0.36, and on the chat's three
story requests at the chat's reply length (192 tokens; the stories end after 134-160) 0.23, 0.78 and 0.15. The
screening passed all ten lossy settings at the default budget; on chat replies of 192 tokens the least lossy,
tau_approx 0.02, agreed 0.87 (rank 4) and 0.90 (rank 2) over 24 chat requests, and every larger tau_approx 0.37-0.52
on the three story requests. Per request the agreement is nearly all or nothing (1.0, or 0.2-0.5 once it diverges
early), so a sample of a few requests decides a setting near the budget's edge by which requests it holds.

Why the least lossy first: quality falls as tau_approx rises and as the LoRE rank falls, so when the least lossy
candidate fails, every other is ruled out by one measurement (the common case for a strict budget on long replies);
when it holds, bisection on speed finds a faster one that holds in few measurements.

The record and its file beside the model are `spice_core.tuned`. Knows nothing of pages or the CLI: progress goes to
a callback, `should_stop` ends the search early (the best so far is kept, marked stopped).
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Mapping, Sequence

from spice_core.config import MAX_NEW_TOKENS_LIMIT, RunSettings
from spice_core.errors import ConfigError
from spice_core.predictor.artifacts import calibration_digest
from spice_core.tuned import TuneRecord, find, save, tuned_path  # noqa: F401 - the record and its file, re-exported
from spice_core.tuned import EXACT, FAILED, HELD, MISSED, RULED_OUT, UNCONFIRMED, WITHIN  # noqa: F401 - verdicts

DEFAULT_BUDGET_PPL_PCT = 1.0
DEFAULT_BUDGET_AGREEMENT = 0.9
TAU_PREFETCH_VALUES = (0.05, 0.1, 0.2, 0.3, 0.5)
MAX_LOOKAHEAD_VALUES = (1, 2, 4, 8)
TAU_APPROX_VALUES = (0.02, 0.05, 0.1, 0.15, 0.2)     # the chat accepts [0, 0.2]
LORE_RANKS = (2, 4, 8, 16)
SAME_SPEED_REL = 1e-3      # speeds closer than this (relative) are ties: the modeled timing's float noise, not a gain
# The reply length a confirmation defaults to where no generation's max_new_tokens says it (the CLI's tune): the
# app chat's default reply length, which the app's own tune confirms on (the shipped model's stories end after
# 130-160 tokens). A lossy pick is within its budget only for replies no longer than this (`TuneRecord.within_budget_for`).
DEFAULT_REPLY_TOKENS = 192


@dataclass(frozen=True)
class Budget:
    """Quality the pick must keep: ``ppl_pct`` the largest perplexity increase (percent), ``agreement`` the
    smallest greedy agreement with the exact model. None: not constrained."""

    ppl_pct: float | None = DEFAULT_BUDGET_PPL_PCT
    agreement: float | None = DEFAULT_BUDGET_AGREEMENT

    def __post_init__(self) -> None:
        if self.ppl_pct is None and self.agreement is None:
            raise ConfigError("the quality budget is empty: give a perplexity increase (e.g. 1 %) and/or a greedy "
                              "agreement (e.g. 0.9)")
        for name in ("ppl_pct", "agreement"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
                raise ConfigError(f"the quality budget's {name} is {str(v)[:20]!r}: give a number (or None)")
        if self.ppl_pct is not None and not (math.isfinite(self.ppl_pct) and self.ppl_pct >= 0):
            raise ConfigError(f"a perplexity increase <= {self.ppl_pct} % cannot be met: the best reachable is "
                              "+0.00 % (the exact setting); use a value >= 0")
        if self.agreement is not None and not (math.isfinite(self.agreement) and 0 <= self.agreement <= 1):
            raise ConfigError(f"a greedy agreement >= {self.agreement} cannot be met: the best reachable is 1.000 "
                              "(the exact setting); use a value in [0, 1]")

    def met(self, ppl_pct: float, agreement: float) -> bool:
        return ((self.ppl_pct is None or ppl_pct <= self.ppl_pct + 1e-9)
                and (self.agreement is None or agreement >= self.agreement - 1e-9))

    def words(self) -> str:
        parts = []
        if self.ppl_pct is not None:
            parts.append(f"perplexity +{self.ppl_pct:g} % at most")
        if self.agreement is not None:
            parts.append(f"greedy agreement {self.agreement:g} at least")
        return " and ".join(parts)


CONFIRM_PROMPTS = ("held-out", "chat")


@dataclass(frozen=True)
class Confirm:
    """The confirmation sample: a lossy setting is only within the budget once its quality also holds on
    ``max_tokens`` teacher-forced tokens and ``n_prompts`` prompts x ``new_tokens`` greedy tokens (a small screening
    sample misjudges perplexity changes of 1-2 %, and greedy agreement over a few tokens per prompt runs high:
    divergence comes later, see the module's docstring).

    ``new_tokens``: the length of the replies the pick is for; None: the base settings' max_new_tokens (what a
    generation with them may reply). ``prompts``: "held-out" (openings of held-out texts, as the screening's) or
    "chat" (held-out chat requests through the model's chat template, as a chat sends them). ``max_settings``: how
    many settings it re-measures at most. ``data``: a `tools.quality.EvalSet` instead (its prompts as they are)."""

    max_tokens: int = 512
    n_prompts: int = 8
    new_tokens: int | None = None
    max_settings: int = 3
    prompts: str = "held-out"
    data: object = None

    def __post_init__(self) -> None:
        def whole(v) -> bool:
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)

        if not (whole(self.max_tokens) and whole(self.n_prompts) and whole(self.max_settings)
                and (self.new_tokens is None or whole(self.new_tokens))):
            raise ConfigError(f"confirmation sample {self}: max_tokens, n_prompts, new_tokens and max_settings are "
                              "whole numbers (new_tokens may be None)")
        if (self.max_tokens < 16 or self.n_prompts < 1 or (self.new_tokens is not None
                                                            and not 1 <= self.new_tokens <= MAX_NEW_TOKENS_LIMIT)
                or self.max_settings < 1):
            raise ConfigError(f"confirmation sample {self}: use >= 16 tokens, >= 1 prompt, 1 to {MAX_NEW_TOKENS_LIMIT} "
                              "new tokens and >= 1 setting (checked now, not after the screening)")
        if self.prompts not in CONFIRM_PROMPTS:
            raise ConfigError(f"confirmation prompts {self.prompts!r}: use one of {', '.join(CONFIRM_PROMPTS)}")


@dataclass(frozen=True)
class Setting:
    """The knobs the tuner searches (the rest of RunSettings is the caller's)."""

    tau_approx: float = 0.0
    tau_prefetch: float = 0.2
    max_lookahead: int = 4
    lore_rank: int = 4
    cpu_lane: bool = True

    def words(self) -> str:
        lane = "on" if self.cpu_lane else "off"
        approx = f"tau_approx {self.tau_approx:g} (LoRE rank {self.lore_rank})" if self.tau_approx > 0 else \
            "tau_approx 0 (exact)"
        return f"{approx}, tau_prefetch {self.tau_prefetch:g}, max lookahead {self.max_lookahead}, CPU lane {lane}"

    def at_least_as_lossy_as(self, other: "Setting") -> bool:
        """Approximates at least as much as ``other`` (a larger or equal tau_approx, a smaller or equal LoRE rank, the
        same exact knobs): its quality is expected to be no better."""
        return (replace(self, tau_approx=other.tau_approx, lore_rank=other.lore_rank) == other
                and self.tau_approx >= other.tau_approx and self.lore_rank <= other.lore_rank)




@dataclass(frozen=True)
class Trial:
    setting: Setting
    speed_ms: float                 # modeled ms per token, or measured TPOT (TuneRecord.speed_timing says which)
    ppl_pct: float                  # perplexity increase over the exact model (0 for exact settings: not measured)
    agreement: float                # greedy agreement with the exact model (1 for exact settings)
    stage: str                      # "exact" (speed only) or "lossy" (speed and quality measured)
    met: bool                       # the screening's verdict (True for exact settings)
    confirm_ppl_pct: float | None = None     # re-measured on the confirmation sample (None: not re-measured)
    confirm_agreement: float | None = None
    verdict: str = ""               # EXACT, HELD, FAILED, RULED_OUT, UNCONFIRMED or MISSED

    def __post_init__(self) -> None:
        if not self.verdict:
            object.__setattr__(self, "verdict", EXACT if self.stage == "exact" else UNCONFIRMED if self.met else MISSED)


def next_to_confirm(trials: Sequence[Trial], exact_ms: float) -> Trial | None:
    """The setting the confirmation re-measures next, from plain trials: among those that passed the screening, are
    not yet decided and are faster than both the fastest exact setting (``exact_ms``) and every one that held, the
    least lossy while none has been re-measured (its failure rules out all others), else the median by speed (a
    bisection: a hold leaves only faster ones, a failure rules out the lossier ones). None: nothing left to decide.
    "Faster" means by more than SAME_SPEED_REL."""
    held_ms = min((t.speed_ms for t in trials if t.verdict == HELD), default=math.inf)
    bar_ms = min(exact_ms, held_ms) * (1 - SAME_SPEED_REL)
    open_ = sorted((t for t in trials if t.verdict == UNCONFIRMED and t.speed_ms < bar_ms),
                   key=lambda t: (t.speed_ms, t.setting.tau_approx, -t.setting.lore_rank))
    if not open_:
        return None
    if not any(t.verdict in (HELD, FAILED) for t in trials):
        return min(open_, key=lambda t: (t.setting.tau_approx, -t.setting.lore_rank, t.speed_ms))
    return open_[(len(open_) - 1) // 2]


def rule_out(trials: Sequence[Trial], failed: Setting) -> list[Trial]:
    """``trials`` with every undecided setting at least as lossy as ``failed`` marked RULED_OUT."""
    return [replace(t, verdict=RULED_OUT) if t.verdict == UNCONFIRMED and t.setting.at_least_as_lossy_as(failed)
            else t for t in trials]


def _speed_words(engine, base: RunSettings) -> str:
    if engine.timing == "measured":
        return f"measured ({engine.lm.device})"
    return f"modeled (profile {engine.machine.profile_key(base.profile)}, shape {base.shape})"


class Tuner:
    """One search for one engine and base settings (model, cache, profile, shape and the reply length,
    ``max_new_tokens``, come from ``base``)."""

    def __init__(self, engine, base: RunSettings, budget: Budget, *, max_tokens: int = 128, n_prompts: int = 3,
                 new_tokens: int = 16, speed_tokens: int = 64, progress: Callable[[str, int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, data=None,
                 confirm: "Confirm | Mapping | None" = Confirm()) -> None:
        """``data``: a `tools.quality.EvalSet` to screen quality on (default: the model's held-out text,
        ``max_tokens`` teacher-forced tokens and ``n_prompts`` prompts x ``new_tokens`` greedy tokens).
        ``confirm``: re-measure the settings that passed the screening on a larger sample, with greedy generations as
        long as the replies, before one is within the budget (`Confirm`, or a mapping of its fields; default: its
        defaults); None: the pick stands on the screening sample alone (its record says it is not confirmed)."""
        from spice_core.tools import quality as q

        self.engine, self.budget = engine, budget
        self.base = replace(base, policy="spice", temperature=0.0, tau_int8=0.0)   # int8 runs are not searched yet
        engine._validate(self.base)
        self.q = q
        self.progress = progress or (lambda msg, done, total: None)
        self.should_stop = should_stop or (lambda: False)
        self.data = data or q.eval_set(engine, max_tokens=max_tokens,
                                       window=min(max_tokens, engine.lm.max_context_tokens), n_prompts=n_prompts,
                                       prompt_tokens=16)
        self.new_tokens, self.speed_tokens = new_tokens, speed_tokens
        lore = engine.artifacts.lore if engine.artifacts is not None else None
        self.ranks = () if lore is None else tuple(sorted({r for r in LORE_RANKS if r <= lore.max_rank} | {lore.max_rank}))
        self.lane_choices = (True, False)       # the lane is real on a GPU host and modeled elsewhere
        self._trials: dict[Setting, Trial] = {}
        self._ref = None
        if isinstance(confirm, Mapping):
            unknown = sorted(set(confirm) - set(Confirm.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"confirmation sample: unknown field(s) {', '.join(unknown)}: use "
                                  f"{', '.join(Confirm.__dataclass_fields__)}")
            confirm = Confirm(**confirm)
        self.confirm = confirm
        self.reply_tokens = 0 if self.confirm is None else (self.confirm.new_tokens or self.base.max_new_tokens)
        self._confirm_data = self._confirm_ref = None
        self._planned = (len(TAU_PREFETCH_VALUES) + len(MAX_LOOKAHEAD_VALUES) + len(self.lane_choices) - 2
                         + len(self.ranks) * len(TAU_APPROX_VALUES)
                         + (self.confirm.max_settings if self.confirm is not None and self.ranks else 0))

    # ------------------------------------------------------------------ measuring one setting
    def _run_settings(self, s: Setting) -> RunSettings:
        return replace(self.base, **asdict(s))

    def _done(self) -> int:
        return len(self._trials) + sum(t.confirm_agreement is not None for t in self._trials.values())

    def _speed(self, s: Setting, forced_ms: float | None) -> float:
        """Modeled: the teacher-forced pass's median step. Measured (a GPU): a generation's median TPOT."""
        if self.engine.timing != "measured" and forced_ms is not None:
            return forced_ms
        if self.engine.timing != "measured":
            window = list(self.data.windows[0])[: self.speed_tokens + 1]
            steps = self.q.forced_pass(self.engine, window, self._run_settings(s)).step_ms[1:]
            return sorted(steps)[len(steps) // 2] if steps else 0.0
        prompt = list(self.data.prompts[0])
        run = self.engine.start_ids(prompt, replace(self._run_settings(s), max_new_tokens=max(8, self.new_tokens)))
        for _ in run:
            pass
        return float(self.engine.get_summary(run.run_id).tpot_ms_median)

    def _measure(self, s: Setting, stage: str) -> Trial:
        if s in self._trials:
            return self._trials[s]
        if stage == "exact":
            t = Trial(s, self._speed(s, None), 0.0, 1.0, stage, True)
        else:
            if self._ref is None:
                self.progress("measuring the exact model's reference (teacher-forced logits, greedy tokens)",
                              self._done(), self._planned)
                self._ref = self.q.exact_reference(self.engine, self.data, self.new_tokens, base=self.base,
                                                   should_stop=self.should_stop)
            rep = self.q.evaluate(self.engine, self._run_settings(s), self._ref, should_stop=self.should_stop)
            t = Trial(s, self._speed(s, rep.step_ms_median), rep.ppl_delta_pct, rep.greedy_agreement, stage,
                      self.budget.met(rep.ppl_delta_pct, rep.greedy_agreement))
        self._trials[s] = t
        screened = "passes the screening" if self.confirm is not None else "meets the budget"
        clock = "measured" if self.engine.timing == "measured" else "modeled"
        self.progress(f"{s.words()}: {t.speed_ms:.2f} ms {clock}"
                      + (f", perplexity {t.ppl_pct:+.2f} %, agreement {t.agreement:.3f}"
                         f" ({screened if t.met else 'misses the budget'})" if stage == "lossy" else " (exact)"),
                      self._done(), self._planned)
        return t

    # ------------------------------------------------------------------ the search
    def run(self) -> TuneRecord:
        t0 = time.perf_counter()
        try:
            stopped = self._search()
        except self.q.Stopped:          # Stop inside a quality pass: the setting it measured is not kept
            stopped = True
        return self._record(time.perf_counter() - t0, stopped)

    def _search(self) -> bool:
        """Stages 1 to 3 (module docstring) into ``self._trials``; returns whether ``should_stop`` ended them."""
        stopped = False
        b = self.base
        best = Setting(tau_approx=0.0, tau_prefetch=b.tau_prefetch, max_lookahead=b.max_lookahead,
                       lore_rank=self.ranks[-1] if self.ranks else b.lore_rank, cpu_lane=b.cpu_lane)
        # Stage 1: exact settings, one knob at a time, speed only.
        for knob, values in (("tau_prefetch", TAU_PREFETCH_VALUES), ("max_lookahead", MAX_LOOKAHEAD_VALUES),
                             ("cpu_lane", self.lane_choices)):
            trials = []
            for v in values:
                if self.should_stop():
                    stopped = True
                    break
                trials.append(self._measure(replace(best, **{knob: v}), "exact"))
            if trials:      # a tie (within SAME_SPEED_REL) keeps the knob where it was: the user's own first
                fastest = min(t.speed_ms for t in trials)
                best = min((t for t in trials if t.speed_ms <= fastest * (1 + SAME_SPEED_REL)),
                           key=lambda t: (t.setting != best, t.speed_ms)).setting
            if stopped:
                break
        # Stage 2: lossy settings from stage 1's best, rank by rank, tau_approx ascending until one fails.
        for rank in self.ranks if not stopped else ():
            for tau in TAU_APPROX_VALUES:
                if self.should_stop():
                    stopped = True
                    break
                if not self._measure(replace(best, tau_approx=tau, lore_rank=rank), "lossy").met:
                    break
            if stopped:
                break
        if self.confirm is not None and not stopped:
            stopped = self._confirm_stage()
        return stopped

    # ------------------------------------------------------------------ confirming
    def _confirm_reference(self):
        c = self.confirm
        if self._confirm_ref is None:
            self.progress(f"measuring the exact model's reference on the confirmation sample (replies of "
                          f"{self.reply_tokens} tokens)", self._done(), self._planned)
            if c.data is not None:
                self._confirm_data = c.data
            else:
                self._confirm_data = self.q.eval_set(
                    self.engine, max_tokens=c.max_tokens, window=min(c.max_tokens, self.engine.lm.max_context_tokens),
                    n_prompts=c.n_prompts, prompt_tokens=16, chat_prompts=c.prompts == "chat")
            self._confirm_ref = self.q.exact_reference(self.engine, self._confirm_data, self.reply_tokens,
                                                       base=self.base, should_stop=self.should_stop)
        return self._confirm_ref

    def _confirm_stage(self) -> bool:
        """Stage 3: settings that passed the screening re-measured on the confirmation sample, in the order
        `next_to_confirm` gives, at most ``confirm.max_settings``; each held or failed, and a failure rules out the
        lossier ones (`rule_out`). Returns whether it was stopped."""
        exact_ms = min((t.speed_ms for t in self._trials.values() if t.stage == "exact"), default=math.inf)
        for _ in range(self.confirm.max_settings):
            t = next_to_confirm(list(self._trials.values()), exact_ms)
            if t is None:
                return False
            ref = self._confirm_reference()
            if self.should_stop():
                return True
            self.progress(f"re-measuring {t.setting.words()} on replies of {self.reply_tokens} tokens",
                          self._done(), self._planned)
            rep = self.q.evaluate(self.engine, self._run_settings(t.setting), ref, should_stop=self.should_stop)
            held = self.budget.met(rep.ppl_delta_pct, rep.greedy_agreement)
            self._trials[t.setting] = replace(t, confirm_ppl_pct=rep.ppl_delta_pct,
                                              confirm_agreement=rep.greedy_agreement, verdict=HELD if held else FAILED)
            if not held:
                self._trials = {x.setting: x for x in rule_out(list(self._trials.values()), t.setting)}
            self.progress(f"{t.setting.words()}: on replies of {self.reply_tokens} tokens perplexity "
                          f"{rep.ppl_delta_pct:+.2f} %, agreement {rep.greedy_agreement:.3f} "
                          f"({'holds' if held else 'fails'})", self._done(), self._planned)
        return False

    # ------------------------------------------------------------------ the record
    def _record(self, tune_s: float, stopped: bool) -> TuneRecord:
        trials = list(self._trials.values())
        confirming = self.confirm is not None
        usable = [t for t in trials if t.verdict in WITHIN or (not confirming and t.verdict == UNCONFIRMED)]
        if not usable:      # cannot happen with a valid budget once one exact setting ran; stopped before that
            raise ConfigError("the tuner was stopped before it measured any setting: run it again")
        # Speeds within SAME_SPEED_REL of the fastest are a tie (review: eight exact settings modeled at the same ms,
        # and the first measured, tau_prefetch 0.05, replaced the user's 0.2 for nothing): among them the least
        # lossy, then the one with the user's own knobs, then the fastest.
        fastest = min(t.speed_ms for t in usable)
        tied = [t for t in usable if t.speed_ms <= fastest * (1 + SAME_SPEED_REL)]
        b = self.base
        own = lambda t: (t.setting.tau_prefetch, t.setting.max_lookahead, t.setting.cpu_lane) == \
            (b.tau_prefetch, b.max_lookahead, b.cpu_lane)    # noqa: E731
        pick = min(tied, key=lambda t: (t.setting.tau_approx, t.ppl_pct, -t.agreement, not own(t), t.speed_ms))
        confirmed = pick.verdict == HELD
        return TuneRecord(
            model=self.engine.lm.name, policy="spice",
            profile=self.engine.machine.profile_key(self.base.profile), shape=self.base.shape,
            cache_frac=self.base.cache_frac,
            budget={"ppl_pct": self.budget.ppl_pct, "agreement": self.budget.agreement},
            setting=asdict(pick.setting), speed_ms=pick.speed_ms, speed_timing=_speed_words(self.engine, self.base),
            ppl_pct=pick.confirm_ppl_pct if confirmed else pick.ppl_pct,
            agreement=pick.confirm_agreement if confirmed else pick.agreement,
            quality_measured_on=self._sample_words(self.data, self.new_tokens),
            confirmed_on=(self._sample_words(self._confirm_data, self.reply_tokens)     # only once a setting was
                          if self._confirm_data is not None and any(t.confirm_agreement is not None for t in trials)
                          else ""),                                  # re-measured there (a Stop may come first)
            reason=self._reason(pick, trials, stopped), trials=[self._trial_dict(t) for t in trials],
            stopped=stopped, tune_s=round(tune_s, 2), seed=self.base.seed, confirmed=confirmed,
            reply_tokens=self.reply_tokens, calibration=calibration_digest(self.engine.artifacts))

    def _reason(self, pick: Trial, trials: list[Trial], stopped: bool) -> str:
        exact_best = min((t for t in trials if t.stage == "exact"), key=lambda t: t.speed_ms)
        failed, ruled = [t for t in trials if t.verdict == FAILED], [t for t in trials if t.verdict == RULED_OUT]
        open_ = [t for t in trials if t.verdict == UNCONFIRMED and t.speed_ms < pick.speed_ms * (1 - SAME_SPEED_REL)]
        replies = f"replies of {self.reply_tokens} tokens"
        plural = lambda n, one, many: one if n == 1 else many    # noqa: E731
        if pick.stage == "lossy":
            held = pick.verdict == HELD
            ppl, agr = (pick.confirm_ppl_pct, pick.confirm_agreement) if held else (pick.ppl_pct, pick.agreement)
            reason = (f"the fastest setting within {self.budget.words()}: {pick.speed_ms:.2f} ms against "
                      f"{exact_best.speed_ms:.2f} ms for the fastest exact one, at perplexity {ppl:+.2f} % and greedy "
                      f"agreement {agr:.3f}" + (f" on the confirmation sample ({replies})" if held else ""))
        elif not any(t.stage == "lossy" for t in trials):
            reason = (f"the fastest exact setting ({pick.speed_ms:.2f} ms); " +
                      ("stopped before any approximating setting was measured" if stopped and self.ranks else
                       "no LoRE factors for the model: only exact settings can run"))
        elif failed and not open_:
            reason = (f"the exact setting (tau_approx 0, {pick.speed_ms:.2f} ms): no approximating setting keeps "
                      f"{self.budget.words()} on {replies}")
        else:
            reason = (f"the fastest exact setting ({pick.speed_ms:.2f} ms); no approximating setting was found "
                      f"faster within the budget ({sum(t.stage == 'lossy' for t in trials)} tried)")
        if failed:
            reason += (f"; {len(failed)} that passed the short screening failed "
                       + ("there" if replies in reason else f"on {replies}")
                       + (f", which rules out {len(ruled)} lossier {plural(len(ruled), 'one', 'ones')}" if ruled
                          else ""))
        if self.confirm is None and pick.stage == "lossy":
            reason += ("; not confirmed: measured on the short screening sample only, so not known to be within the "
                       "budget on longer replies")
        elif open_ and self.confirm is not None and not stopped:
            reason += (f"; {len(open_)} faster {plural(len(open_), 'setting', 'settings')} passed the screening but "
                       f"{plural(len(open_), 'was', 'were')} not re-measured (at most {self.confirm.max_settings} "
                       "are)")
        if stopped:
            reason += " (stopped early: the best of what was measured)"
        return reason

    @staticmethod
    def _trial_dict(t: Trial) -> dict:
        return {**asdict(t.setting), "speed_ms": t.speed_ms, "ppl_pct": t.ppl_pct, "agreement": t.agreement,
                "stage": t.stage, "met": t.met, "verdict": t.verdict,
                **({"confirm_ppl_pct": t.confirm_ppl_pct, "confirm_agreement": t.confirm_agreement}
                   if t.confirm_agreement is not None else {})}

    def _sample_words(self, data, new_tokens: int) -> str:
        where = "the CPU path of this engine" if self.engine.lm.device.type == "cpu" else f"this engine ({self.engine.lm.device})"
        n = len(data.prompts)
        return (f"{sum(len(w) - 1 for w in data.windows)} teacher-forced tokens and {n} prompt{'' if n == 1 else 's'} "
                f"x {new_tokens} greedy tokens of {data.source}, on {where}")


def tune(engine, base: RunSettings, budget: Budget, **kw) -> TuneRecord:
    """The fastest `spice` setting within ``budget`` for ``engine``'s model at ``base``'s cache, profile and shape,
    on replies of ``base.max_new_tokens`` tokens (see `Tuner`)."""
    return Tuner(engine, base, budget, **kw).run()
