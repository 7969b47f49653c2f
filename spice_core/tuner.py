"""The tuner: the fastest `spice` setting whose measured quality meets a budget.

    budget (perplexity increase <= X %, greedy agreement >= Y)
      stage 1, exact (tau_approx 0: quality is the exact model's, nothing to measure):
         coordinate search over tau_prefetch, max_lookahead and the CPU lane, speed only
      stage 2, lossy, from stage 1's best: for each LoRE rank (ascending), tau_approx ascending,
         speed and quality from the same teacher-forced pass; a rank stops at its first failure
      ─► the fastest setting that met the budget (ties: the better quality) ─► TuneRecord

Why this and not a grid: the exact knobs change speed only, so stage 1 skips every quality
measurement; the lossy knob's quality falls as tau_approx rises (more misses approximated), so once
one value fails a rank, larger ones are not tried; every setting is measured once (a cache keyed by
the setting). Quality is measured on held-out text on the CPU (`tools.quality`: teacher-forced
perplexity, greedy agreement, the project's definitions); speed is the *modeled* ms per
teacher-forced step (one decode-like token per forward pass, the same pass as the quality), or on a
GPU with measured timing, the *measured* TPOT of a generation. Every number says which.

The record and its file beside the model are `spice_core.tuned`. Knows nothing of pages or the CLI: progress goes to a callback, `should_stop` ends the search
early (the best so far is kept, marked stopped).
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

from spice_core.config import RunSettings
from spice_core.errors import ConfigError
from spice_core.tuned import TuneRecord, find, save, tuned_path  # noqa: F401 - the record and its file, re-exported

DEFAULT_BUDGET_PPL_PCT = 1.0
DEFAULT_BUDGET_AGREEMENT = 0.9
TAU_PREFETCH_VALUES = (0.05, 0.1, 0.2, 0.3, 0.5)
MAX_LOOKAHEAD_VALUES = (1, 2, 4, 8)
TAU_APPROX_VALUES = (0.02, 0.05, 0.1, 0.15, 0.2)     # the chat accepts [0, 0.2]
LORE_RANKS = (2, 4, 8, 16)


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


@dataclass(frozen=True)
class Confirm:
    """The confirmation sample: a lossy setting is only picked once its quality also holds on ``max_tokens``
    teacher-forced tokens and ``n_prompts`` prompts x ``new_tokens`` greedy tokens (a small screening sample
    misjudges perplexity changes of 1-2 %, and greedy agreement over a few tokens per prompt runs high: divergence
    comes later). ``max_settings``: how many settings it re-measures at most before it keeps the exact one."""

    max_tokens: int = 512
    n_prompts: int = 8
    new_tokens: int = 32
    max_settings: int = 3
    data: object = None             # a `tools.quality.EvalSet` instead of the model's held-out text (None: that text)

    def __post_init__(self) -> None:
        if self.max_tokens < 16 or self.n_prompts < 1 or self.new_tokens < 1 or self.max_settings < 1:
            raise ConfigError(f"confirmation sample {self}: use >= 16 tokens, >= 1 prompt, >= 1 new token and "
                              ">= 1 setting")


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


@dataclass(frozen=True)
class Trial:
    setting: Setting
    speed_ms: float                 # modeled ms per token, or measured TPOT (TuneRecord.speed_timing says which)
    ppl_pct: float                  # perplexity increase over the exact model (0 for exact settings: not measured)
    agreement: float                # greedy agreement with the exact model (1 for exact settings)
    stage: str                      # "exact" (speed only) or "lossy" (speed and quality measured)
    met: bool
    confirm_ppl_pct: float | None = None     # re-measured on the confirmation sample (None: not re-measured)
    confirm_agreement: float | None = None


def _speed_words(engine, base: RunSettings) -> str:
    if engine.timing == "measured":
        return f"measured ({engine.lm.device})"
    return f"modeled (profile {base.profile}, shape {base.shape})"


class Tuner:
    """One search for one engine and base settings (model, cache, profile, shape come from ``base``)."""

    def __init__(self, engine, base: RunSettings, budget: Budget, *, max_tokens: int = 128, n_prompts: int = 3,
                 new_tokens: int = 16, speed_tokens: int = 64, progress: Callable[[str, int, int], None] | None = None,
                 should_stop: Callable[[], bool] | None = None, data=None, confirm: "Confirm | None" = None) -> None:
        """``data``: a `tools.quality.EvalSet` to measure quality on (default: the model's held-out text,
        ``max_tokens`` teacher-forced tokens and ``n_prompts`` prompts x ``new_tokens`` greedy tokens).
        ``confirm``: re-measure the fastest lossy settings that met the budget on a larger sample before one
        is picked (`Confirm`); None: the pick stands on the screening sample alone (its record says so)."""
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
        self.confirm = confirm
        self._confirm_data = self._confirm_ref = None
        self._planned = (len(TAU_PREFETCH_VALUES) + len(MAX_LOOKAHEAD_VALUES) + len(self.lane_choices) - 2
                         + len(self.ranks) * len(TAU_APPROX_VALUES))

    # ------------------------------------------------------------------ measuring one setting
    def _run_settings(self, s: Setting) -> RunSettings:
        return replace(self.base, **asdict(s))

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
                              len(self._trials), self._planned)
                self._ref = self.q.exact_reference(self.engine, self.data, self.new_tokens, base=self.base)
            rep = self.q.evaluate(self.engine, self._run_settings(s), self._ref)
            t = Trial(s, self._speed(s, rep.step_ms_median), rep.ppl_delta_pct, rep.greedy_agreement, stage,
                      self.budget.met(rep.ppl_delta_pct, rep.greedy_agreement))
        self._trials[s] = t
        self.progress(f"{s.words()}: {t.speed_ms:.2f} ms"
                      + (f", perplexity {t.ppl_pct:+.2f} %, agreement {t.agreement:.3f}"
                         f" ({'meets' if t.met else 'misses'} the budget)" if stage == "lossy" else " (exact)"),
                      len(self._trials), self._planned)
        return t

    # ------------------------------------------------------------------ the search
    def run(self) -> TuneRecord:
        t0 = time.perf_counter()
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
            if trials:
                best = min(trials, key=lambda t: (t.speed_ms, asdict(t.setting) != asdict(best))).setting
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
        return self._record(time.perf_counter() - t0, stopped)

    # ------------------------------------------------------------------ confirming the pick
    def _confirm_stage(self) -> bool:
        """Stage 3: the fastest lossy settings that met the budget on the screening sample, fastest first, re-measured
        on the confirmation sample until one holds (at most ``confirm.max_settings``). A setting that fails it no
        longer counts as met, nor does any of its rank at a larger tau_approx with the same other knobs (quality
        falls as tau_approx rises). Returns whether it was stopped."""
        c = self.confirm
        exact_ms = min(t.speed_ms for t in self._trials.values() if t.stage == "exact")
        for _ in range(c.max_settings):
            cands = sorted((t for t in self._trials.values() if t.met and t.stage == "lossy"
                            and t.confirm_ppl_pct is None and t.speed_ms < exact_ms), key=lambda t: t.speed_ms)
            if not cands:
                return False
            if self.should_stop():
                return True
            t = cands[0]
            if self._confirm_ref is None:
                self.progress("measuring the exact model's reference on the confirmation sample", len(self._trials),
                              self._planned)
                self._confirm_data = c.data or self.q.eval_set(
                    self.engine, max_tokens=c.max_tokens, window=min(c.max_tokens, self.engine.lm.max_context_tokens),
                    n_prompts=c.n_prompts, prompt_tokens=16)
                self._confirm_ref = self.q.exact_reference(self.engine, self._confirm_data, c.new_tokens, base=self.base)
            rep = self.q.evaluate(self.engine, self._run_settings(t.setting), self._confirm_ref)
            held = self.budget.met(rep.ppl_delta_pct, rep.greedy_agreement)
            self._trials[t.setting] = replace(t, met=held, confirm_ppl_pct=rep.ppl_delta_pct,
                                              confirm_agreement=rep.greedy_agreement)
            self.progress(f"{t.setting.words()}: on the confirmation sample perplexity {rep.ppl_delta_pct:+.2f} %, "
                          f"agreement {rep.greedy_agreement:.3f} ({'holds' if held else 'fails'})",
                          len(self._trials), self._planned)
            if held:
                return False
            for s, other in list(self._trials.items()):
                if (other.stage == "lossy" and other.met and other.confirm_ppl_pct is None
                        and replace(s, tau_approx=t.setting.tau_approx) == t.setting
                        and s.tau_approx >= t.setting.tau_approx):
                    self._trials[s] = replace(other, met=False)
        return False

    def _record(self, tune_s: float, stopped: bool) -> TuneRecord:
        trials = list(self._trials.values())
        met = [t for t in trials if t.met and (self.confirm is None or t.stage == "exact" or t.confirm_ppl_pct is not None)]
        if not met:      # cannot happen with a valid budget once one exact setting ran; stopped before that
            raise ConfigError("the tuner was stopped before it measured any setting: run it again")
        pick = min(met, key=lambda t: (t.speed_ms, t.ppl_pct, -t.agreement))
        exact_best = min((t for t in trials if t.stage == "exact"), key=lambda t: t.speed_ms)
        if pick.stage == "exact":
            lossy = [t for t in trials if t.stage == "lossy"]
            why = (f"no approximating setting was faster within the budget ({len(lossy)} tried)" if lossy else
                   "no LoRE factors beside the model: only exact settings can run")
            reason = f"the fastest exact setting ({pick.speed_ms:.2f} ms); {why}"
        else:
            reason = (f"the fastest setting within {self.budget.words()}: {pick.speed_ms:.2f} ms against "
                      f"{exact_best.speed_ms:.2f} ms for the fastest exact one, at perplexity {pick.ppl_pct:+.2f} % "
                      f"and greedy agreement {pick.agreement:.3f}")
        confirmed = pick.confirm_ppl_pct is not None
        if confirmed:
            reason += (f"; held on the confirmation sample (perplexity {pick.confirm_ppl_pct:+.2f} %, greedy agreement "
                       f"{pick.confirm_agreement:.3f})")
        failed = [t for t in trials if t.confirm_ppl_pct is not None and not t.met]
        if failed:
            reason += (f"; {len(failed)} faster setting{'s' if len(failed) != 1 else ''} met the budget on the screening "
                       "sample but not on the confirmation sample")
        if self.confirm is None and pick.stage == "lossy":
            reason += "; not confirmed on a larger sample (screening sample only)"
        if stopped:
            reason += " (stopped early: the best of what was measured)"
        return TuneRecord(
            model=self.engine.lm.name, policy="spice",
            profile=self.base.profile, shape=self.base.shape, cache_frac=self.base.cache_frac,
            budget={"ppl_pct": self.budget.ppl_pct, "agreement": self.budget.agreement},
            setting=asdict(pick.setting), speed_ms=pick.speed_ms, speed_timing=_speed_words(self.engine, self.base),
            ppl_pct=pick.confirm_ppl_pct if confirmed else pick.ppl_pct,
            agreement=pick.confirm_agreement if confirmed else pick.agreement,
            quality_measured_on=self._sample_words(self.data, self.new_tokens),
            confirmed_on=(self._sample_words(self._confirm_data, self.confirm.new_tokens)
                          if self._confirm_data is not None else ""),
            reason=reason, trials=[{**asdict(t.setting), "speed_ms": t.speed_ms, "ppl_pct": t.ppl_pct,
                                    "agreement": t.agreement, "stage": t.stage, "met": t.met,
                                    **({"confirm_ppl_pct": t.confirm_ppl_pct, "confirm_agreement": t.confirm_agreement}
                                       if t.confirm_ppl_pct is not None else {})} for t in trials],
            stopped=stopped, tune_s=round(tune_s, 2), seed=self.base.seed)

    def _sample_words(self, data, new_tokens: int) -> str:
        where = "the CPU path of this engine" if self.engine.lm.device.type == "cpu" else f"this engine ({self.engine.lm.device})"
        return (f"{sum(len(w) - 1 for w in data.windows)} teacher-forced tokens and {len(data.prompts)} prompts x "
                f"{new_tokens} greedy tokens of {data.source}, on {where}")


def tune(engine, base: RunSettings, budget: Budget, **kw) -> TuneRecord:
    """The fastest `spice` setting within ``budget`` for ``engine``'s model at ``base``'s cache, profile and shape."""
    return Tuner(engine, base, budget, **kw).run()
