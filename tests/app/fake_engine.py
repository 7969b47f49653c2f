"""A fake engine for app tests: implements `spice_core.api.EngineLike` without a model.

It produces plausible StepStats (outcomes per routed selection, prefetch records, lane
intervals, modeled step times that depend on the policy, cache size, thresholds and hardware
profile), deterministic text from the prompt, lossy tokens when approximation is on (so a sweep
shows a speed–quality trade-off), trace events and the three exports. It sleeps
``token_delay_s`` per token to stand in for compute.

It makes up what happens but never how it is counted: each routed selection's outcome goes
through the engine's own Recorder (trace/recorder.py: the outcome and its trace instant in one
call) and the summary through trace.metrics, so the pages tested on it see exactly the accounting
the real engine produces. Beyond that it knows nothing of the engine's internals; it honours the
contract in `spice_core.api` (errors are `SpiceError`s with one-line messages, `cancel()` and
`update_settings()` act between tokens, one generation at a time: like the real engine, a
generation holds the engine while it is iterated, so one started and never iterated costs nothing).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import random
import threading
import time
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

from spice_core.api import (EXACT_POLICIES, POLICIES, EngineInfo, LaneInterval, PrefetchRecord,
                            RunSettings, RunSummary, StepStats)
from spice_core.errors import ConfigError, ContextError, PromptError, SpiceError
from spice_core.trace.events import CPU_INT8_OUTCOME, CPU_INT8_RUN, TraceEvent
from spice_core.trace.metrics import summarize
from spice_core.trace.recorder import Recorder

PROFILES = {"h200-pcie5x16": 0.31, "a800-pcie4x16": 0.7, "rtx4090-pcie4x16": 0.7,
            "rtx5090-pcie4x8": 1.3, "rtx4060-pcie4x8": 1.3}          # ms to copy one DeepSeek-V2-Lite expert
SHAPES = {"deepseek-v2-lite": 1.0, "qwen2-57b-a14b": 3.2, "native": 0.05}   # expert size relative to DS-V2-Lite
PREDICTOR_RECALL = {"oracle_prefetch": 1.0, "spice_prefetch": 0.85, "spice": 0.85, "spice_no_lore": 0.85,
                    "spice_no_cpu": 0.85, "gate_prefetch": 0.65}
CPU_POLICIES = ("cpu_compute", "spice", "spice_no_lore")
LIVE_FIELDS = ("tau_prefetch", "tau_approx", "max_lookahead")
WORDS = ("the", "expert", "router", "token", "cache", "copy", "layer", "quietly", "moves", "while", "a",
         "model", "thinks", "of", "tea", "and", "stories", "river", "light", "small", "garden", "over")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode("utf-8", "replace"))


@dataclass
class _Run:
    run_id: str
    settings: RunSettings
    steps: list[StepStats] = field(default_factory=list)
    events: list[TraceEvent] = field(default_factory=list)
    summary: RunSummary | None = None


class FakeGeneration:
    def __init__(self, engine: "FakeEngine", run: _Run, prompt: str, prompt_tokens: int) -> None:
        self.run_id = run.run_id
        self._engine = engine
        self._run = run
        self._prompt = prompt
        self._prompt_tokens = prompt_tokens
        self._settings = run.settings
        self._cancel = threading.Event()
        self._cache: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._diverged_at: int | None = None
        self._finish = ""
        self._released = True            # holds the engine only while it is iterated, like the real engine
        self.settings_log: list[tuple[int, RunSettings]] = [(0, run.settings)]
        self._clock_ms = 0.0
        self._copy_free = 0.0

    # --- protocol ------------------------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._engine._busy.release()

    def update_settings(self, settings: RunSettings) -> None:
        frozen = [f for f in RunSettings.__dataclass_fields__
                  if f not in LIVE_FIELDS and getattr(settings, f) != getattr(self._settings, f)]
        if frozen:
            raise ConfigError(f"{frozen[0]} cannot change during a generation: it applies from the next message")
        self._settings = settings
        self.settings_log.append((len(self._run.steps), settings))

    def summary(self) -> RunSummary:
        if self._run.summary is None:
            self._run.summary = self._engine._summarize(self._run, self._finish or "cancelled")
        return self._run.summary

    def __iter__(self):
        if not self._engine._busy.acquire(blocking=False):
            self._engine.concurrent_violations += 1
            raise SpiceError("another generation is running: the engine runs one at a time")
        self._released = False
        try:
            time.sleep(self._engine.prefill_delay_s)
            for index in range(self._settings.max_new_tokens):
                if self._cancel.is_set():
                    self._finish = "cancelled"
                    return
                if index == self._engine.fail_at_token:
                    self._finish = "error"
                    raise RuntimeError("simulated engine bug")
                step = self._step(index)
                time.sleep(self._engine.token_delay_s)
                self._run.steps.append(step)
                yield step
                if step.finished:
                    return
            self._finish = "length"
        finally:
            if not self._finish:
                self._finish = "cancelled"
            self._run.summary = self._engine._summarize(self._run, self._finish)
            self._release()

    # --- simulation ----------------------------------------------------------------------
    def _step(self, index: int) -> StepStats:
        s, eng = self._settings, self._engine
        rng = random.Random(_crc(f"{self._prompt}|{index}|{s.policy}|{s.cache_frac}"))
        copy_ms = PROFILES.get(s.profile, 0.7) * SHAPES.get(s.shape, 1.0)
        cpu_ms = 1.0 * SHAPES.get(s.shape, 1.0)
        layer_ms = 0.25 + (0.4 * self._prompt_tokens / 100 if index == 0 else 0.0)
        capacity = eng.n_experts * len(eng.moe_layers)
        capacity = capacity if s.policy == "resident" else int(s.cache_frac * capacity)
        recall = PREDICTOR_RECALL.get(s.policy, 0.0)
        lossy = s.policy not in EXACT_POLICIES and s.tau_approx > 0
        cpu_ok = s.cpu_lane and s.policy in CPU_POLICIES
        t0 = self._clock_ms
        t = t0 + 0.05
        copy_free = max(t, self._copy_free)          # lanes stay busy across tokens (wasted prefetches)
        cpu_free = {f"cpu{i}": max(t, self._copy_free) for i in range(2)}
        prefetches, intervals, events = [], [], []
        recorder = Recorder(_InstantClock(events, index, lambda: t), eng.expert_bytes)
        outcomes = recorder.token.outcomes
        layer_start: dict[int, float] = {}
        hits = misses = approx_n = 0
        bytes_copied = 0
        stall_total = 0.0
        depths = []

        def add(lane, kind, a, b, layer=-1, expert=-1, nbytes=0):
            intervals.append(LaneInterval(lane, kind, a, b, layer, expert))
            events.append(TraceEvent(index, layer, expert, lane, kind, a, b, nbytes, "modeled"))

        for layer in range(eng.n_layers):
            layer_start[layer] = t
            add("gpu", "layer", t, t + layer_ms, layer)
            t += layer_ms
            if layer not in eng.moe_layers:
                continue
            depth = min(s.max_lookahead, 1 + rng.randrange(3))
            depths.append(depth)
            chosen = rng.sample(range(eng.n_experts), eng.top_k)
            ready = t
            for expert in sorted(chosen):
                key = (layer, expert)
                if s.policy == "resident" or key in self._cache:
                    outcome = "hit"
                    self._cache.move_to_end(key, last=True) if key in self._cache else None
                elif recall and rng.random() < recall and rng.uniform(0.3, 1.0) >= s.tau_prefetch:
                    outcome = "prefetch_hit"
                    issued_layer = max(eng.moe_layers[0], layer - depth)
                    issued = max(layer_start.get(issued_layer, t0), copy_free)
                    arrived = issued + copy_ms
                    copy_free = arrived
                    add("copy", "prefetch", issued, arrived, layer, expert, eng.expert_bytes)
                    prefetches.append(PrefetchRecord(layer, expert, issued_layer, issued, arrived,
                                                     layer_start[layer], round(rng.uniform(0.5, 1.0), 3)))
                    bytes_copied += eng.expert_bytes
                    ready = max(ready, arrived)
                    self._insert(key, capacity)
                elif lossy and rng.random() < s.tau_approx:
                    outcome = "approx"
                    approx_n += 1
                elif s.tau_int8 > 0 and s.policy == "spice" and s.cpu_lane and rng.random() < s.tau_int8:
                    outcome = CPU_INT8_OUTCOME          # the lossy int8 CPU run: on the lane, in half an exact one
                    lane = min(cpu_free, key=cpu_free.get)
                    a = max(cpu_free[lane], t)
                    add(lane, CPU_INT8_RUN, a, a + cpu_ms / 2, layer, expert)
                    cpu_free[lane] = a + cpu_ms / 2
                    ready = max(ready, a + cpu_ms / 2)
                elif cpu_ok and cpu_ms < copy_ms or s.policy == "cpu_compute":
                    outcome = "cpu"
                    lane = min(cpu_free, key=cpu_free.get)
                    a = max(cpu_free[lane], t)
                    add(lane, "cpu_run", a, a + cpu_ms, layer, expert)
                    cpu_free[lane] = a + cpu_ms
                    ready = max(ready, a + cpu_ms)
                else:
                    outcome = "copy"
                    a = max(copy_free, t)
                    add("copy", "copy", a, a + copy_ms, layer, expert, eng.expert_bytes)
                    copy_free = a + copy_ms
                    bytes_copied += eng.expert_bytes
                    ready = max(ready, copy_free)
                    self._insert(key, capacity)
                hits += outcome in ("hit", "prefetch_hit")
                misses += outcome not in ("hit", "prefetch_hit")
                recorder.outcome(layer, expert, outcome)      # the engine's own channel: outcome + trace instant
            if recall and rng.random() < 0.3 and s.tau_prefetch < 0.8:   # a wasted speculative copy
                later = min(eng.n_layers - 1, layer + depth)
                a = copy_free
                copy_free = a + copy_ms
                add("copy", "prefetch", a, copy_free, later, rng.randrange(eng.n_experts), eng.expert_bytes)
                prefetches.append(PrefetchRecord(later, intervals[-1].expert, layer, a, copy_free, None, 0.25))
                bytes_copied += eng.expert_bytes
            if ready > t:
                add("gpu", "stall", t, ready, layer)
                stall_total += ready - t
                t = ready
            for expert in sorted(chosen):
                add("gpu", "expert", t, t + 0.02, layer, expert)
                t += 0.02
        t_end = t + 0.05
        add("host", "token", t0, t_end)
        self._clock_ms = t_end
        self._copy_free = max([copy_free, *cpu_free.values()])
        if self._diverged_at is None and approx_n and rng.random() < 1 - 0.9 ** approx_n:
            self._diverged_at = index
        stream = random.Random(_crc(self._prompt) + index * 7919 + (0 if self._diverged_at is None
                                                                   else 104729 * (self._diverged_at + 1)))
        word = stream.choice(WORDS)
        text = (" " if index else "") + word + ("." if stream.random() < 0.12 else "")
        token_id = WORDS.index(word) + 3
        finished = self._engine.eos_after is not None and index + 1 >= self._engine.eos_after
        if finished:
            self._finish = "eos"
        elif s.stop and any(stop in text for stop in s.stop):
            finished, self._finish = True, "stop"
        elif index + 1 >= s.max_new_tokens:
            finished, self._finish = True, "length"
        self._run.events.extend(events)
        return StepStats(index=index, token_id=token_id, text=text, step_ms=t_end - t0, timing="modeled",
                         hits=hits, misses=misses, bytes_copied=bytes_copied, stall_ms=stall_total,
                         lookahead_depth=sum(depths) / max(1, len(depths)), outcomes=tuple(outcomes),
                         prefetches=tuple(prefetches), intervals=tuple(intervals), finished=finished,
                         finish_reason=self._finish if finished else "")

    def _insert(self, key, capacity: int) -> None:
        if capacity <= 0:
            return
        self._cache[key] = None
        while len(self._cache) > capacity:
            self._cache.popitem(last=False)


class FakeEngine:
    """EngineLike test double. ``token_delay_s`` is the wall time per token."""

    def __init__(self, *, n_layers: int = 8, n_experts: int = 16, top_k: int = 4, token_delay_s: float = 0.005,
                 prefill_delay_s: float = 0.0, eos_after: int | None = None, max_context_tokens: int = 1024,
                 max_runs: int = 64, fail_at_token: int | None = None, model_dir: str = "") -> None:
        self.n_layers, self.n_experts, self.top_k = n_layers, n_experts, top_k
        self.moe_layers = tuple(range(1, n_layers))
        self.expert_bytes = 3 * 256 * 128 * 2
        self.token_delay_s, self.prefill_delay_s = token_delay_s, prefill_delay_s
        self.eos_after = eos_after
        self.max_context_tokens = max_context_tokens
        self.max_runs = max_runs
        self.fail_at_token = fail_at_token      # raise a RuntimeError (an engine bug) at this token
        self.model_dir = model_dir              # the model's folder (EngineInfo.model_dir): "" none
        self.generations: list[FakeGeneration] = []
        self.concurrent_violations = 0          # a generation started while another one ran
        self._busy = threading.Semaphore(1)
        self._runs: OrderedDict[str, _Run] = OrderedDict()
        self._next_id = 1

    def info(self) -> EngineInfo:
        return EngineInfo(model_name="fake-moe (test double)", family="deepseek_v2", n_layers=self.n_layers,
                          moe_layers=self.moe_layers, n_experts=self.n_experts, top_k=self.top_k,
                          expert_bytes=self.expert_bytes, device="cpu", default_timing="modeled",
                          policies=POLICIES, profiles=tuple(PROFILES), shapes=tuple(SHAPES),
                          has_draft=True, has_lore=True, max_context_tokens=self.max_context_tokens,
                          model_dir=self.model_dir)

    def start_chat(self, messages: list[dict], settings: RunSettings, *, min_reply_tokens: int = 1) -> FakeGeneration:
        if not messages:
            raise PromptError("The conversation is empty: send a message first.")
        lines = []
        for m in messages:
            if m.get("role") not in ("system", "user", "assistant") or not isinstance(m.get("content"), str):
                raise PromptError("Each message needs a role (system, user or assistant) and text content.")
            lines.append(f"{m['role']}: {m['content']}")
        if not messages[-1]["content"].strip():
            raise PromptError("The last message is empty: type something to send.")
        prompt = "\n".join(lines) + "\nassistant:"
        n_tokens = len(prompt) // 4 + 1
        if n_tokens <= self.max_context_tokens and self.max_context_tokens - n_tokens < min_reply_tokens:
            raise ContextError(f"The prompt is {n_tokens} tokens, which leaves fewer than {min_reply_tokens} for the reply.")
        return self.start_prompt(prompt, settings)

    def start_prompt(self, prompt: str, settings: RunSettings) -> FakeGeneration:
        if not isinstance(settings, RunSettings):
            raise ConfigError("settings must be a RunSettings")
        if not prompt.strip():
            raise PromptError("The prompt is empty: type something to send.")
        n_tokens = len(prompt) // 4 + 1
        if n_tokens > self.max_context_tokens:
            raise ContextError(f"The prompt is {n_tokens} tokens; the model reads at most "
                               f"{self.max_context_tokens}: shorten it or start a new chat.")
        run = _Run(f"run-{self._next_id:04d}", settings)
        self._next_id += 1
        self._runs[run.run_id] = run
        while len(self._runs) > self.max_runs:
            self._runs.popitem(last=False)
        gen = FakeGeneration(self, run, prompt, n_tokens)
        self.generations.append(gen)
        return gen

    # --- finished runs -------------------------------------------------------------------
    def list_runs(self) -> list[RunSummary]:
        """Newest first, like the real engine."""
        return [r.summary for r in reversed(self._runs.values()) if r.summary is not None]

    def _run(self, run_id: str) -> _Run:
        run = self._runs.get(run_id)
        if run is None or run.summary is None:
            raise SpiceError(f"run {run_id!r} is unknown or still running: pick one from the list of finished runs")
        return run

    def get_summary(self, run_id: str) -> RunSummary:
        return self._run(run_id).summary

    def get_events(self, run_id: str) -> list[TraceEvent]:
        return list(self._run(run_id).events)

    def get_steps(self, run_id: str) -> list[StepStats]:
        return list(self._run(run_id).steps)

    def baselines(self, run_id: str) -> dict:
        """Illustrative only: the fake's own TPOT scaled (the real engine replays the routing, timing/whatif.py)."""
        tpot = self._summarize(self._run(run_id), "").tpot_ms_median
        return {"resident": 0.5 * tpot, "on_demand": 2.0 * tpot, "lru": 1.3 * tpot} if tpot else {}

    def export_chrome_trace_gz(self, run_id: str, out_dir: Path) -> Path:
        plain = self.export_chrome_trace(run_id, out_dir)
        gz = plain.with_name(plain.name + ".gz")
        gz.write_bytes(gzip.compress(plain.read_bytes()))
        plain.unlink()
        return gz

    def export_chrome_trace(self, run_id: str, out_dir: Path) -> Path:
        run = self._run(run_id)
        lanes = sorted({e.lane for e in run.events})
        trace = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": i + 1, "args": {"name": lane}}
                 for i, lane in enumerate(lanes)]
        for e in run.events:
            base = {"name": e.kind if e.expert < 0 else f"{e.kind} L{e.layer}E{e.expert}", "cat": "spice",
                    "pid": 1, "tid": lanes.index(e.lane) + 1, "ts": round(e.start_ms * 1000, 3),
                    "args": e.as_dict()}
            if e.end_ms > e.start_ms:
                trace.append(base | {"ph": "X", "dur": round((e.end_ms - e.start_ms) * 1000, 3)})
            else:
                trace.append(base | {"ph": "i", "s": "t"})
        path = Path(out_dir) / f"{run_id}.trace.json"
        path.write_text(json.dumps({"traceEvents": trace, "displayTimeUnit": "ms",
                                    "otherData": {"run_id": run_id, "timing": "modeled"}}))
        return path

    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path:
        chrome = json.loads(self.export_chrome_trace(run_id, out_dir).read_text())
        path = Path(out_dir) / f"{run_id}-tensorboard.zip"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr(f"{run_id}/spice.pt.trace.json.gz", gzip.compress(json.dumps(chrome).encode()))
        return path

    def export_csv(self, run_id: str, out_dir: Path) -> Path:
        run = self._run(run_id)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["index", "token_id", "text", "step_ms", "hit_selections", "miss_selections", "bytes_copied",
                         "stall_ms"])
        for s in run.steps:
            writer.writerow([s.index, s.token_id, s.text, s.step_ms, s.hits, s.misses, s.bytes_copied, s.stall_ms])
        path = Path(out_dir) / f"{run_id}-tokens.csv"
        path.write_text(buf.getvalue())
        return path

    def _summarize(self, run: _Run, finish: str) -> RunSummary:
        """The engine's own definitions (trace.metrics), over the fake's steps."""
        return summarize(run.steps, run_id=run.run_id, policy=run.settings.policy, timing="modeled",
                         profile=run.settings.profile, shape=run.settings.shape,
                         notes=("fake engine: numbers are illustrative",), text="".join(s.text for s in run.steps),
                         finish_reason=finish)


class _InstantClock:
    """What the real Recorder needs of a clock to write outcome instants into the fake's events."""

    def __init__(self, events: list, token: int, now) -> None:
        self.events, self.token, self.now = events, token, now

    def mark(self, kind, key, nbytes=0, detail="", lane="gpu") -> None:
        t = self.now()
        layer, expert = (key.layer, key.expert) if key is not None else (-1, -1)
        self.events.append(TraceEvent(self.token, layer, expert, lane, kind, t, t, nbytes, "modeled", detail))


def settings(**overrides) -> RunSettings:
    return replace(RunSettings(), **overrides)
