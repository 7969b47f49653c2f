"""A run's runtime, assembled from the engine and the run's settings (the engine's `build_runtime`).

    RunSettings ─► spec, costs (the engine's decision profile, or the modeled profile and shape)
      ─► predictor (gate / oracle / the draft's heads) and LoRE, each with the GPU bytes it reserves
      ─► the CPU lane (real on a measured run, priced inline on a modeled one) and whether it is offered
      ─► slots from the budget (without draft and LoRE when they leave no room for one layer's experts)
      ─► LayerPlanner, clock, Recorder ─► GraphExecutor (the fast path) or EagerExecutor ─► LayerRuntime

Every choice that changes what a run does leaves a line in ``notes`` (the run summary shows them). Policy
lives in the planner and the specs; this module only wires the run's parts together.
"""
from __future__ import annotations

import time
from dataclasses import replace

from spice_core.config import DEFAULT_LORE_RANK, RunSettings
from spice_core.errors import ConfigError
from spice_core.policy.cache import cache_slots_for_budget
from spice_core.policy.planner import LayerPlanner
from spice_core.policy.spec import get_spec
from spice_core.predictor.artifacts import rebuild_command
from spice_core.runtime.eager import EagerExecutor
from spice_core.runtime.graph_exec import GraphExecutor
from spice_core.runtime.graphed import GraphCaptureError
from spice_core.runtime.layer import LayerRuntime
from spice_core.timing.costs import CostModel
from spice_core.timing.timeline import ONE_GRAPH_NOTE
from spice_core.trace.recorder import Recorder
from spice_core.units import format_bytes, round_up


def lane_pays(costs: CostModel) -> bool:
    """Does the CPU lane beat a copy of one expert over an idle link (the planner's costs)? Where it does not,
    offering it cost more than it saved (measured, docs/benchmarks/cpu-lane/ab)."""
    return costs.cpu_expert_ms(1) < costs.copy_ms()


def int8_pays(costs: CostModel) -> bool:
    """`lane_pays` for the lossy int8 kernel (half the bytes, the same task overhead)."""
    return costs.cpu_int8_expert_ms(1) < costs.copy_ms()


def build_runtime(eng, s: RunSettings, *, notes: list, oracle_routing=None, modeled: bool = False,
                  max_cache_len: int | None = None, eager: bool = False) -> LayerRuntime:
    """The run's runtime on ``eng`` (a `SpiceEngine`). ``max_cache_len``: tokens the run may hold (prompt + new),
    which sizes the fast path's StaticCache; ``eager`` forces the eager executor."""
    spec = get_spec(s.policy)
    costs = eng._costs(s)
    lm = eng.lm
    first_note = len(notes)
    predictor, draft_bytes = _predictor(eng, spec, costs, oracle_routing, notes)
    lore, lore_bytes = _lore(eng, spec, s, costs, notes)
    real_lane = eng.machine.run_timing(modeled) == "measured"   # else the CPU lane is modeled inline
    cpu_lane = _real_lane(eng, spec, s, real_lane, notes)
    n_slots, fits = _n_slots(eng, spec, s, draft_bytes + lore_bytes, notes)
    if not fits:        # run without the draft's heads and LoRE (`_n_slots` said so)
        if spec.predictor == "draft":
            from spice_core.predictor.gate import GatePredictor
            predictor = GatePredictor(lm)
        lore = None
    fast = not eager and max_cache_len is not None and eng._wants_fast_path(modeled)
    if fast and real_lane:
        costs = eng._costs(s, fast=True)       # the fast path's GPU and host costs decide
    modeled_cpu = spec.use_cpu and not real_lane
    can_cpu = _lane_offered(eng, spec, s, cpu_lane, modeled_cpu, costs, notes)
    int8 = offer_int8(eng, s, spec, costs, cpu_lane, modeled_cpu, notes) if s.tau_int8 > 0 else None
    if can_cpu or int8 is not None:     # the planner (and a modeled clock) price the lane's shape
        from spice_core.exec.cpu_lane import lane_side_from
        costs = replace(costs, lane_side_from=lane_side_from(cpu_lane))
    planner = LayerPlanner(spec, n_slots=n_slots, n_experts=lm.n_experts, top_k=lm.top_k, moe_layers=lm.moe_layers,
                           costs=costs, tau_prefetch=s.tau_prefetch, tau_approx=s.tau_approx if lore else 0.0,
                           max_lookahead=s.max_lookahead, can_approx=lore is not None,
                           can_cpu=can_cpu, host_aware=eng.host_aware,
                           tau_int8=s.tau_int8 if int8 is not None else 0.0, can_int8=int8 is not None,
                           prefetch_admission=eng.prefetch_admission)
    clock = eng._timeline(costs, modeled)
    recorder = Recorder(clock, lm.expert_bytes, costs.expert_bytes if clock.mode == "modeled" else None)
    measured = clock.mode == "measured"
    kw = dict(copy_stream=getattr(clock, "copy_stream", None), cpu_lane=cpu_lane,
              lore=lore, int8=int8, direct_copies=eng.copy_issue == "direct",
              **(eng._link_pacing() if measured else {}))
    if fast:
        executor = GraphExecutor(lm, n_slots, clock, recorder, max_cache_len=max_cache_len,
                                 readback_predictor=predictor if hasattr(predictor, "head_readback") else None,
                                 use_graphs=lm.device.type == "cuda", cpu_rows=can_cpu or int8 is not None, **kw)
    else:
        executor = EagerExecutor(lm, n_slots, clock, recorder, **kw)
    if kw["copy_stream"] is not None:
        notes.append("slot copies: cudaMemcpyAsync called directly" if executor.copies.direct is not None
                     else f"slot copies: Tensor.copy_ ({executor.copies.direct_off_why})")
    if spec.preload_all:
        executor.copies.load_static(planner.place_static(list(lm.host.keys())))
    elif spec.static_cache:
        executor.copies.load_static(planner.place_static(eng._popular_experts()))
    after = eng.prefetch_after_experts
    if after is None:
        after = measured
    rt = LayerRuntime(lm, planner, executor, clock, recorder, predictor=predictor, prefetch_after_experts=after)
    if fast:
        try:
            _attach_fast(executor, rt, clock, costs, lm.top_k, notes)
        except GraphCaptureError as err:       # the eager build below says again what this one said
            del notes[first_note:]
            notes.append(f"fast path off: {err}; decode runs on the eager executor")
            return build_runtime(eng, s, notes=notes, oracle_routing=oracle_routing, modeled=modeled, eager=True)
    return rt


def _predictor(eng, spec, costs: CostModel, oracle_routing, notes: list):
    """The run's predictor and the GPU bytes it reserves (the draft's heads, sized for the modeled shape)."""
    lm = eng.lm
    if spec.predictor == "gate":
        from spice_core.predictor.gate import GatePredictor
        return GatePredictor(lm), 0
    if spec.predictor == "oracle":
        from spice_core.predictor.oracle import OraclePredictor
        return OraclePredictor(lm, oracle_routing or {}), 0
    if spec.predictor == "draft":
        draft = eng.artifacts.draft if eng.artifacts else None
        if draft is None:
            from spice_core.predictor.gate import GatePredictor
            notes.append("no draft artifacts for the model: fell back to the training-free gate predictor "
                         f"(build them with: {rebuild_command(eng.artifacts, lm)})")
            return GatePredictor(lm), 0
        return draft, draft.budget_bytes(lm.expert_bytes, costs.shape)
    return None, 0


def _lore(eng, spec, s: RunSettings, costs: CostModel, notes: list):
    """The run's LoRE bank at its rank and the GPU bytes it reserves (sized for the modeled shape); None, 0 when
    the policy approximates nothing or the model has no factors."""
    if not spec.use_lore:
        return None, 0
    lm = eng.lm
    lore_all = eng.artifacts.lore if eng.artifacts else None
    if lore_all is None:
        if s.tau_approx > 0:
            notes.append("no LoRE artifacts for the model: misses are never approximated (exact only); "
                         f"build them with: {rebuild_command(eng.artifacts, lm)}")
        return None, 0
    rank = s.lore_rank
    if rank > lore_all.max_rank and rank == DEFAULT_LORE_RANK:
        # The default means "up to 16": smaller factors (the shipped model's go to 4) are used whole, as the default
        # asks, so nothing needs refitting; said only where the run may approximate (tau_approx > 0). A rank asked
        # for explicitly above the factors' is an error (with_rank says how to refit).
        if s.tau_approx > 0:
            notes.append(f"LoRE at rank {lore_all.max_rank}, the largest of the model's factors (the default rank "
                         f"means up to {DEFAULT_LORE_RANK})")
        rank = lore_all.max_rank
    lore = lore_all.with_rank(rank)
    return lore, lore.budget_bytes(lm.expert_bytes, costs.shape)


def _real_lane(eng, spec, s: RunSettings, real_lane: bool, notes: list):
    """The engine's CPU lane where this (measured) run may use it, else None; a clear error where the policy
    cannot run without it."""
    cpu_lane = None
    if spec.use_cpu and s.cpu_lane and real_lane:
        cpu_lane = eng._get_cpu_lane()
        if cpu_lane is not None:
            notes.append(f"CPU lane: {cpu_lane.shape} (workers x intra-op threads)")
        if cpu_lane is None and spec.miss_mode == "cpu":
            raise ConfigError(f"policy cpu_compute needs the CPU lane, which is unavailable here "
                              f"({eng._cpu_lane_error}): pick another policy")
    if spec.use_cpu and not s.cpu_lane and spec.miss_mode == "cpu":
        raise ConfigError("policy cpu_compute needs the CPU lane: turn the CPU lane on or pick another policy")
    return cpu_lane


def _n_slots(eng, spec, s: RunSettings, reserved: int, notes: list) -> tuple[int, bool]:
    """The GPU cache's slots for the run's budget after ``reserved`` bytes of draft heads and LoRE factors, and
    whether those fit: False when they leave no room for one layer's experts but the budget alone would (the run
    then goes without them, and a note says so)."""
    lm = eng.lm
    if spec.preload_all:
        return len(lm.host), True
    budget = int(s.cache_frac * eng.routed_bytes)
    n_slots = min(cache_slots_for_budget(budget, lm.expert_bytes, reserved), len(lm.host))
    fits = True
    if n_slots < lm.top_k and reserved and cache_slots_for_budget(budget, lm.expert_bytes) >= lm.top_k:
        # The draft heads and LoRE factors do not fit beside one layer's experts (a miniature timed at
        # its own, native shape: its heads are about an expert each). Run without them, and say so.
        need = (reserved + lm.top_k * lm.expert_bytes) / eng.routed_bytes
        notes.append(f"the draft heads and LoRE factors ({format_bytes(reserved)}) do not fit in this GPU "
                     "cache beside one layer's experts: running without them (the gate predictor, exact "
                     f"misses); raise the GPU cache to >= {round_up(need)} of the experts to use them")
        fits, reserved = False, 0
        n_slots = min(cache_slots_for_budget(budget, lm.expert_bytes), len(lm.host))
    if n_slots < lm.top_k:
        raise ConfigError(
            f"cache budget {format_bytes(budget)} leaves room for {n_slots} experts after "
            f"{format_bytes(reserved)} of draft/LoRE memory, fewer than top-{lm.top_k}: raise --cache-frac")
    return n_slots, fits


def _lane_offered(eng, spec, s: RunSettings, cpu_lane, modeled_cpu: bool, costs: CostModel, notes: list) -> bool:
    """May the planner send exact misses to the CPU lane (real, or ``modeled_cpu``: priced inline)?"""
    if spec.miss_mode == "orchestrate":
        can_cpu = s.cpu_lane and (cpu_lane is not None or modeled_cpu)
    else:
        can_cpu = cpu_lane is not None or modeled_cpu
    if spec.use_cpu and s.cpu_lane and cpu_lane is None and not modeled_cpu:
        notes.append(f"CPU lane unavailable ({eng._cpu_lane_error}): exact misses are copied")
    if not (can_cpu and cpu_lane is not None and spec.miss_mode == "orchestrate") or lane_pays(costs):
        return can_cpu
    if eng.lane_offer == "auto":
        # Measured on the H200's native link (docs/benchmarks/cpu-lane/ab): spice with the lane offered ran
        # 34.6 ms a token against 26.4 without it, though it sent only ~0.2 misses a token there.
        notes.append(f"CPU lane not offered: one expert takes ~{costs.cpu_expert_ms(1):.2f} ms there against a "
                     f"{costs.copy_ms():.2f} ms copy on this link, so misses are approximated or copied "
                     "(on a slower link, e.g. --link pcie4x8, the lane pays)")
        return False
    notes.append(f"CPU lane offered on this link by lane_offer=always: one expert takes ~{costs.cpu_expert_ms(1):.2f} "
                 f"ms there against a {costs.copy_ms():.2f} ms copy")
    return can_cpu


def _attach_fast(executor: GraphExecutor, rt: LayerRuntime, clock, costs: CostModel, top_k: int, notes: list) -> None:
    """Capture the fast path's decode step (raises GraphCaptureError when it cannot) and say what it is."""
    t0 = time.perf_counter()
    executor.attach(rt)
    n_graphs = executor.decoder.n_graphs
    if executor.decoder.static is not None and clock.mode == "modeled" and clock.one_graph_step(top_k):
        notes.append("modeled: the step is one graph run ahead of the host (the profile's "
                     f"graph_step_kernel_us, {costs.profile.graph_step_kernel_us:g} µs a kernel)")
    shape = ONE_GRAPH_NOTE if n_graphs == 1 else f"{n_graphs} segments"
    notes.append(f"fast path: decode steps replay CUDA graphs ({shape}, "
                 f"captured in {time.perf_counter() - t0:.2f} s)" if executor.decoder.use_graphs else
                 "fast path: decode steps run the graphed executor's step op by op (no CUDA here)")


def offer_int8(eng, s: RunSettings, spec, costs: CostModel, cpu_lane, modeled_cpu: bool, notes: list):
    """The experts' int8 copy when this run (tau_int8 > 0) may take the lossy cpu_int8 miss action, else None;
    either way a note says what happened to tau_int8."""
    if not spec.use_int8:
        notes.append(f"tau_int8 {s.tau_int8:g} is ignored: policy {s.policy} never runs the lossy int8 experts "
                     "(only spice does)")
        return None
    if not s.cpu_lane or (cpu_lane is None and not modeled_cpu):
        notes.append(f"tau_int8 {s.tau_int8:g} is ignored: the int8 experts run on the CPU lane, which is off here")
        return None
    if cpu_lane is not None and not int8_pays(costs):
        notes.append(f"tau_int8 {s.tau_int8:g} is ignored: an int8 expert takes ~{costs.cpu_int8_expert_ms(1):.2f} "
                     f"ms on the CPU lane against a {costs.copy_ms():.2f} ms copy on this link")
        return None
    store = eng.int8_store()
    notes.append(f"cpu_int8 (lossy): a miss below router weight {s.tau_int8:g} (and not below tau_approx) may run "
                 f"on the CPU lane from an int8 weight-only copy of the experts ({format_bytes(store.total_bytes)} "
                 f"of host memory, {store.total_bytes / eng.routed_bytes:.0%} of the experts' bytes)")
    return store
