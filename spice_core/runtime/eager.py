"""EagerExecutor: carries out a layer's plan with PyTorch calls, one expert at a time (one batch on the CPU).

    read_routing ─► (idx rows, weight rows) as lists: ONE device-to-host readback per layer
    start_layer  ─► CPU-lane tasks (exact, or int8 where the plan says cpu_int8), demand copies into their slots
    issue        ─► prefetch copies (copy stream), each bracketed for the clock
    run_experts  ─► per expert, ascending: wait for its copy, its matmuls (or LoRE), free the slot;
                    on the CPU at one token, the slot experts' matmuls run as one gathered batch
    finish_layer ─► CPU results, then the combine in ascending expert order

No decisions: slots, order and actions come from the planner (policy/planner.py). It owns the
mechanism: the slot buffer, the copy stream and link pacing, the per-slot ready/free events,
the CPU lane and the LoRE bank. The combine reproduces the stock experts loop operation by
operation (``out * w`` in the router weights' dtype, cast, add, ascending expert order), so
exact policies match stock transformers. The clock only observes (timing/timeline.py).

Works on CPU (modeled timing: CPU-lane work is computed inline and timed as the lane) and on
CUDA (measured or modeled). Streams are passed explicitly: looking the current one up costs
~25 µs a call on a GPU host.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from spice_core.exec.experts import combine_batch, combine_one_token, expert_forward, gathered_experts_forward
from spice_core.exec.int8 import int8_expert_forward
from spice_core.model.loader import cache_kwarg
from spice_core.policy.planner import CopyOrder, ExpertRun, LayerPlan, int8_tasks
from spice_core.runtime.slots import SlotBuffer
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
                 modeled_cpu: bool = False, pace_extra_ms_per_byte: float = 0.0,
                 sleep_cycles_per_ms: float = 0.0, int8=None) -> None:
        """``int8``: the experts' int8 copy (memory/int8_store.py) for the plan's cpu_int8 misses, when offered."""
        self.lm, self.clock, self.recorder = lm, clock, recorder
        self.device = lm.device
        self.cuda = self.device.type == "cuda"
        self.slots = SlotBuffer(lm.layout, n_slots, lm.device)
        self.copy_stream = copy_stream
        self.compute_stream = getattr(clock, "compute_stream", None)
        if self.cuda and self.compute_stream is None:
            self.compute_stream = torch.cuda.current_stream(self.device)
        self.cpu_lane, self.lore, self.modeled_cpu, self.int8 = cpu_lane, lore, modeled_cpu, int8
        self.pace_extra_ms_per_byte = pace_extra_ms_per_byte    # link emulation: extra copy time per byte
        self.sleep_cycles_per_ms = sleep_cycles_per_ms
        self._ready: dict[int, object] = {}        # slot -> clock handle of the copy that filled it
        self._free_event: dict[int, object] = {}   # slot -> CUDA event after the last compute that read it
        self._expert_bytes = lm.expert_bytes
        # On the CPU a token's experts held in slots run as one gathered batch (no events to bracket them);
        # on CUDA each expert keeps its own kernels, bracketed by events for the measured clock.
        self.batched = not self.cuda
        self._batches: list = []        # the current layer's gathered batches (CPU): (ys [n,H], expert of each row)
        self._slot_index = _SlotIndex()
        # Each MoE layer's ExpertKeys, made once (the batched path names every expert to the clock).
        self._keys = {layer: tuple(ExpertKey(layer, e) for e in range(lm.n_experts)) for layer in lm.moe_layers}

    # ------------------------------------------------------------------ set-up
    def load_static(self, placed: list[tuple[int, ExpertKey]]) -> None:
        """Fill slots once, synchronously (resident, static caches)."""
        for slot, key in placed:
            self.slots.fill_from(slot, self.lm.host.flat(key))
        if self.cuda:
            torch.cuda.synchronize(self.device)

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

    # ------------------------------------------------------------------ copies
    def issue(self, order: CopyOrder):
        """Evict (bookkeeping already done by the planner) and copy ``order.key`` into its slot."""
        return self.issue_many((order,))[0]

    def issue_many(self, orders) -> list:
        """`issue` each order in turn, switching to the copy stream once for all of them (a stream switch costs
        host time, and a layer issues its demand copies, or a lookahead its prefetches, together)."""
        if self.copy_stream is None or not orders:
            return [self._issue_one(o) for o in orders]
        torch.cuda.set_stream(self.copy_stream)          # cheaper than the torch.cuda.stream() context
        try:
            return [self._issue_one(o) for o in orders]
        finally:
            torch.cuda.set_stream(self.compute_stream)

    def _issue_one(self, order: CopyOrder):
        """One copy; on CUDA the copy stream is already the current one (`issue_many`)."""
        rec = self.recorder
        if order.evicted is not None:
            if order.evicted_unused_prefetch:
                rec.wasted(order.evicted, order.wasted)
            rec.evicted(order.evicted)
            self._ready.pop(order.slot, None)
        slot, key = order.slot, order.key
        nbytes = self._expert_bytes
        if self.copy_stream is None:
            start = self.clock.stamp()
            self.slots.fill_from(slot, self.lm.host.flat(key))
            handle = self.clock.copy(key, nbytes, order.kind, start)
        else:
            cs = self.copy_stream
            free = self._free_event.get(slot)
            if free is not None:
                cs.wait_event(free)
            self.slots.fill_from(slot, self.lm.host.flat(key))
            if self.pace_extra_ms_per_byte > 0:
                # Emulate a slower link: keep the copy stream busy for the missing transfer time.
                torch.cuda._sleep(int(nbytes * self.pace_extra_ms_per_byte * self.sleep_cycles_per_ms))
            handle = self.clock.copy(key, nbytes, order.kind, None, cs)     # its start follows from the stream
        self._ready[slot] = handle
        rec.copied(order.kind)
        return handle

    def wait_ready(self, slot: int) -> None:
        """Make the compute stream wait for the copy that filled ``slot`` (a stall interval when it must)."""
        self._wait_for(self._ready.pop(slot, None))

    def wait_ready_many(self, slots) -> None:
        """`wait_ready` for every slot of ``slots`` at once, for a step that reads them all together (a graph
        segment): copies run in issue order on the one copy stream, so waiting for the last one issued among
        them waits for all of them. One readiness check and at most one stall interval instead of one per slot
        (each cost the host ~10-16 µs a layer on the H200 host). Handles' ``end_ms`` grows in issue order on
        both clocks (the measured one predicts it from the issue time, the modeled one queues the link)."""
        ready, last = self._ready, None
        for slot in slots:
            handle = ready.pop(slot, None)
            if handle is not None and (last is None or handle.end_ms >= last.end_ms):
                last = handle
        self._wait_for(last)

    def _wait_for(self, handle) -> None:
        if handle is None:
            return
        ev = handle.native
        if isinstance(ev, torch.cuda.Event):
            if ev.query():                 # already landed: no stall, no events
                return
            start = self.clock.stamp()
            self.compute_stream.wait_event(ev)
            self.clock.wait(handle, start)
        else:
            self.clock.wait(handle)

    def _release(self, slot: int) -> None:
        if self.cuda:
            ev = torch.cuda.Event()
            ev.record(self.compute_stream)
            self._free_event[slot] = ev

    # ------------------------------------------------------------------ the layer
    def start_layer(self, plan: LayerPlan, x: torch.Tensor, act: Callable):
        """CPU-lane tasks first (they overlap everything after), then the demand copies that have slots."""
        rows = _Rows(plan.routes, plan.needed, x.shape[0], x.device)
        int8 = int8_tasks(plan.cpu)
        cpu = {e: (self._submit_cpu_int8 if e in int8 else self._submit_cpu)(
                   ExpertKey(plan.layer, e), rows(x, e), len(plan.routes[e][0]), act)
               for e in plan.cpu}
        for order in plan.copies:
            self.issue(order)
        return rows, cpu

    def run_experts(self, layer: int, runs: tuple[ExpertRun, ...], rows: _Rows, x: torch.Tensor, act: Callable) -> dict:
        if self.batched and rows.T == 1:
            return self._run_experts_batched(layer, runs, rows, x, act)
        clock, outs = self.clock, {}
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
                self.issue(r.late_copy)
            if r.prefetch_used is not None:
                self.recorder.prefetch_used(key, r.prefetch_used, clock.now_ms())
            self.wait_ready(r.slot)
            gate_up, down = self.slots.weights(r.slot)
            start = clock.stamp()
            outs[r.expert] = expert_forward(xs, gate_up, down, act)
            clock.gpu_expert(key, n, start)
            self._release(r.slot)
            if r.drop_after:
                self._ready.pop(r.slot, None)
        return outs

    def _run_experts_batched(self, layer: int, runs: tuple[ExpertRun, ...], rows: _Rows, x: torch.Tensor,
                             act: Callable) -> dict:
        """One token (x [1,H]) on the CPU: the clock and recorder hear about every expert in the same order as
        `run_experts`, but the experts held in slots run as one gathered batch (`_flush`). A late copy may
        refill a slot an earlier expert of this layer reads, so the experts gathered so far run first."""
        clock, outs, pending, ready = self.clock, {}, [], self._ready
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
                self.issue(r.late_copy)
            if r.prefetch_used is not None:
                self.recorder.prefetch_used(key, r.prefetch_used, clock.now_ms())
            if r.slot in ready:          # filled by a copy the clock has not seen waited for
                self.wait_ready(r.slot)
            pending.append((r.expert, r.slot))
            clock.gpu_expert(key, 1)
            if r.drop_after:
                ready.pop(r.slot, None)
        self._flush(pending, rows, x, act)
        return outs

    def run_hits(self, layer: int, expert_ids: list[int], slots: list[int], x: torch.Tensor,
                 top_k_weights: torch.Tensor, act: Callable) -> torch.Tensor:
        """One token on the CPU (``batched``) whose K selections all hit (LayerPlanner.plan_hits): x [1,H] ->
        [1,H]. What `start_layer`, `run_experts` and `finish_layer` do for such a layer, in one call: the clock
        hears of each expert in ascending order, the K experts run as one gathered batch in top-k order, and
        the combine adds them in ascending expert order."""
        keys, clock, ready = self._keys[layer], self.clock, self._ready
        order = sorted(range(len(expert_ids)), key=expert_ids.__getitem__)   # top-k positions, experts ascending
        for p in order:
            if slots[p] in ready:        # filled by a copy the clock has not seen waited for
                self.wait_ready(slots[p])
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

    # ------------------------------------------------------------------ CPU lane
    def _submit_cpu(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device=None):
        """``out_device``: where the output lands (default: this executor's device)."""
        gate_up, down = self.lm.host.weights(key)
        if self.cpu_lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = expert_forward(xs.to(gate_up.dtype), gate_up, down, act)
            return self.clock.cpu_expert(key, n), out
        lane = self.cpu_lane.submit(xs, gate_up, down, act, self.device if out_device is None else out_device,
                                    stream=self.compute_stream if xs.device.type == "cuda" else None)
        return self.clock.cpu_expert(key, n), lane

    def _submit_cpu_int8(self, key: ExpertKey, xs: torch.Tensor, n: int, act, out_device=None):
        """`_submit_cpu` with the lossy int8 kernel, from the experts' int8 copy (a cpu_int8 miss)."""
        weights = self.int8.weights(key)
        if self.cpu_lane is None:   # modeled on this machine: compute here, time it as the CPU lane
            out = int8_expert_forward(xs.to("cpu"), weights, act).to(xs.device)
            return self.clock.cpu_expert(key, n, int8=True), out
        lane = self.cpu_lane.submit_int8(xs, weights, act, self.device if out_device is None else out_device,
                                         stream=self.compute_stream if xs.device.type == "cuda" else None)
        return self.clock.cpu_expert(key, n, int8=True), lane

    def _collect_cpu_host(self, key: ExpertKey, handle) -> torch.Tensor | None:
        """A CPU job's output, timed for the clock; None (counted as a fallback) when the job failed."""
        op, native = handle
        if isinstance(native, torch.Tensor):
            self.clock.cpu_collected(op)
            return native
        try:
            w0 = time.perf_counter()
            out, worker, t0, t1 = native.result()
            self.clock.cpu_collected(op, (worker, t0, t1, w0, time.perf_counter()))
            return out
        except Exception as err:  # noqa: BLE001 - any worker failure falls back to an exact copy
            self.recorder.cpu_fallback(key, err)
            return None

    def _collect_cpu(self, key: ExpertKey, handle, xs: torch.Tensor, act, fallback) -> torch.Tensor:
        out = self._collect_cpu_host(key, handle)
        if out is None:              # the job failed: copy the expert in and run it here, exactly
            order = fallback(key)
            self.issue(order)
            self.wait_ready(order.slot)
            gate_up, down = self.slots.weights(order.slot)
            start = self.clock.stamp()
            out = expert_forward(xs, gate_up, down, act)
            self.clock.gpu_expert(key, xs.shape[0], start)
            self._release(order.slot)
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
