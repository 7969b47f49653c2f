"""GenerationRun: one generation, the loop every front end iterates (an api.Generation).

    engine.start_* ─► GenerationRun ─► iterate: per token, the run's stepper (eager forward over a
        DynamicCache, or the graphed executor's step) with the runtime installed on the experts modules
        ─► sample ─► the recorder's TokenRecord ─► StepStats ─► at the end a RunSummary in the registry

Holds the engine's one-generation lock while it is iterated, up to its last step, which comes once the run is
recorded and the lock released; settings changes arrive between tokens
(`update_settings`), cancellation too. Knows the engine only through what it calls on it.
"""
from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from spice_core.config import LIVE_FIELDS, RunSettings
from spice_core.records import RunSummary, StepStats
from spice_core.errors import ConfigError, EngineBusyError, ModelOutputError, SpiceError  # noqa: F401 - EngineBusyError re-exported
from spice_core.exec.experts import installed
from spice_core.generation import (RepetitionPenalty, TextStreamer, checkpoint_repetition_penalty, sample_next,
                                   unapplied_generation_fields)
from spice_core.policy.spec import get_spec
from spice_core.records import lane_intervals
from spice_core.runtime.graph_exec import cache_bucket
from spice_core.runtime.layer import LayerRuntime
from spice_core.timing.profiles import run_profile_label

log = logging.getLogger(__name__)


@dataclass
class RunRecord:
    run_id: str
    settings: RunSettings
    steps: list = field(default_factory=list)
    events: list = field(default_factory=list)
    summary: RunSummary | None = None
    token_ids: list = field(default_factory=list)
    prompt_ids: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    totals: dict = field(default_factory=dict)





class GenerationRun:
    """One generation: iterate to get StepStats per token. Implements api.Generation."""

    def __init__(self, engine, input_ids: list[int], settings: RunSettings, *,
                 modeled: bool = False, register: bool = True) -> None:
        self.engine = engine
        self.run_id = uuid.uuid4().hex[:10]
        self.settings = settings
        self._pending_settings: RunSettings | None = None
        self._cancel = threading.Event()
        self._modeled = modeled
        self._register = register
        self.input_ids = input_ids
        self.observers: list = []        # routing observers: callables(layer, idx_rows, w_rows) ([T][K] lists)
        self.layer_observers: list = []  # callables(runtime, layer) after each MoE layer
        self.token_index = 0
        # Teacher forcing: after step i the run is fed forced_ids[i] instead of the token it sampled (its logits
        # still come from its own decisions); it runs len(forced_ids) steps. bench's quality passes use it.
        self.forced_ids: list[int] | None = None
        self.record = RunRecord(self.run_id, settings, prompt_ids=list(input_ids))
        self._started = False
        self._iterator: weakref.ref | None = None     # to the `_RunIterator` the consumer holds
        self._context_note = ""
        self._penalty: RepetitionPenalty | None = None      # set when decoding starts
        self.last_logits: torch.Tensor | None = None

    def cancel(self) -> None:
        """Stop before the next token. A run whose consumer is paused between tokens ends now (its iterator is closed:
        the engine is free for the next run and this one is recorded as cancelled); one computing a token ends
        after it."""
        self._cancel.set()
        it = self._iterator() if self._iterator is not None else None
        if it is not None:
            it.close_if_paused()

    def update_settings(self, settings: RunSettings | Mapping) -> None:
        """Thresholds apply from the next token; policy / cache / profile changes from the next message.
        ``settings``: a RunSettings, or a mapping of RunSettings fields to change (checked now, as RunSettings
        checks them: a bad value raises ConfigError here, and the run goes on with what it had)."""
        if isinstance(settings, Mapping):
            unknown = sorted(set(settings) - set(RunSettings.__dataclass_fields__))
            if unknown:
                raise ConfigError(f"update_settings: unknown setting(s) {', '.join(map(str, unknown))}: use "
                                  f"RunSettings' fields ({', '.join(LIVE_FIELDS)} apply from the next token)")
            settings = replace(self._pending_settings or self.settings, **settings)
        elif not isinstance(settings, RunSettings):
            raise ConfigError(f"update_settings takes a RunSettings or a mapping of its fields, not a "
                              f"{type(settings).__name__}")
        self._pending_settings = settings

    def summary(self) -> RunSummary:
        if self.record.summary is None:
            raise SpiceError("the run has not finished yet")
        return self.record.summary

    def __iter__(self):
        if self._started:
            raise SpiceError("a generation can be iterated only once: start a new one")
        self._started = True
        it = _RunIterator(self._iterate())
        self._iterator = weakref.ref(it)      # weak: a consumer that drops its iterator (a break) still ends the run
        return it

    def _iterate(self):
        eng = self.engine
        if not eng._lock.acquire(blocking=False):
            if not self._register and eng._lock_owner == threading.get_ident():
                # An inner pass (the oracle's routing probe) of the run this thread is iterating: it holds the engine.
                last = yield from self._run()
                if last is not None:
                    yield last
                return
            raise EngineBusyError("the engine is busy with another generation: wait for it to finish or stop it")
        eng._lock_owner, eng._running_id = threading.get_ident(), self.run_id
        try:
            last = yield from self._run()
        finally:
            eng._lock_owner, eng._running_id = None, ""
            eng._lock.release()
        if last is not None:          # the step that ends the run, delivered once it is recorded and the engine free
            yield last

    def _apply_pending(self, rt: LayerRuntime) -> None:
        s = self._pending_settings
        if s is None:
            return
        self._pending_settings = None
        rt.set_thresholds(tau_prefetch=s.tau_prefetch, tau_approx=s.tau_approx, max_lookahead=s.max_lookahead)
        self.settings = replace(self.settings, **{f: getattr(s, f) for f in LIVE_FIELDS})

    @torch.inference_mode()
    def _run(self):
        # Inference mode, not just no_grad: no autograd or version-counter work on any op (about a sixth of a
        # decode step on the CPU). Buffers that outlive the run and are written in place are made outside it.
        eng, s, lm = self.engine, self.settings, self.engine.lm
        notes: list[str] = []
        oracle = None
        if get_spec(s.policy).predictor == "oracle":
            oracle = eng.record_routing(self.input_ids, s, forced=self.forced_ids)
            notes.append("oracle_prefetch replays the exact routing recorded in a first pass (an upper bound)")
        rt = eng.build_runtime(s, notes=notes, oracle_routing=oracle, modeled=self._modeled,
                               max_cache_len=cache_bucket(len(self.input_ids) + s.max_new_tokens,
                                                          lm.max_context_tokens))
        rt.observers.extend(self.observers)
        rt.layer_observers.extend(self.layer_observers)
        with installed(lm, rt):
            try:
                return (yield from self._decode(rt, notes))
            finally:                  # finished, failed or cancelled: the run's GPU buffers go now
                rt.executor.close()

    def _decode(self, rt: LayerRuntime, notes: list[str]):
        eng, s, lm = self.engine, self.settings, self.engine.lm
        stepper = rt.executor.stepper()
        streamer = TextStreamer(lm.tokenizer, s.stop)
        eos = _eos_ids(lm)
        room = lm.max_context_tokens - len(self.input_ids)
        if room < s.max_new_tokens and self.forced_ids is None:
            # Said when the run ends: a reply cut here looks like one cut by max_new_tokens otherwise.
            self._context_note = (f"the model's context ({lm.max_context_tokens} tokens) left room for {room} of the "
                                  f"{s.max_new_tokens} new tokens asked after a {len(self.input_ids)}-token prompt")
        max_new = min(s.max_new_tokens, room)
        if self.forced_ids is not None:
            max_new = min(max_new, len(self.forced_ids))
        timing = eng.machine.run_timing(self._modeled)
        self._penalty = self._repetition_penalty(notes)
        try:
            finish, last = yield from self._steps(rt, stepper, streamer, eos, max_new, timing)
        except GeneratorExit:         # closed between tokens: a cancel(), a break, or a dropped iterator
            self._wrap_up(rt, streamer, "cancelled", notes)
            raise
        except BaseException as exc:  # a step failed, or Ctrl-C (KeyboardInterrupt) reached the thread mid-token
            self._wrap_up_failed(rt, streamer, exc, notes)
            raise
        self._wrap_up(rt, streamer, finish, notes)
        return last

    def _wrap_up_failed(self, rt: LayerRuntime, streamer: TextStreamer, exc: BaseException, notes: list[str]) -> None:
        """Record a run that an exception ended mid-token with the tokens it delivered: "cancelled" for Ctrl-C,
        "error" for anything else, the exception in its notes. A wrap-up that fails too (a broken device) leaves the
        run unrecorded rather than hide the first exception."""
        interrupted = isinstance(exc, KeyboardInterrupt)
        what = "interrupted (KeyboardInterrupt)" if interrupted else f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        notes.append(f"the run stopped after {len(self.record.steps)} tokens: {what[:300]}")
        try:
            self._wrap_up(rt, streamer, "cancelled" if interrupted else "error", notes)
        except Exception:         # noqa: BLE001 - the original exception is what the caller must see
            log.warning("run %s: could not record the failed run", self.run_id, exc_info=True)

    def _steps(self, rt: LayerRuntime, stepper, streamer: TextStreamer, eos: set[int], max_new: int, timing: str):
        """Yield the run's StepStats, one per token, but the last; returns why it ended and the last step, which the
        run delivers once it is recorded (`_iterate`): None when no step ended it (a cancel seen between two tokens,
        or no token to make)."""
        forced, wall = self.forced_ids, time.perf_counter
        gen = None                    # the sampler's generator, seeded once the run samples
        cur = list(self.input_ids)
        finish = ""
        steps = self.record.steps
        t_resume = wall()             # when the engine resumed work after the previous token's delivery
        for i in range(max_new):
            if self._cancel.is_set():
                finish = "cancelled"
                break
            self._apply_pending(rt)
            self.token_index = i
            with stepper.context():       # the graphed executor's stream, for this token only
                rt.begin_token(i)
                # Greedy with another token to come: the graphed static step may start the next step early.
                logits = stepper.forward(cur, run_ahead=self.settings.temperature <= 0 and i < max_new - 1
                                         and forced is None)
                if i == 0:
                    _check_finite(logits)
                if gen is None and self.settings.temperature > 0:    # sampling from here on (also when raised
                    gen = torch.Generator().manual_seed(self.settings.seed)   # mid-run): reproducible by the seed
                scores = logits if self._penalty is None else self._penalty(logits)
                tok = sample_next(scores, self.settings.temperature, self.settings.top_p, gen)
                step_ms = rt.end_token()
                self.last_logits = logits.clone() if rt.executor.name == "graphed" else logits
                c = rt.recorder.end_token()
            self.record.token_ids.append(tok)
            events = c.events
            self.record.events.extend(events)
            delta = streamer.push(tok)
            is_eos = tok in eos and forced is None
            if is_eos:
                finish = "eos"
            elif streamer.stopped:
                finish = "stop"
            elif i == max_new - 1:
                finish = "length"
            stall = sum(ev.dur_ms for ev in events if ev.kind == "stall" and ev.token == i)
            intervals = lane_intervals(events)
            # Measured TPOT is what the reader waits: the engine's wall time from resuming after the last token's
            # delivery to this one's, bookkeeping included (the clock's own window, device_ms, ends before the
            # events are resolved, the trace recorded and the text streamed). The consumer's time between
            # tokens is its own. Modeled runs keep the timing model's step.
            engine_ms = (wall() - t_resume) * 1e3
            step = StepStats(index=i, token_id=tok, text="" if is_eos else delta,
                             step_ms=engine_ms if timing == "measured" else step_ms, device_ms=step_ms, timing=timing,
                             hits=c.hits, misses=c.misses, bytes_copied=c.bytes_copied, stall_ms=stall,
                             shape_bytes_copied=c.shape_bytes_copied,
                             lookahead_depth=(sum(c.depths) / len(c.depths)) if c.depths else 0.0,
                             outcomes=tuple(c.outcomes), prefetches=tuple(c.prefetches), intervals=intervals,
                             finished=bool(finish), finish_reason=finish,
                             lookahead_stops=tuple(c.stop_reasons))
            steps.append(step)
            if finish:
                return finish, step
            yield step
            t_resume = wall()
            cur = [tok if forced is None else forced[i]]
            if self._penalty is not None:
                self._penalty.saw(cur[0])
        return finish or "length", None

    def _repetition_penalty(self, notes: list[str]) -> RepetitionPenalty | None:
        """The run's repetition penalty (its setting, else the checkpoint's generation_config, as `generate` does),
        None where it is 1.0; the notes say where it came from, and which of the checkpoint's other generation
        settings that change greedy tokens the engine does not apply."""
        config = getattr(self.engine.lm.model, "generation_config", None)
        asked = self.settings.repetition_penalty
        penalty = checkpoint_repetition_penalty(config) if asked is None else float(asked)
        if asked is None and penalty != 1.0:
            notes.append(f"repetition penalty {penalty:g} from the checkpoint's generation_config, as transformers' "
                         "generate applies it (repetition_penalty=1.0 turns it off)")
        unapplied = unapplied_generation_fields(config)
        if unapplied:
            notes.append(f"the checkpoint's generation_config also sets {', '.join(unapplied)}, which this engine does "
                         "not apply: its tokens may differ from generate's there")
        return None if penalty == 1.0 else RepetitionPenalty(penalty, self.input_ids)

    def _wrap_up(self, rt: LayerRuntime, streamer: TextStreamer, finish: str, notes: list[str]) -> None:
        """The run's notes, totals and summary, and its place in the registry, however it ended."""
        lm, eng = self.engine.lm, self.engine
        if finish == "length" and self._context_note:
            notes.append(self._context_note)
        if rt.totals.get("prefetch_skipped_approx", 0):      # the count is in the record's totals
            notes.append("prefetch admission: confident predictions whose predicted router weight is below tau_approx "
                         "were not copied (their misses are approximated; prefetch_admission=\"all\" copies them)")
        host_totals = host_step_totals(rt.executor)
        if host_totals.get("steps_run_ahead"):
            notes.append(f"fast path: {host_totals['steps_run_ahead']} steps launched before the last one's "
                         f"bookkeeping (run ahead), {host_totals['steps_rolled_back']} of them rolled back for "
                         "another token")
        self.record.notes = notes
        self.record.totals = dict(rt.totals, cache_slots=rt.slots.n_slots,
                                  cache_capacity_bytes=rt.slots.n_slots * lm.expert_bytes,
                                  expert_bytes=lm.expert_bytes, routed_bytes=eng.routed_bytes,
                                  **host_totals, **rt.executor.cpu.lane_totals())
        self._finish(streamer, finish, notes)

    def _finish(self, streamer: TextStreamer, finish: str, notes: list[str]) -> None:
        from spice_core.trace.metrics import summarize

        eng, s = self.engine, self.settings
        timing = eng.machine.run_timing(self._modeled)
        streamer.flush()
        self.record.summary = summarize(
            self.record.steps, run_id=self.run_id, policy=s.policy, timing=timing,
            profile=run_profile_label(eng.machine.hw_profile, s.profile, timing),
            shape=s.shape if timing == "modeled" else "native", notes=tuple(notes), text=streamer.text,
            finish_reason=finish)
        if self._register:
            eng._register(self.record)


class _RunIterator:
    """A run's iterator: its generator, resumed by one thread at a time, so that `GenerationRun.cancel` from another
    thread can close it while its consumer is paused between tokens (closing a generator another thread is resuming
    would fail), and leaves it alone while a token is being computed (the loop sees the cancel next token)."""

    def __init__(self, gen) -> None:
        self._gen, self._mu = gen, threading.Lock()

    def __iter__(self):
        return self

    def __next__(self):
        with self._mu:
            return next(self._gen)

    def close(self) -> None:
        with self._mu:
            self._gen.close()

    def close_if_paused(self) -> None:
        """Close the run if it is paused at a token (a run not started yet sees the cancel at its first step, and is
        recorded then; one computing a token sees it at the next)."""
        if self._mu.acquire(blocking=False):
            try:
                if inspect.getgeneratorstate(self._gen) == inspect.GEN_SUSPENDED:
                    self._gen.close()
            finally:
                self._mu.release()


def host_step_totals(executor) -> dict:
    """The fast path's host time per MoE layer (µs): ``host_critical_us`` between a segment's end and the next
    launch (the GPU idle), ``host_overlap_us`` planned while a launched segment runs (the lookahead). Empty
    for the eager executor, whose host time is not split this way."""
    dec = getattr(executor, "decoder", None)
    if dec is None or not dec.host_layers:
        return {}
    ahead = {"steps_run_ahead": dec.steps_run_ahead, "steps_rolled_back": dec.steps_rolled_back} \
        if dec.steps_run_ahead else {}
    return {"host_layers": dec.host_layers, "host_critical_us": dec.host_s * 1e6 / dec.host_layers,
            "host_overlap_us": dec.overlap_s * 1e6 / dec.host_layers, **ahead}


def _eos_ids(lm) -> set[int]:
    ids = set()
    for src in (getattr(lm.model, "generation_config", None), lm.model.config):
        v = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(v, int):
            ids.add(v)
        elif isinstance(v, (list, tuple)):
            ids.update(int(x) for x in v)
    if lm.tokenizer is not None and lm.tokenizer.eos_token_id is not None:
        ids.add(int(lm.tokenizer.eos_token_id))
    return ids


def _check_finite(logits: torch.Tensor) -> None:
    """The first token's logits must be finite: a checkpoint whose weights are NaN (damaged, with no checksum file to
    catch it at load) otherwise "generates" an empty text. Asked once a run (one reduction and one sync)."""
    if not bool(torch.isfinite(logits).all()):
        raise ModelOutputError("the model's logits for the first token are not finite (NaN or infinity): its weights, "
                               "or its calibration artifacts, are most likely damaged; restore the checkpoint "
                               "(re-download it, or re-train a shipped model) or rebuild them with calibrate")
