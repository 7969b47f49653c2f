"""SpiceEngine: the one generator every front end drives (CLI, app, benchmarks).

    SpiceEngine.load(model, device) ─► LoadedModel (experts in HostStore, rest on device; float32 on the CPU)
    start_prompt / start_chat / start_ids ─► GenerationRun (run.py: the loop, an iterator of StepStats)
        per run: build_runtime (assembly.py) ─► LayerRuntime(LayerPlanner (policy state, decisions), an executor
                 (slots sized from the budget, copy stream, CPU lane, LoRE), clock (modeled or measured), Recorder,
                 predictor)
        per token: runtime.begin_token ─► model forward (OffloadedExperts call runtime.run_layer) ─► sample
                   ─► end_token ─► the recorder's TokenRecord ─► StepStats
    finished runs ─► RunRegistry ─► summaries, events, exports

Not thread-safe by design: one generation at a time (a second concurrent start raises
`EngineBusyError`); front ends queue requests. Knows nothing of Gradio.
"""
from __future__ import annotations

import gc
import inspect
import logging
import os
import threading
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import torch

from spice_core.assembly import build_runtime
from spice_core.config import LANE_OFFERS, POLICIES, RunSettings, check_copy_issue, checked_int
from spice_core.records import EngineInfo, RunSummary, StepStats
from spice_core.errors import ConfigError, ContextError, PromptError, SpiceError, quoted
from spice_core.exec.experts import installed
from spice_core.generation import build_prompt_ids, check_prompt_ids, prompt_id_list
from spice_core.machine import Machine
from spice_core.model.loader import LoadedModel, cache_kwarg, load_model, resolve_device
from spice_core.model.shipped import model_argument
from spice_core.policy.planner import check_prefetch_admission
from spice_core.policy.spec import get_spec
from spice_core.predictor.artifacts import calibration_digest, check_artifacts_folder, load_artifacts_if_present
from spice_core.runtime.layer import LayerRuntime
from spice_core.run import EngineBusyError, GenerationRun, RunRecord
from spice_core.timing.costs import CostModel
from spice_core.timing.profiles import ModelShape, get_profile, get_shape, profile_names, shape_names
from spice_core.timing.timeline import ModeledTimeline
from spice_core.types import ExpertKey
from spice_core.units import format_bytes, round_up

log = logging.getLogger(__name__)
MAX_RUNS_KEPT = 32
MAX_RETAINED_BYTES = 512 * 2**20   # kept runs' events and steps together (estimated); the oldest runs go first
# One TraceEvent, or one outcome / prefetch / interval of a StepStats, in memory: measured with tracemalloc on the
# shipped model (spice, 64 and 200 tokens: 193 and 182 bytes per item, everything the kept run holds included;
# tests/engine/test_run_memory.py). It was 600, 3.3x too high: the budget kept a third of the runs it could.
ITEM_BYTES_ESTIMATE = 200


def record_bytes(rec: "RunRecord") -> int:
    """Estimated memory of a kept run (a 480-token run holds ~500k items: ~95 MB)."""
    items = len(rec.events) + sum(1 + len(s.outcomes) + len(s.prefetches) + len(s.intervals) for s in rec.steps)
    return ITEM_BYTES_ESTIMATE * items


def check_lane_offer(value: str) -> str:
    if value not in LANE_OFFERS:
        raise ConfigError(f"lane_offer={value!r}: use one of {', '.join(LANE_OFFERS)}")
    return value


class SpiceEngine:
    _running_id = ""          # the id of the run that holds the engine (run.GenerationRun sets it), "" when none

    def __init__(self, lm: LoadedModel, *, timing: str | None = None, hw_profile=None,
                 link_gbps: float | None = None, prefetch_after_experts: bool | None = None,
                 host_aware: bool = True, executor: str = "auto", lane_offer: str = "auto",
                 prefetch_admission: str = "exact", copy_issue: str = "direct") -> None:
        """``executor``: "auto" (the graphed fast path for decode steps on CUDA with measured timing, when
        the run's features allow it; eager otherwise), "eager" (per-expert PyTorch calls, per-expert trace
        detail) or "graphed" (ask for the fast path anywhere; on the CPU it runs the same step op by op).
        ``hw_profile``: the calibrated profile whose costs drive decisions in measured mode.
        ``link_gbps``: emulate a slower host-to-device link (measured mode) by pacing copies.
        ``prefetch_after_experts``: plan prefetches after launching a layer's experts (default:
        when timing is measured, see runtime/layer.py).
        ``lane_offer``: "auto" offers the real CPU lane to spice-like policies only where one CPU expert beats a
        copy over the link (`lane_pays`); "always" on any link (an A/B of that rule).
        ``prefetch_admission``: "exact" (spice and other approximating policies prefetch only experts whose
        predicted router weight reaches tau_approx) or "all" (an A/B of that rule; policy/planner.py).
        ``copy_issue``: how slot copies are issued on CUDA, "direct" or "torch" (config.COPY_ISSUES)."""
        self.lane_offer, self.copy_issue = check_lane_offer(lane_offer), check_copy_issue(copy_issue)
        self.prefetch_admission = check_prefetch_admission(prefetch_admission)
        self.lm = lm
        # Where and how runs execute, resolved once (machine.py): every timing, profile, link and executor question.
        self.machine = Machine.resolve(lm.device.type, timing, hw_profile=hw_profile, link_gbps=link_gbps,
                                       host_aware=host_aware, executor=executor)
        self.prefetch_after_experts = prefetch_after_experts
        self._sleep_cycles_per_ms = 0.0
        self._lock = threading.Lock()
        self._lock_owner: int | None = None   # the thread iterating the run that holds `_lock` (run.GenerationRun)
        self._runs: OrderedDict[str, RunRecord] = OrderedDict()
        self._runs_lock = threading.Lock()    # the registry: written by the generating thread, read by any
        self._runs_bytes: dict[str, int] = {}
        self._fwd_cache_kw = cache_kwarg(lm.model)
        cfg = lm.model.config
        shared = 0
        for name in ("n_shared_experts",):
            if getattr(cfg, name, None):
                shared = int(cfg.n_shared_experts) * lm.layout.intermediate
        if getattr(cfg, "shared_expert_intermediate_size", None):
            shared = int(cfg.shared_expert_intermediate_size)
        self.native_shape = ModelShape(
            name="native", hidden=lm.layout.hidden, expert_intermediate=lm.layout.intermediate,
            shared_intermediate=shared, dense_intermediate=int(getattr(cfg, "intermediate_size", 0) or 0),
            attention_params=self._attention_params(), dtype_bytes=lm.expert_bytes // lm.layout.numel,
            source="the loaded model's own dimensions")
        self.artifacts = None    # calibration artifacts (draft heads, LoRE), see load_artifacts
        self._cpu_lane = None
        self._cpu_lane_error = ""
        self._int8_store = None   # the experts' int8 copy, made by the first run that may take cpu_int8

    @classmethod
    def load(cls, model: str | Path | None = None, device: str | None = None, dtype: torch.dtype | None = None,
             artifacts: str | Path | None = None, **kw) -> "SpiceEngine":
        """``dtype`` None: the checkpoint's, except on the CPU, where a half-precision checkpoint computes in
        float32 (several times faster there) and keeps its own dtype for byte accounting and modeled times.
        ``artifacts``: the folder of the model's calibration artifacts (`calibrate --out`), when not beside it."""
        model = cls._check_load_args(model, device, artifacts, kw)     # before the model loads (seconds to minutes)
        if artifacts is not None:
            check_artifacts_folder(artifacts, model)
        engine = cls(load_model(model, device, dtype, float32_on_cpu=True), **kw)
        engine.load_artifacts(artifacts)
        # What is alive once the model is loaded (~430k objects with the shipped model) is kept out of the cyclic
        # collector's reach (as vLLM does), or each full collection walks it again (~0.3 s on 2 cores) mid-generation.
        gc.collect()
        gc.freeze()
        return engine

    @classmethod
    def _check_load_args(cls, model, device, artifacts, kw: dict):
        """`load`'s arguments checked as the engine will check them, before any loading; returns the model as the
        loader takes it (a shipped model's name, as the command line takes it, becomes its folder)."""
        for name, value in (("model", model), ("artifacts", artifacts)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                also = ", a shipped model's name or a hub id" if name == "model" else ""
                raise ConfigError(f"{name}={quoted(value)}: pass a folder (str or Path){also}, or None")
        params = inspect.signature(cls.__init__).parameters
        allowed = set(params) - {"self", "lm"}
        unknown = sorted(set(kw) - allowed)
        if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):     # a subclass taking **kw: its own
            raise ConfigError(f"SpiceEngine.load: unknown argument(s) {', '.join(unknown)}: use {', '.join(sorted(allowed))}")
        check_lane_offer(kw.get("lane_offer", "auto"))
        check_copy_issue(kw.get("copy_issue", "direct"))
        check_prefetch_admission(kw.get("prefetch_admission", "exact"))
        Machine.resolve(resolve_device(device).type, kw.get("timing"), hw_profile=kw.get("hw_profile"),
                        link_gbps=kw.get("link_gbps"), host_aware=kw.get("host_aware", True),
                        executor=kw.get("executor", "auto"))
        return model_argument(model, flag="model") if isinstance(model, str) else model

    def _attention_params(self) -> int:
        layer = self.lm.model.model.layers[self.lm.moe_layers[0]]
        return sum(p.numel() for p in layer.self_attn.parameters())

    def load_artifacts(self, folder: str | Path | None = None) -> None:
        """Draft heads and LoRE factors beside the model (or in ``folder``), when calibrated (optional)."""
        self.artifacts = load_artifacts_if_present(self.lm, folder and check_artifacts_folder(folder, self.lm))

    # ------------------------------------------------------------------ info
    def info(self) -> EngineInfo:
        lm = self.lm
        return EngineInfo(
            model_name=lm.name, family=lm.family.name, n_layers=lm.n_layers, moe_layers=lm.moe_layers,
            n_experts=lm.n_experts, top_k=lm.top_k, expert_bytes=lm.expert_bytes, device=lm.device.type,
            default_timing=self.timing, policies=POLICIES, profiles=profile_names(), shapes=shape_names(),
            has_draft=bool(self.artifacts and self.artifacts.draft is not None),
            has_lore=bool(self.artifacts and self.artifacts.lore is not None),
            max_context_tokens=lm.max_context_tokens, lore_ranks=self._lore_ranks(), model_dir=str(lm.path),
            calibration=calibration_digest(self.artifacts))

    def _lore_ranks(self) -> tuple[int, ...]:
        lore = self.artifacts.lore if self.artifacts else None
        if lore is None:
            return ()
        return tuple(r for r in (1, 2, 4, 8, 16, 32, 64) if r < lore.max_rank) + (lore.max_rank,)

    @property
    def routed_bytes(self) -> int:
        return self.lm.routed_bytes

    def min_cache_bytes(self) -> int:
        return self.lm.top_k * self.lm.expert_bytes

    # ------------------------------------------------------------------ runs
    def start_prompt(self, prompt: str, settings: RunSettings) -> "GenerationRun":
        self._validate(settings)
        return self.start_ids(build_prompt_ids(self.lm.tokenizer, prompt=prompt), settings)

    def start_chat(self, messages: list[dict], settings: RunSettings, *, min_reply_tokens: int = 1) -> "GenerationRun":
        """``min_reply_tokens``: refuse (`ContextError`, a PromptError) a conversation that leaves the reply less room
        than this in the model's context (a chat front end that leaves out old exchanges asks for room to answer in)."""
        self._validate(settings)
        return self.start_ids(build_prompt_ids(self.lm.tokenizer, messages=messages), settings,
                              min_reply_tokens=min_reply_tokens)

    def start_ids(self, input_ids: list[int], settings: RunSettings, *, min_reply_tokens: int = 1) -> "GenerationRun":
        input_ids = prompt_id_list(input_ids)
        if not input_ids:
            raise PromptError("the prompt is empty: pass some text")
        check_prompt_ids(input_ids, self.lm.model.get_input_embeddings().num_embeddings)
        ctx, n = self.lm.max_context_tokens, len(input_ids)
        if n >= ctx:
            raise ContextError(f"the prompt is {n} tokens but the model's context is {ctx} tokens: "
                               "shorten the prompt (or start a new chat)")
        min_reply_tokens = checked_int("min_reply_tokens", min_reply_tokens, 1, None)
        if ctx - n < min_reply_tokens:
            raise ContextError(f"the prompt is {n} tokens, which leaves {ctx - n} of the model's {ctx}-token context "
                               f"for the reply, fewer than the {quoted(min_reply_tokens)} asked: shorten the prompt "
                               "(or start a new chat)")
        self._validate(settings)
        return GenerationRun(self, list(input_ids), settings)

    def _validate(self, s: RunSettings) -> None:
        if not isinstance(s, RunSettings):
            raise ConfigError(f"settings is a {type(s).__name__}: pass a RunSettings (RunSettings(**fields) from a "
                              "dict of its fields)")
        get_spec(s.policy)
        get_profile(s.profile)
        get_shape(s.shape, self.native_shape)
        if s.policy != "resident":
            budget = s.cache_frac * self.routed_bytes
            need_bytes = self.min_cache_bytes()
            if budget < need_bytes:
                need_frac = need_bytes / self.routed_bytes
                raise ConfigError(
                    f"cache budget {format_bytes(budget)} is smaller than one layer's top-{self.lm.top_k} experts "
                    f"({format_bytes(need_bytes)}): raise --cache-frac to >= {round_up(need_frac)} "
                    f"or --cache-gb to >= {round_up(need_bytes / 1e9)}")

    def _register(self, rec: RunRecord) -> None:
        size = record_bytes(rec)
        with self._runs_lock:
            self._runs[rec.run_id] = rec
            self._runs_bytes[rec.run_id] = size
            while len(self._runs) > 1 and (len(self._runs) > self.max_runs_kept
                                           or sum(self._runs_bytes.values()) > self.max_retained_bytes):
                old, _ = self._runs.popitem(last=False)
                self._runs_bytes.pop(old, None)

    max_retained_bytes = MAX_RETAINED_BYTES     # what the kept runs may hold together (estimated)
    max_runs_kept = MAX_RUNS_KEPT               # and how many they may be

    def run_bytes(self, run_id: str) -> int:
        """What a kept run holds (the estimate the retention budget counts); 0 for an unknown or running one."""
        with self._runs_lock:
            return self._runs_bytes.get(run_id, 0)

    def forget_run(self, run_id: str) -> bool:
        """Drop a kept run now (its steps and events); False when it is unknown. For callers that share the
        budget out, e.g. per visitor: the engine itself only drops the oldest runs."""
        with self._runs_lock:
            self._runs_bytes.pop(run_id, None)
            return self._runs.pop(run_id, None) is not None

    def list_runs(self) -> list[RunSummary]:
        with self._runs_lock:
            return [r.summary for r in reversed(self._runs.values()) if r.summary is not None]

    def _record(self, run_id: str) -> RunRecord:
        with self._runs_lock:
            rec = self._runs.get(run_id) if isinstance(run_id, str) else None
        if rec is None:
            why = "is still generating: its summary, steps and exports come once it ends" \
                if run_id == self._running_id else "is unknown or expired: pick one from the run list"
            raise SpiceError(f"run {str(run_id)[:64]!r} {why}")
        return rec

    def get_summary(self, run_id: str) -> RunSummary:
        return self._record(run_id).summary

    def get_steps(self, run_id: str) -> list[StepStats]:
        return list(self._record(run_id).steps)

    def get_events(self, run_id: str) -> list:
        return list(self._record(run_id).events)

    def get_record(self, run_id: str) -> RunRecord:
        return self._record(run_id)

    def baselines(self, run_id: str) -> dict[str, float]:
        """Modeled ms per decode token of resident, on_demand and lru over this run's own routing, with the
        cost model its decisions used (timing/whatif.py): the run beside its baselines. Always *modeled*."""
        from spice_core.timing.whatif import REPLAYABLE, replay_tpot_ms, routing_of

        rec = self._record(run_id)
        routing = routing_of(rec.steps)
        if len(routing) < 2:
            return {}
        costs = self._costs(rec.settings, fast=self.machine.fast_path())
        lm = self.lm
        return {p: replay_tpot_ms(routing, p, costs, moe_layers=lm.moe_layers, n_layers=lm.n_layers,
                                  n_experts=lm.n_experts, top_k=lm.top_k, cache_frac=rec.settings.cache_frac,
                                  native_expert_bytes=lm.expert_bytes, prompt_tokens=len(rec.prompt_ids))
                for p in REPLAYABLE}

    def export_chrome_trace(self, run_id: str, out_dir: Path, gzipped: bool = False) -> Path:
        """The run's Chrome trace for Perfetto: ``.trace.json``, or ``.trace.json.gz`` (Perfetto opens both)."""
        from spice_core.trace.export import write_chrome_trace

        rec = self._record(run_id)
        name = f"spice-{run_id}.trace.json" + (".gz" if gzipped else "")
        return write_chrome_trace(rec.events, Path(out_dir) / name, metadata=self._metadata(rec))

    def export_chrome_trace_gz(self, run_id: str, out_dir: Path) -> Path:
        return self.export_chrome_trace(run_id, out_dir, gzipped=True)

    def export_tensorboard_zip(self, run_id: str, out_dir: Path) -> Path:
        """The run as a TensorBoard logdir of one run, zipped: only the zip is left in ``out_dir``."""
        from spice_core.trace.tensorboard import write_tensorboard_zip

        rec = self._record(run_id)
        return write_tensorboard_zip(rec.events, Path(out_dir) / f"spice-{run_id}-tensorboard.zip",
                                     run_name=f"spice-{run_id}", metadata=self._metadata(rec))

    def export_csv(self, run_id: str, out_dir: Path) -> Path:
        from spice_core.trace.export import write_per_token_csv

        rec = self._record(run_id)
        return write_per_token_csv(rec.steps, Path(out_dir) / f"spice-{run_id}-per-token.csv")

    def _metadata(self, rec: RunRecord) -> dict:
        s = rec.settings
        return {"run_id": rec.run_id, "model": self.lm.name, "policy": s.policy, "timing": self.timing,
                "profile": s.profile if self.timing == "modeled" else "this machine", "shape": s.shape,
                "cache_frac": s.cache_frac, "tau_prefetch": s.tau_prefetch, "tau_approx": s.tau_approx,
                "tau_int8": s.tau_int8, "max_lookahead": s.max_lookahead, "lore_rank": s.lore_rank,
                "cpu_lane": s.cpu_lane, "temperature": s.temperature, "seed": s.seed,
                "max_new_tokens": s.max_new_tokens, "prompt_tokens": len(rec.prompt_ids), "n_tokens": len(rec.steps),
                # how the run ended ("cancelled": the trace stops there) and what the engine said of it (the fast
                # path or not, a lane left off, a fallback)
                "finish_reason": rec.summary.finish_reason if rec.summary is not None else "not finished",
                "notes": list(rec.summary.notes if rec.summary is not None else rec.notes)}

    # ------------------------------------------------------------------ the machine, as the engine's callers see it
    @property
    def timing(self) -> str:
        return self.machine.timing

    @property
    def hw_profile(self):
        return self.machine.hw_profile

    @property
    def link_gbps(self) -> float | None:
        return self.machine.link_gbps

    @property
    def host_aware(self) -> bool:
        return self.machine.host_aware

    @property
    def executor_kind(self) -> str:
        return self.machine.executor

    # ------------------------------------------------------------------ runtime construction
    def _costs(self, s: RunSettings, fast: bool = False) -> CostModel:
        """What the run's planner believes (and, modeled, what the clock charges): measured runs decide with
        the machine's decision profile at the native shape; modeled runs time the named profile and shape."""
        if self.machine.timing == "measured":
            return CostModel(self.machine.decision_profile(fast), self.native_shape)
        return CostModel(self.machine.modeled_profile(s.profile), get_shape(s.shape, self.native_shape))

    def _timeline(self, costs: CostModel, modeled: bool):
        if self.machine.run_timing(modeled) == "modeled":
            return ModeledTimeline(costs, native_expert_bytes=self.lm.expert_bytes, cpu_workers=1)
        from spice_core.timing.measured import MeasuredTimeline

        return MeasuredTimeline(self.lm.device, torch.cuda.Stream(self.lm.device), est_copy_ms=costs.copy_ms())

    def _link_pacing(self) -> dict:
        """Link emulation (measured mode): extra copy-stream time per byte, as executor arguments."""
        extra = self.machine.pace_extra_ms_per_byte()
        if not extra:
            return {}
        from spice_core.timing.measured import sleep_cycles_per_ms

        if not self._sleep_cycles_per_ms:
            self._sleep_cycles_per_ms = sleep_cycles_per_ms(self.lm.device)
        return {"pace_extra_ms_per_byte": extra, "sleep_cycles_per_ms": self._sleep_cycles_per_ms}

    def _wants_fast_path(self, modeled: bool) -> bool:
        return self.machine.fast_path(modeled)

    def build_runtime(self, s: RunSettings, *, notes: list, oracle_routing=None, modeled: bool = False,
                      max_cache_len: int | None = None, eager: bool = False) -> LayerRuntime:
        """The run's runtime (assembly.py). ``max_cache_len``: tokens the run may hold (prompt + new), which sizes
        the fast path's StaticCache; ``eager`` forces the eager executor."""
        return build_runtime(self, s, notes=notes, oracle_routing=oracle_routing, modeled=modeled,
                             max_cache_len=max_cache_len, eager=eager)

    def int8_store(self):
        """The int8 weight-only copy of every routed expert (memory/int8_store.py), made on first use and kept."""
        if self._int8_store is None:
            from spice_core.memory.int8_store import Int8HostStore

            self._int8_store = Int8HostStore(self.lm.host)
            log.info("int8 copy of %d routed experts: %.1f MB, made in %.2f s", len(self._int8_store),
                     self._int8_store.total_bytes / 1e6, self._int8_store.build_s)
        return self._int8_store

    def _get_cpu_lane(self):
        if self._cpu_lane is None:
            from spice_core.exec.cpu_lane import lane_from_shape
            try:
                self._cpu_lane = lane_from_shape()
            except SpiceError as e:
                self._cpu_lane_error = str(e)
                log.warning("%s", e)
                return None
        return self._cpu_lane

    def _popular_experts(self) -> list[ExpertKey]:
        """Static placement for cpu_compute (Fiddler): most popular experts first, from the
        calibration statistics when present, else spread evenly over layers."""
        if self.artifacts is not None and getattr(self.artifacts, "popularity", None) is not None:
            return list(self.artifacts.popularity)
        keys = []
        for e in range(self.lm.n_experts):
            for layer in self.lm.moe_layers:
                keys.append(ExpertKey(layer, e))
        return keys

    @torch.no_grad()
    def logits_for(self, input_ids: list[int], s: RunSettings) -> torch.Tensor:
        """Teacher-forced logits [T,V] of one forward pass over ``input_ids`` under a policy
        (modeled timing; for quality metrics and exactness checks)."""
        if not self._lock.acquire(blocking=False):
            raise EngineBusyError("the engine is busy with another generation: wait for it to finish or stop it")
        try:
            self._validate(s)
            rt = self.build_runtime(s, notes=[], modeled=True)
            from transformers import DynamicCache

            with installed(self.lm, rt):
                rt.begin_token(0)
                cache = DynamicCache(config=self.lm.model.config)
                out = self.lm.model(input_ids=torch.tensor([input_ids], device=self.lm.device), use_cache=True,
                                    **{self._fwd_cache_kw: cache})
                rt.end_token()
            return out.logits[0].float()
        finally:
            self._lock.release()

    def record_routing(self, input_ids: list[int], s: RunSettings, forced: list[int] | None = None) -> dict:
        """The exact routing of a generation (for the oracle): (token, layer) -> selected experts. ``forced``: the
        tokens a teacher-forced run will be fed (`GenerationRun.forced_ids`), so the probe follows the same path."""
        routing: dict[tuple[int, int], tuple[int, ...]] = {}
        probe = replace(s, policy="lru", cache_frac=max(s.cache_frac, self.min_cache_bytes() / self.routed_bytes))
        # The same executor as the run it serves: the fast path's expert kernel rounds differently from the
        # eager one, so routing recorded on one would not be the other's exact future.
        run = GenerationRun(self, input_ids, probe, modeled=not self._wants_fast_path(False), register=False)
        run.forced_ids = forced

        def observe(layer, idx_rows, w_rows):
            routing[(run.token_index, layer)] = tuple(sorted({e for row in idx_rows for e in row}))

        run.observers.append(observe)
        for _ in run:
            pass
        return routing
