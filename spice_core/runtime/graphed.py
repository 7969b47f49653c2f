"""GraphedDecoder: decode steps (T=1) as one CUDA-graph segment per MoE layer, cut at the experts call.

    step t (M MoE layers m_0 < … < m_{M-1}, segments S_0 … S_M, all captured from the stock HF forward):
      S_0  mask ← (arange ≤ pos) → embed → layers … → router of m_0 → D2H routing (pinned row 0)
      host wait E_0 → on_layer(m_0, ids, w) → slots (copies on copy_stream) → plan row 0 (pinned)
           → compute stream waits for the copy stream
      S_1  H2D plan row 0 → experts(m_0) from slots + ordered combine → … → router of m_1 → D2H
      …
      S_M  experts(m_{M-1}) → … → norm → lm_head → argmax → ids ← token, pos += 1 → D2H token

The forward is captured once: each `OffloadedExperts` calls `runtime.run_layer`, and during capture
that runtime ends graph l and begins graph l+1 (`CUDAGraph.capture_begin(pool=…)`, one pool shared
by all segments, replayed in capture order). No per-family glue: whatever the family's MoE block
does around its experts call (shared experts, gates, scaling) is captured as the stock code runs it.
Static inputs: a StaticCache (its lengths advance in-graph), ids/position buffers and a 4D mask
computed in-graph from the position (transformers returns a 4D mask as-is). Prefill stays eager.

Experts run from a device plan row (see `graphed_plan.py`) in `graphed_step.SlotExpertStep`: the slot of
each selection, in ascending expert order, and the stock loop's rounding, so any slot assignment of the
same experts gives the same bits (an LRU cache replays an all-resident run exactly). The pinned buffers the
segments read back into and upload from are `graphed_io.HostIO`; this module captures and replays.

With ``static_slots`` (a cache that never changes: every expert resident) the step needs no host decision:
each layer's plan row is computed on the device from its routing, the whole step is ONE graph with no wait
between layers, and the host hears of every layer's routing once the step is done; with ``step(run_ahead=True)``
(greedy decoding) the next step is launched before the host books this one (`graphed_static.StaticStep`). Needs
captured pinned copies (the routing is read back inside the graph); without them the decoder cuts segments as
above. A measured clock then sees the step's GPU work as one interval (it is told of the layers after the step:
the first layer's interval spans it, the others are empty); the modeled clock times each layer as before.

Deliberately does not know policies, the engine or timing: it takes a host callback per layer.
"""
from __future__ import annotations

import gc
import logging
import time
from contextlib import contextmanager
from typing import Callable, Sequence

import torch

from spice_core.errors import ConfigError, SpiceError
from spice_core.exec.experts import installed
from spice_core.model.loader import cache_kwarg
from spice_core.runtime.graphed_io import HostIO, probe_captured
from spice_core.runtime.graphed_plan import plan_rows
from spice_core.runtime.graphed_static import StaticStep
from spice_core.runtime.graphed_step import KERNELS, SlotExpertStep, default_kernel
from spice_core.types import ExpertKey

log = logging.getLogger(__name__)

OnLayer = Callable[[int, list, list], Sequence[int]]   # (layer, expert ids, weights) -> slot per selection
OnExpert = Callable[[int, int], int]                   # prefill: (layer, expert) -> slot holding it
DraftReadback = Callable[[int, torch.Tensor], torch.Tensor]   # (layer, x [1,H]) -> [n] float32, read back per layer
AfterReplay = Callable[[], None]                       # host work that may overlap the segment just launched
__all__ = ["GraphedDecoder", "GraphCaptureError", "KERNELS", "default_kernel"]


class GraphCaptureError(SpiceError):
    """The decode step of this model cannot be captured as CUDA graphs: use the eager executor."""


class _Hook:
    """Stands in for the engine's runtime on every OffloadedExperts (`runtime.run_layer`)."""

    def __init__(self, decoder: "GraphedDecoder") -> None:
        self.decoder = decoder

    def run_layer(self, layer, x, top_k_index, top_k_weights, act):
        return self.decoder._experts_call(layer, x, top_k_index, top_k_weights, act)


class GraphedDecoder:
    """Decode steps (T=1) of a LoadedModel as one CUDA-graph segment per MoE layer, cut at the experts call.

    ``slots_buffer`` [n_slots, numel] holds experts in ``lm.layout``'s flat layout. ``kernel``: "slots"
    (two Triton kernels reading each selection straight from its slot, exec/slot_kernels.py; the default on
    CUDA), "gather" (index_select the K experts' weights into scratch, then bmm; the CPU's) or "grouped"
    (grouped_mm over the slot views). ``use_graphs=False`` runs the same step op by op (CPU, reference).
    """

    def __init__(self, lm, slots_buffer: torch.Tensor, copy_stream, max_cache_len: int, *,
                 kernel: str | None = None, use_graphs: bool | None = None, wait_for_copies: bool = True,
                 draft_readback: DraftReadback | None = None, draft_numel: int = 0, lore=None, cpu_rows: bool = False,
                 static_slots: torch.Tensor | None = None) -> None:
        """``wait_for_copies`` False: the caller makes `stream` wait for the copies a step needs (inside
        on_layer), so prefetches for later layers keep flowing behind the next segments.
        ``draft_readback(layer, x [1,H]) -> [draft_numel] float32``: device work captured into the segment just
        before the experts call (a draft's heads); its result is read back with the routing into
        ``draft_host[i]`` (numpy: ``draft_np[i]``). ``lore``: a LoreBank on the device; selections the plan
        marks approximate take its surrogate (plus α·shared expert) instead of a slot's expert. ``cpu_rows``: the
        hidden state x of each MoE layer is read back with its routing (``x_host[i]``, pinned), and selections
        the plan marks CPU take their output from ``cpu_host[i, row]`` (pinned, written by the host before the
        next segment's launch, uploaded by that segment's captured H2D with the plan row). ``static_slots``
        [M, E] long on the device: the slot of every expert of every MoE layer, fixed for the decoder's life
        (see the module docstring)."""
        from transformers import StaticCache

        self.lm, self.model = lm, lm.model
        self.device = dev = torch.device(lm.device)
        self.use_graphs = dev.type == "cuda" if use_graphs is None else use_graphs
        if self.use_graphs and dev.type != "cuda":
            raise ConfigError("use_graphs=True needs a CUDA device: pass use_graphs=False on the CPU")
        cfg = self.model.config
        self.attn = getattr(cfg, "_attn_implementation", None) or "eager"
        if self.attn not in ("sdpa", "eager"):
            raise GraphCaptureError(f"attention implementation {self.attn!r} is not supported by the graphed "
                                    "decoder (sdpa or eager): use the eager executor")
        self.copy_stream, self.max_cache_len = copy_stream, int(max_cache_len)
        self.wait_for_copies, self.draft_readback = wait_for_copies, draft_readback
        self.experts = SlotExpertStep(lm, slots_buffer, kernel, lore)
        if static_slots is not None and (draft_readback is not None or cpu_rows or lore is not None):
            raise ConfigError("static_slots is for a cache that never changes and decides nothing: no draft, "
                              "CPU lane or LoRE with it")
        self.static_slots = static_slots
        self.kernel, self.lore, self.n_slots = self.experts.kernel, lore, self.experts.n_slots
        self.moe_pos = {layer: i for i, layer in enumerate(lm.moe_layers)}
        self.k, self.n_experts = lm.top_k, lm.n_experts
        M, L = len(lm.moe_layers), self.max_cache_len
        self._pin = dev.type == "cuda"
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1, 1), dtype=torch.long, device=dev)
        self._arange = torch.arange(L, device=dev).view(1, 1, 1, L)
        self.mask = torch.zeros((1, 1, 1, L), dtype=torch.bool if self.attn == "sdpa" else self.model.dtype,
                                device=dev)
        self.io = io = HostIO(M, self.k, lm.layout.hidden, self.model.dtype, dev, draft_numel=draft_numel,
                              cpu_rows=cpu_rows)
        self.cpu_rows = io.cpu_rows
        self.draft_np = io.draft_np                   # the host step reads these (graph_exec)
        if self.cpu_rows:
            self.x_host, self.cpu_host = io.x_host, io.cpu_host
        self._draft_src: list = [None] * M
        self._x_src: list = [None] * M
        self.cache = StaticCache(config=cfg, max_cache_len=L)
        if any(getattr(layer, "is_sliding", False) for layer in self.cache.layers):    # on the CPU path too
            raise GraphCaptureError(f"{getattr(lm.family, 'name', '?')}: sliding-window cache layers need a per-layer "
                                    "mask the graphed decoder does not build: use the eager executor")
        self._cache_kw = cache_kwarg(self.model)
        self._hook = _Hook(self)
        self._mode, self._on_layer, self._on_expert = None, None, None
        self._staging = None
        self._route_src: list = [None] * M     # (top_k_index, top_k_weights) of each layer, pool memory
        self._token_dev, self.logits = None, None
        self._pos_host, self._next_token = 0, None
        self.host_s, self.host_layers = 0.0, 0   # host time between segments (after the wait, to the replay): GPU idle
        self.overlap_s = 0.0                     # host time after a replay, while its segment runs (after_replay)
        self._after_replay: AfterReplay | None = None
        self.segment_launch_s, self.segment_end = 0.0, None   # the last segment replayed: its launch (perf_counter)
                                                               # and the event after it (None: not a replayed one)
        self.capture_s = 0.0
        self.captured_host_io = False    # the D2H readback and H2D plan upload are graph nodes (else the host
                                              # issues them between replays; `probe_captured`)
        self._graphs: list = []
        self._stream = None
        if dev.type == "cuda":
            self._stream = torch.cuda.Stream(dev)
            self._events = [torch.cuda.Event() for _ in range(M + 1)]
            # Recorded right after each replay, before the host's work beside the segment: a measured clock times
            # the segment from its launch to them (`segment_launch_s`, `segment_end`).
            self._segment_done = [torch.cuda.Event(enable_timing=True) for _ in range(M + 1)]
            self._copies_done = torch.cuda.Event()
        self.static = StaticStep(self, static_slots) if static_slots is not None else None
        if self.use_graphs:
            self._capture()

    # ------------------------------------------------------------------ public
    @property
    def n_graphs(self) -> int:
        """CUDA graphs a step replays: one per MoE layer plus one, or one (static slots); 0 on the CPU."""
        return len(self._graphs)

    @property
    def stream(self):
        """The CUDA stream the decode segments replay on (None on the CPU)."""
        return self._stream

    def prefill(self, input_ids: list[int], on_expert: OnExpert | None = None, *, own_experts: bool = True) -> int:
        """Eager prefill into the StaticCache; returns the greedy next token. ``on_expert(layer, e)``
        returns the slot holding that expert (copies it may issue go on copy_stream); without it each
        expert is staged from host memory into a private buffer. ``own_experts`` False: the experts
        modules keep the runtime installed on them (the engine's eager runtime runs the prefill)."""
        T = len(input_ids)
        if T < 1 or T + 1 > self.max_cache_len:
            raise ConfigError(f"prompt of {T} tokens does not fit max_cache_len {self.max_cache_len}: raise it")
        if self.static is not None:
            self.static.settle()
        self._on_expert = on_expert
        with self._on_stream(), self._hooked("prefill" if own_experts else None), torch.no_grad():
            self.cache.reset()        # on the stream the prefill runs on: it clears before it writes
            ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
            pos = torch.arange(T, device=self.device).view(1, T)
            logits = self.model(input_ids=ids, position_ids=pos, use_cache=True, **{self._cache_kw: self.cache}).logits
            tok = logits[0, -1].argmax()
            self.ids.copy_(tok.view(1, 1))
            self.pos.fill_(T)
            self.prefill_logits = logits[0, -1].clone()
            token = int(tok)
        self._pos_host, self._next_token = T, token
        return token

    def step(self, token: int, on_layer: OnLayer, after_replay: AfterReplay | None = None, *,
             run_ahead: bool = False) -> int:
        """One decode step at the next position; returns the greedy next token. For each MoE layer l in
        order, once its routing sits in pinned memory: on_layer(l, expert_ids, weights) -> the slot of each
        selection (routed selections only, in top-k order); then the next segment is launched and
        ``after_replay()`` runs while it executes (host work that need not delay it, e.g. the lookahead).
        With ``wait_for_copies`` the compute stream waits for every copy the callbacks issued; without it
        the callback makes it wait for what the layer reads. Inside on_layer every earlier segment has
        finished; inside after_replay the segment just launched may still read layer l's slots, so
        after_replay must not overwrite them (the planner keeps them protected).

        ``run_ahead`` (static slots only; the caller will most likely feed this step's greedy token back): the
        next step is launched before the host is told of this one's layers, so its GPU work overlaps the host's
        bookkeeping and the caller's. A different token at the next call rolls that step back (its position and
        the cache's lengths) and runs the right one; `prefill` and `close` wait for it."""
        if self._pos_host + 1 > self.max_cache_len:
            raise ConfigError(f"the sequence reached max_cache_len {self.max_cache_len}: raise it")
        self._on_layer, self._after_replay = on_layer, after_replay
        self.segment_end = None          # until this step replays one
        if self.static is not None:
            return self.static.step(token, run_ahead and self._pos_host + 2 <= self.max_cache_len)
        if not self.use_graphs:
            with self._on_stream(), self._hooked("eager"), torch.no_grad():
                if token != self._next_token:
                    self.ids.fill_(token)
                self.logits = self._body()
                out = int(self.logits[0, -1].argmax())
        else:
            out = self._replay(token)
        self._pos_host += 1
        self._next_token = out
        return out

    @property
    def last_logits(self) -> torch.Tensor:
        """Logits of the last step [V] (graph memory: clone to keep)."""
        kept = self.static.ahead_logits if self.static is not None else None
        return kept if kept is not None else self.logits[0, -1]

    @property
    def steps_run_ahead(self) -> int:
        """Static steps launched before the host booked the last one (`StaticStep`)."""
        return self.static.steps_run_ahead if self.static is not None else 0

    @property
    def steps_rolled_back(self) -> int:
        """Of those, the ones undone because the caller fed back another token."""
        return self.static.steps_rolled_back if self.static is not None else 0

    # ------------------------------------------------------------------ replay
    def _replay(self, token: int) -> int:
        s, clock = self._stream, time.perf_counter
        with torch.cuda.stream(s):
            if token != self._next_token:
                self.ids.fill_(token)
            for i, layer in enumerate(self.lm.moe_layers):
                self.segment_launch_s = clock()
                self._graphs[i].replay()
                self.segment_end = self._segment_done[i]
                self.segment_end.record(s)
                if i > 0:
                    self._run_after_replay()
                if not self.captured_host_io:
                    self.io.readback(i, *self._route_src[i], self._x_src[i])
                    if self._draft_src[i] is not None:
                        self.io.read_draft(i, self._draft_src[i])
                ev = self._events[i]
                ev.record(s)
                ev.synchronize()
                t0 = clock()
                self._decide(i, layer)
                if not self.captured_host_io:
                    self.io.upload(i)
                if self.copy_stream is not None and self.wait_for_copies:
                    self._copies_done.record(self.copy_stream)
                    s.wait_event(self._copies_done)
                self.host_s += clock() - t0
            self.segment_launch_s = clock()
            self._graphs[-1].replay()
            self.segment_end = self._segment_done[-1]
            self.segment_end.record(s)
            self._run_after_replay()
            if not self.captured_host_io:
                self.io.read_token(self._token_dev)
            self._events[-1].record(s)
            self._events[-1].synchronize()
        self.host_layers += len(self.lm.moe_layers)
        return int(self.io.token_np[0])

    def _run_after_replay(self) -> None:
        if self._after_replay is not None:
            t0 = time.perf_counter()
            self._after_replay()
            self.overlap_s += time.perf_counter() - t0

    # ------------------------------------------------------------------ the step body (captured or eager)
    def _body(self) -> torch.Tensor:
        cond = self._arange <= self.pos.view(1, 1, 1, 1)
        if self.mask.dtype == torch.bool:
            self.mask.copy_(cond)
        else:
            self.mask.copy_(torch.where(cond, 0.0, torch.finfo(self.mask.dtype).min))
        logits = self.model(input_ids=self.ids, position_ids=self.pos, attention_mask=self.mask, use_cache=True,
                            **{self._cache_kw: self.cache}).logits
        tok = logits[0, -1].argmax()
        self.ids.copy_(tok.view(1, 1))
        self.pos.add_(1)
        self._token_dev = tok
        if self.static is not None:
            self.static.planner.flush()     # every layer's routing to the host rows, when it was staged
        if self.captured_host_io:
            self.io.read_token(tok)
        return logits

    def _experts_call(self, layer: int, x, top_k_index, top_k_weights, act):
        if self._mode == "prefill":
            return self._prefill_experts(layer, x, top_k_index, top_k_weights, act)
        assert x.shape[0] == 1, "the graphed decoder runs T=1 steps only"
        i = self.moe_pos[layer]
        if self.static is not None:       # no host step: the plan row from the routing, on the device
            plan = self.static.planner.plan(i, top_k_index, top_k_weights)
            return self.experts.forward(i, x, top_k_weights, act, plan)
        draft = self.draft_readback(layer, x) if self.draft_readback is not None else None
        if self._mode == "capture":
            self._route_src[i] = (top_k_index, top_k_weights)
            self._draft_src[i] = draft
            self._x_src[i] = x
            if self.captured_host_io:
                self.io.readback(i, top_k_index, top_k_weights, x)
                if draft is not None:
                    self.io.read_draft(i, draft)
            self._graphs[i].capture_end()
            self._capturing = i + 1
            self._graphs[i + 1].capture_begin(pool=self._pool, capture_error_mode="thread_local")
            if self.captured_host_io:
                self.io.upload(i)
        else:   # eager: the same step op by op
            self.io.readback(i, top_k_index, top_k_weights, x)
            if draft is not None:
                self.io.read_draft(i, draft)
            if self._pin:
                torch.cuda.current_stream().synchronize()
            self._decide(i, layer)
            self.io.upload(i)
            if self.copy_stream is not None and self.wait_for_copies:
                torch.cuda.current_stream().wait_stream(self.copy_stream)
            out = self._experts(i, x, top_k_weights, act)
            self._run_after_replay()       # as after a replay: the experts are queued, the host plans on
            return out
        return self._experts(i, x, top_k_weights, act)

    def _routed(self, i: int, routing=None) -> tuple[list, list, list]:
        """Layer i's routing as read back (or from ``routing``, (ids, weights) rows kept earlier): (every pick's
        expert id, the routed picks' ids, their weights); a pick outside [0, E) is dropped from the last two."""
        idx_rows, w_rows = routing if routing is not None else (self.io.idx_np, self.io.w_np)
        ids, ws = idx_rows[i].tolist(), w_rows[i].tolist()
        if all(0 <= e < self.n_experts for e in ids):
            return ids, ids, ws
        keep = [k for k, e in enumerate(ids) if 0 <= e < self.n_experts]
        return ids, [ids[k] for k in keep], [ws[k] for k in keep]

    def _decide(self, i: int, layer: int) -> None:
        ids, routed, ws = self._routed(i)
        slots = self._on_layer(layer, routed, ws)
        self.io.plan_np[i] = plan_rows(ids, list(slots), self.n_experts, self.n_slots)

    def _experts(self, i: int, x: torch.Tensor, top_k_weights: torch.Tensor, act) -> torch.Tensor:
        """x [1,H] -> [1,H]: layer i's K selections by its device plan row (`SlotExpertStep.forward`)."""
        return self.experts.forward(i, x, top_k_weights, act, self.io.plan_dev[i],
                                    self.io.cpu_dev[i] if self.cpu_rows else None)

    # ------------------------------------------------------------------ prefill experts (eager, T tokens)
    def _prefill_experts(self, layer: int, x, top_k_index, top_k_weights, act):
        return self.experts.prefill(x, top_k_index, top_k_weights, act, self.n_experts,
                                    lambda e: self._prefill_weights(layer, e))

    def _prefill_weights(self, layer: int, e: int):
        if self._on_expert is not None:
            if self.copy_stream is not None:   # a slot it refills may still be read by queued experts
                self.copy_stream.wait_stream(torch.cuda.current_stream())
            slot = self._on_expert(layer, e)
            if self.copy_stream is not None:
                torch.cuda.current_stream().wait_stream(self.copy_stream)
            return self.experts.slot_views(slot)
        if self._staging is None:
            self._staging = torch.empty(self.lm.layout.numel, dtype=self.lm.layout.dtype, device=self.device)
        self._staging.copy_(self.lm.host.flat(ExpertKey(layer, e)), non_blocking=self._pin)
        return self.lm.layout.views(self._staging)

    # ------------------------------------------------------------------ capture
    def _capture(self) -> None:
        family = getattr(self.lm.family, "name", "?")
        warm_plan = lambda layer, ids, ws: list(range(len(ids)))      # noqa: E731 - any distinct slots
        with self._on_stream(), torch.no_grad():
            self._on_layer = warm_plan
            with self._hooked("eager"):
                self._body()          # initialises the cache lazily, cuBLAS handles, kernels
            torch.cuda.synchronize(self.device)
            self.cache.reset()        # the warm-up read arbitrary slots: clear K/V and lengths
            self.pos.zero_()
            self.captured_host_io = probe_captured(self.device, self._stream)
        if self.static is not None and not self.captured_host_io:
            log.info("pinned copies cannot be captured here: the static step is cut into segments like any other")
            self.static_slots = self.static = None
        gc.collect()
        torch.cuda.synchronize(self.device)
        self._pool = torch.cuda.graph_pool_handle()
        n_graphs = 1 if self.static is not None else len(self.lm.moe_layers) + 1
        self._graphs = [torch.cuda.CUDAGraph() for _ in range(n_graphs)]
        self._capturing = 0
        t0 = time.perf_counter()
        try:
            with torch.cuda.stream(self._stream), self._hooked("capture"), torch.no_grad():
                self._graphs[0].capture_begin(pool=self._pool, capture_error_mode="thread_local")
                self.logits = self._body()
                self._graphs[-1].capture_end()
                self._capturing = None
        except Exception as err:
            if self._capturing is not None:
                try:
                    self._graphs[self._capturing].capture_end()
                except Exception:   # noqa: BLE001 - the capture is already invalid; report the first error
                    pass
            self._graphs = []
            if self.static is not None:     # the one-graph step failed: capture the segmented one instead
                log.warning("%s: capturing the static step as one graph failed (%s: %s): cutting it into segments",
                            family, type(err).__name__, err)
                self.static_slots = self.static = None
                self._capture()
                return
            raise GraphCaptureError(f"{family}: capturing the decode step as CUDA graphs failed at segment "
                                    f"{self._capturing} ({type(err).__name__}: {err}): use the eager executor") from err
        torch.cuda.synchronize(self.device)
        self.capture_s = time.perf_counter() - t0
        log.info("captured %d decode segments in %.2f s (in-graph copies: %s)", len(self._graphs), self.capture_s,
                 self.captured_host_io)

    def close(self) -> None:
        """Release the graphs, their memory pool's tensors and the slot buffer's views now (the decoder and its
        hook refer to each other, so otherwise they wait for the cyclic garbage collector). Unusable after."""
        if self.static is not None:
            self.static.settle()
        self._graphs, self._pool = [], None
        self._hook = self._on_layer = self._on_expert = None
        self.experts.close()
        self._staging = None
        self.cache = self.logits = self._token_dev = None
        self._route_src = self._draft_src = self._x_src = []

    @contextmanager
    def _hooked(self, mode: str | None):
        if mode is None:          # keep whatever runtime the experts modules have
            yield
            return
        self._mode = mode
        try:
            with installed(self.lm, self._hook):
                yield
        finally:
            self._mode = None

    @contextmanager
    def _on_stream(self):
        if self.device.type != "cuda":
            yield
            return
        with torch.cuda.stream(self._stream):
            yield
