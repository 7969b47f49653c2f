"""EagerExecutor: carries out a layer's plan with PyTorch calls, one expert at a time (one batch on the CPU).

    read_routing ─► (idx rows, weight rows) as lists: ONE device-to-host readback per layer
    start_layer  ─► CPU-lane tasks (exact, or int8 where the plan says cpu_int8), demand copies into their slots
    copies.issue ─► prefetch copies (copy stream, `CopyEngine`), each bracketed for the clock
    run_experts  ─► per expert, ascending: wait for its copy, its matmuls (or LoRE), free the slot;
                    on the CPU at one token, the slot experts' matmuls run as one gathered batch
    finish_layer ─► CPU results, then the combine in ascending expert order

No decisions: slots, order and actions come from the planner (policy/planner.py). It composes the
mechanism: a `CopyEngine` (runtime/copies.py: the slot buffer, the copy stream and link pacing, the
per-slot ready/free events), `CpuJobs` (runtime/cpu_jobs.py: the CPU lane) and the LoRE bank; the
graphed executor composes one for its prefill and shares its engine and jobs. The combine
reproduces the stock experts loop operation by operation (``out * w`` in the router weights' dtype,
cast, add, ascending expert order), so exact policies match stock transformers. The clock only
observes (timing/timeline.py).

Works on CPU (modeled timing: CPU-lane work is computed inline and timed as the lane) and on
CUDA (measured or modeled). Streams are passed explicitly: looking the current one up costs
~25 µs a call on a GPU host.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from spice_core.exec.experts import combine_batch, combine_one_token, expert_forward, gathered_experts_forward
from spice_core.model.loader import cache_kwarg
from spice_core.policy.planner import ExpertRun, LayerPlan, int8_tasks
from spice_core.runtime.copies import CopyEngine
from spice_core.runtime.cpu_jobs import CpuJobs
from spice_core.types import ExpertKey

APPROX, CPU, COPY = "approx", "cpu", "copy"


class _Rows:
    """Per-expert token rows of one layer, as device index tensors made with ONE host->device
    copy per layer. At T=1 they are plain slices: no index tensors at all.
    Shapes: x [T,H], weights [T,K]."""

    def __init__(self, routes, needed, T: int, device) -> None:
        self.T = T
        self.routes = routes
        if T == 1:
            return
        flat_t, flat_p, self.span = [], [], {}
        for e in needed:
            toks, poss = routes[e]
            self.span[e] = (len(flat_t), len(flat_t) + len(toks))
            flat_t += toks
            flat_p += poss
        both = torch.tensor([flat_t, flat_p], dtype=torch.long)
        if device.type == "cuda":
            both = both.pin_memory().to(device, non_blocking=True)
        self.tok, self.pos = both[0], both[1]

    def __call__(self, x, e):
        if self.T == 1:
            return x
        a, b = self.span[e]
        return x[self.tok[a:b]]

    def add_into(self, final, e, y) -> None:
        """final[rows of e] += y, like the stock loop's index_add_ (a plain add at T=1)."""
        if self.T == 1:
            final.add_(y)
            return
        a, b = self.span[e]
        final.index_add_(0, self.tok[a:b], y)

    def weights(self, w, e):
        """Router weights of expert e's selections, [n,1]."""
        if self.T == 1:
            p = self.routes[e][1][0]
            return w[:, p:p + 1]
        a, b = self.span[e]
        return w[self.tok[a:b], self.pos[a:b], None]


class _SlotIndex:
    """Slot numbers as a long tensor for the CPU's gathered batch, written into a buffer kept per length: making
    a tensor from a list (torch.tensor) cost ~10 µs a layer, more than the gather it feeds. CPU only: the
    buffer is rewritten by the next call, after the synchronous gather that read it has finished."""

    def __init__(self) -> None:
        self._bufs: dict[int, tuple[torch.Tensor, object]] = {}   # length -> (tensor, its numpy view)

    def __call__(self, slots: list[int]) -> torch.Tensor:
        buf = self._bufs.get(len(slots))
        if buf is None:
            t = torch.zeros(len(slots), dtype=torch.long)
            buf = self._bufs[len(slots)] = (t, t.numpy())
        buf[1][:] = slots
        return buf[0]


class EagerExecutor:
    name = "eager"

    def __init__(self, lm, n_slots: int, clock, recorder, *, copy_stream=None, cpu_lane=None, lore=None,
                 pace_extra_ms_per_byte: float = 0.0, sleep_cycles_per_ms: float = 0.0, int8=None,
                 direct_copies: bool = True) -> None:
        """``int8``: the experts' int8 copy (memory/int8_store.py) for the plan's cpu_int8 misses, when offered.
        ``direct_copies``: slot copies by cudaMemcpyAsync where checked (`CopyEngine`)."""
        self.lm, self.clock, self.recorder = lm, clock, recorder
        self.device = lm.device
        self.cuda = self.device.type == "cuda"
        compute = getattr(clock, "compute_stream", None)
        if self.cuda and compute is None:
            compute = torch.cuda.current_stream(self.device)
        self.copies = CopyEngine(lm, n_slots, clock, recorder, copy_stream=copy_stream, compute_stream=compute,
                                 pace_extra_ms_per_byte=pace_extra_ms_per_byte,
                                 sleep_cycles_per_ms=sleep_cycles_per_ms, direct_copies=direct_copies)
        self.cpu = CpuJobs(lm, clock, recorder, cpu_lane=cpu_lane, int8=int8)
        self.lore = lore
        # On the CPU a token's experts held in slots run as one gathered batch (no events to bracket them);
        # on CUDA each expert keeps its own kernels, bracketed by events for the measured clock.
        self.batched = not self.cuda
        self._batches: list = []        # the current layer's gathered batches (CPU): (ys [n,H], expert of each row)
        self._slot_index = _SlotIndex()
        # Each MoE layer's ExpertKeys, made once (the batched path names every expert to the clock).
        self._keys = {layer: tuple(ExpertKey(layer, e) for e in range(lm.n_experts)) for layer in lm.moe_layers}

    @property
    def slots(self):
        return self.copies.slots

    @property
    def compute_stream(self):
        """The stream that reads the slots (the copy engine's, so that both executors of a run agree)."""
        return self.copies.compute_stream

    @compute_stream.setter
    def compute_stream(self, stream) -> None:
        self.copies.compute_stream = stream

    # ------------------------------------------------------------------ set-up
    def close(self) -> None:
        """End of a run (the graphed executor releases its graphs here); nothing to release here."""

    def stepper(self) -> "EagerStepper":
        return EagerStepper(self.lm)

    def start_token(self) -> None:
        if self.cuda:
            self.compute_stream = getattr(self.clock, "compute_stream", None) or self.compute_stream

    # ------------------------------------------------------------------ routing
    @staticmethod
    def read_routing(top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> tuple[list, list]:
        """[T,K] index and weights -> two lists of rows, with one device-to-host readback."""
        if top_k_index.device.type != "cuda":
            return top_k_index.tolist(), top_k_weights.tolist()
        k = top_k_index.shape[1]
        # Expert ids < 2^24 are exact in float32, and so are bf16/fp16/fp32 router weights.
        both = torch.cat([top_k_index.to(torch.float32), top_k_weights.to(torch.float32)], dim=1).tolist()
        return [[int(v) for v in row[:k]] for row in both], [row[k:] for row in both]

    # ------------------------------------------------------------------ the layer
    def start_layer(self, plan: LayerPlan, x: torch.Tensor, act: Callable):
        """CPU-lane tasks first (they overlap everything after), then the demand copies that have slots."""
        rows = _Rows(plan.routes, plan.needed, x.shape[0], x.device)
        int8 = int8_tasks(plan.cpu)
        jobs, stream = self.cpu, self.compute_stream if x.device.type == "cuda" else None
        cpu = {e: (jobs.submit_int8 if e in int8 else jobs.submit)(
                   ExpertKey(plan.layer, e), rows(x, e), len(plan.routes[e][0]), act, self.device, stream=stream,
                   decode=x.shape[0] == 1, batch=len(plan.cpu))
               for e in plan.cpu}
        for order in plan.copies:
            self.copies.issue(order)
        return rows, cpu

    def run_experts(self, layer: int, runs: tuple[ExpertRun, ...], rows: _Rows, x: torch.Tensor, act: Callable) -> dict:
        if self.batched and rows.T == 1:
            return self._run_experts_batched(layer, runs, rows, x, act)
        clock, outs, copies = self.clock, {}, self.copies
        for r in runs:
            key = ExpertKey(layer, r.expert)
            xs = rows(x, r.expert)
            n = len(rows.routes[r.expert][0])
            if r.outcome == APPROX:
                start = clock.stamp()
                outs[r.expert] = self.lore.apply(key, xs)
                clock.approx(key, n, self.lore.rank, start)
                continue
            if r.late_copy is not None:
                copies.issue(r.late_copy)
            if r.prefetch_used is not None:
                self.recorder.prefetch_used(key, r.prefetch_used, clock.now_ms())
            copies.wait_ready(r.slot)
            gate_up, down = copies.slots.weights(r.slot)
            start = clock.stamp()
            outs[r.expert] = expert_forward(xs, gate_up, down, act)
            clock.gpu_expert(key, n, start)
            copies.release(r.slot)
            if r.drop_after:
                copies.forget(r.slot)
        return outs

    def _run_experts_batched(self, layer: int, runs: tuple[ExpertRun, ...], rows: _Rows, x: torch.Tensor,
                             act: Callable) -> dict:
        """One token (x [1,H]) on the CPU: the clock and recorder hear about every expert in the same order as
        `run_experts`, but the experts held in slots run as one gathered batch (`_flush`). A late copy may
        refill a slot an earlier expert of this layer reads, so the experts gathered so far run first."""
        clock, outs, pending, copies = self.clock, {}, [], self.copies
        ready = copies.ready
        keys = self._keys.get(layer) or tuple(ExpertKey(layer, e) for e in range(self.lm.n_experts))
        self._batches = []
        for r in runs:
            key = keys[r.expert]
            if r.outcome == APPROX:
                outs[r.expert] = self.lore.apply(key, x)
                clock.approx(key, 1, self.lore.rank)
                continue
            if r.late_copy is not None:
                self._flush(pending, rows, x, act)
                copies.issue(r.late_copy)
            if r.prefetch_used is not None:
                self.recorder.prefetch_used(key, r.prefetch_used, clock.now_ms())
            if r.slot in ready:          # filled by a copy the clock has not seen waited for
                copies.wait_ready(r.slot)
            pending.append((r.expert, r.slot))
            clock.gpu_expert(key, 1)
            if r.drop_after:
                copies.forget(r.slot)
        self._flush(pending, rows, x, act)
        return outs

    def run_hits(self, layer: int, expert_ids: list[int], slots: list[int], x: torch.Tensor,
                 top_k_weights: torch.Tensor, act: Callable) -> torch.Tensor:
        """One token on the CPU (``batched``) whose K selections all hit (LayerPlanner.plan_hits): x [1,H] ->
        [1,H]. What `start_layer`, `run_experts` and `finish_layer` do for such a layer, in one call: the clock
        hears of each expert in ascending order, the K experts run as one gathered batch in top-k order, and
        the combine adds them in ascending expert order."""
        keys, clock, copies = self._keys[layer], self.clock, self.copies
        ready = copies.ready
        order = sorted(range(len(expert_ids)), key=expert_ids.__getitem__)   # top-k positions, experts ascending
        for p in order:
            if slots[p] in ready:        # filled by a copy the clock has not seen waited for
                copies.wait_ready(slots[p])
            clock.gpu_expert(keys[expert_ids[p]], 1)
        ys = gathered_experts_forward(x, self.slots.buffer, self._slot_index(slots), self.lm.layout, act)
        return combine_batch(ys, top_k_weights, order, x.dtype)

    def _flush(self, pending: list, rows: _Rows, x: torch.Tensor, act: Callable) -> None:
        """Run the (expert, slot) pairs gathered so far as one batch, in top-k position order (so that the
        combine weights them with one multiply), into this layer's ``_batches``."""
        if not pending:
            return
        routes = rows.routes
        pending.sort(key=lambda es: routes[es[0]][1][0])
        ys = gathered_experts_forward(x, self.slots.buffer, self._slot_index([s for _, s in pending]), self.lm.layout,
                                      act)
        self._batches.append((ys, [e for e, _ in pending]))
        pending.clear()

    def finish_layer(self, plan: LayerPlan, rows: _Rows, outs: dict, cpu: dict, x: torch.Tensor,
                     top_k_weights: torch.Tensor, act: Callable, fallback) -> torch.Tensor:
        """Collect CPU results (``fallback(key)`` -> a CopyOrder when a task failed), then combine."""
        for e, handle in cpu.items():
            outs[e] = self._collect_cpu(ExpertKey(plan.layer, e), handle, rows(x, e), act, fallback)
        if self.batched and rows.T == 1:
            return combine_one_token(x, plan.needed, plan.routes, outs, self._batches, top_k_weights)
        # Combine exactly as the stock loop does.
        final = torch.zeros_like(x)
        for e in plan.needed:
            y = outs[e] * rows.weights(top_k_weights, e)
            rows.add_into(final, e, y.to(final.dtype))
        return final

    def _collect_cpu(self, key: ExpertKey, handle, xs: torch.Tensor, act, fallback) -> torch.Tensor:
        out = self.cpu.collect(key, handle)
        if out is None:              # the job failed: copy the expert in and run it here, exactly
            copies = self.copies
            order = fallback(key)
            copies.issue(order)
            copies.wait_ready(order.slot)
            gate_up, down = copies.slots.weights(order.slot)
            start = self.clock.stamp()
            out = expert_forward(xs, gate_up, down, act)
            self.clock.gpu_expert(key, xs.shape[0], start)
            copies.release(order.slot)
        return out


class EagerStepper:
    """Feeds the run one token at a time through the stock HF forward over a DynamicCache."""

    def __init__(self, lm) -> None:
        from transformers import DynamicCache

        self.lm = lm
        self.cache = DynamicCache(config=lm.model.config)
        self._cache_kw = cache_kwarg(lm.model)

    def context(self):
        return contextlib.nullcontext()

    def forward(self, ids: list[int], *, run_ahead: bool = False) -> torch.Tensor:
        """``ids``: the prompt on the first call, then the one new token. Returns the next-token logits [V].
        ``run_ahead`` is the graphed stepper's hint; the eager step runs as it is called."""
        x = torch.tensor([ids], device=self.lm.device)
        return self.lm.model(input_ids=x, use_cache=True, **{self._cache_kw: self.cache}).logits[0, -1]
