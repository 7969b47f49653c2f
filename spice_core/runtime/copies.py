"""CopyEngine: moves experts from host memory into GPU slots, shared by both executors.

    issue / issue_many  ─► evict (the planner's bookkeeping is done), copy on the copy stream behind the
                           slot's last reader, link pacing, the clock's copy interval
    wait_ready(_many)   ─► the compute stream waits for the copy that filled a slot (a stall interval)
    release             ─► the compute stream's last read of a slot: the next copy into it waits for it

It owns the mechanism of copies and nothing else: the slot buffer, the copy stream, the emulated link's
pacing, and per slot the handle of the copy that filled it and the event after its last read. The
eager executor (runtime/eager.py) composes one; the graphed one (runtime/graph_exec.py) composes an eager
executor for its prefill and uses that executor's engine, so both see the same slots.

Host cost on CUDA: a copy is issued by the CUDA runtime's cudaMemcpyAsync called directly where that was
checked to give the same bytes at start (runtime/direct_copy.py), else by `Tensor.copy_`; each slot's release
event is made once and recorded again at every release (a stream that waited on it captured the record it
waited for), so a release makes no CUDA object, and the copy stream waits on it once (later copies into the slot
queue behind that one); a handle the engine drops goes back to the clock (`copy_done`), which records its end
event again for a later copy once it is resolved; a layer's demand copies in a row share one end event and, on
an emulated link, one pacing wait (`issue_many`); streams are passed explicitly (looking the current one up
costs ~25 µs a call on a GPU host).
"""
from __future__ import annotations

import torch

from spice_core.policy.planner import CopyOrder
from spice_core.runtime.direct_copy import checked
from spice_core.runtime.slots import SlotBuffer


class CopyEngine:
    def __init__(self, lm, n_slots: int, clock, recorder, *, copy_stream=None, compute_stream=None,
                 pace_extra_ms_per_byte: float = 0.0, sleep_cycles_per_ms: float = 0.0,
                 direct_copies: bool = True) -> None:
        """``copy_stream`` None: copies are synchronous (the CPU). ``compute_stream``: the stream that reads the
        slots (the executor keeps it current: `compute_stream` is set at every token's start).
        ``pace_extra_ms_per_byte``: link emulation, the extra copy time per byte (``sleep_cycles_per_ms`` turns it
        into `torch.cuda._sleep` cycles). ``direct_copies`` False: every copy by `Tensor.copy_` (the reference)."""
        self.lm, self.clock, self.recorder = lm, clock, recorder
        self.slots = SlotBuffer(lm.layout, n_slots, lm.device)
        self.copy_stream, self.compute_stream = copy_stream, compute_stream
        self.cuda = lm.device.type == "cuda"
        self._pace_cycles = int(lm.expert_bytes * pace_extra_ms_per_byte * sleep_cycles_per_ms)
        self.ready: dict[int, object] = {}       # slot -> clock handle of the copy that filled it (not yet waited for)
        self._free_event = [torch.cuda.Event() for _ in range(n_slots)] if self.cuda else []
        self._read = set()                        # slots with a recorded release event
        self._expert_bytes = lm.expert_bytes
        self.direct = None              # DirectCopy on CUDA where checked (see the module docstring)
        self.direct_off_why = "" if direct_copies else "copy_issue=torch"   # why `direct` is None, for the run notes
        if direct_copies and self.cuda and copy_stream is not None:
            key = next(iter(lm.host.keys()), None)
            if key is None:
                self.direct_off_why = "no expert to copy"
            else:
                self.direct, self.direct_off_why = checked(self.slots.buffer, copy_stream, lm.host.flat(key), key)

    # ------------------------------------------------------------------ set-up
    def load_static(self, placed) -> None:
        """Fill slots once, synchronously (resident, static caches): ``placed`` [(slot, ExpertKey)]."""
        for slot, key in placed:
            self.slots.fill_from(slot, self.lm.host.flat(key))
        if self.cuda:
            torch.cuda.synchronize(self.lm.device)

    # ------------------------------------------------------------------ copies
    def issue(self, order: CopyOrder):
        """Evict (bookkeeping already done by the planner) and copy ``order.key`` into its slot."""
        return self.issue_many((order,))[0]

    def issue_many(self, orders) -> list:
        """`issue` each order in turn, switching to the copy stream once for all of them (a stream switch costs
        host time, and a layer issues its demand copies, or a lookahead its prefetches, together). Demand copies
        of one layer in a row are timed by one clock event (`clock.copies`): the compute stream waits for them
        together anyway, and each event record costs the host µs. A prefetch keeps its own: it may be waited for
        alone, and must not wait for the prefetches queued after it."""
        if self.copy_stream is None or not orders:
            return [self._issue_one(o) for o in orders]
        torch.cuda.set_stream(self.copy_stream)          # cheaper than the torch.cuda.stream() context
        try:
            handles, i, n = [], 0, len(orders)
            while i < n:
                j = i + 1
                if orders[i].kind == "copy":
                    layer = orders[i].key.layer
                    while j < n and orders[j].kind == "copy" and orders[j].key.layer == layer:
                        j += 1
                if j - i == 1:
                    handles.append(self._issue_one(orders[i]))
                else:
                    handles.extend(self._issue_together(orders[i:j]))
                i = j
            return handles
        finally:
            torch.cuda.set_stream(self.compute_stream)

    def _issue_one(self, order: CopyOrder):
        """One copy; on CUDA the copy stream is already the current one (`issue_many`)."""
        if self.copy_stream is None:
            self._evict(order)
            start = self.clock.stamp()
            self.slots.fill_from(order.slot, self.lm.host.flat(order.key))
            handle = self.clock.copy(order.key, self._expert_bytes, order.kind, start)
        else:
            self._queue(order)
            handle = self.clock.copy(order.key, self._expert_bytes, order.kind, None, self.copy_stream)
        self._keep(order, handle)
        return handle

    def _issue_together(self, group) -> list:
        """Demand copies of one layer, queued in turn and timed by one clock event (see `issue_many`)."""
        issued_ms = self.clock.now_ms()
        for order in group:
            self._queue(order, pace=False)
        self._pace(len(group))       # one wait for the batch's missing link time: it is waited for as a whole
        handles = self.clock.copies([o.key for o in group], self._expert_bytes, "copy", self.copy_stream, issued_ms)
        for order, handle in zip(group, handles):
            self._keep(order, handle)
        return handles

    def _evict(self, order: CopyOrder) -> None:
        """Record what ``order`` evicted (the planner's bookkeeping is already done)."""
        if order.evicted is not None:
            if order.evicted_unused_prefetch:
                self.recorder.wasted(order.evicted, order.wasted)
            self.recorder.evicted(order.evicted)

    def _queue(self, order: CopyOrder, pace: bool = True) -> None:
        """Queue ``order``'s copy on the copy stream (the current one), behind its slot's last reader; ``pace``:
        then the emulated link's extra time for it."""
        self._evict(order)
        slot, key, cs = order.slot, order.key, self.copy_stream
        if slot in self._read:          # once: later copies into the slot queue behind this one
            self._read.discard(slot)
            cs.wait_event(self._free_event[slot])
        row = self.lm.host.flat(key)
        if self.direct is None or not self.direct(slot, key, row):
            self.direct = None          # refused once (logged): Tensor.copy_ from here on
            self.slots.fill_from(slot, row)
        if pace:
            self._pace(1)

    def _pace(self, n_copies: int) -> None:
        """Emulate a slower link: keep the copy stream busy for ``n_copies`` copies' missing transfer time."""
        if self._pace_cycles > 0:
            torch.cuda._sleep(self._pace_cycles * n_copies)

    def _keep(self, order: CopyOrder, handle) -> None:
        """``handle`` is the copy that fills ``order.slot`` now; the slot's last copy is dropped."""
        self._drop(self.ready.get(order.slot))      # its expert evicted, or dropped after use
        self.ready[order.slot] = handle
        self.recorder.copied(order.kind)

    def wait_ready(self, slot: int) -> None:
        """Make the compute stream wait for the copy that filled ``slot`` (a stall interval when it must)."""
        handle = self.ready.pop(slot, None)
        self._wait_for(handle)
        self._drop(handle)

    def wait_ready_many(self, slots) -> None:
        """`wait_ready` for every slot of ``slots`` at once, for a step that reads them all together (a graph
        segment): copies run in issue order on the one copy stream, so waiting for the last one issued among
        them waits for all of them. One readiness check and at most one stall interval instead of one per slot
        (each cost the host ~10-16 µs a layer on the H200 host). Handles' ``end_ms`` grows in issue order on
        both clocks (the measured one predicts it from the issue time, the modeled one queues the link)."""
        ready, last, popped = self.ready, None, []
        for slot in slots:
            handle = ready.pop(slot, None)
            if handle is not None:
                popped.append(handle)
                if last is None or handle.end_ms >= last.end_ms:
                    last = handle
        self._wait_for(last)
        for handle in popped:
            self.clock.copy_done(handle)

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

    def _drop(self, handle) -> None:
        """The engine holds ``handle`` no more: the clock may recycle what it refers to (a CUDA event)."""
        if handle is not None:
            self.clock.copy_done(handle)

    def release(self, slot: int) -> None:
        """The compute stream has queued its last read of ``slot``: a later copy into it waits for that read."""
        if self.cuda:
            self._free_event[slot].record(self.compute_stream)
            self._read.add(slot)

    def forget(self, slot: int) -> None:
        """The copy that filled ``slot`` needs no wait any more (its expert was dropped after use)."""
        self._drop(self.ready.pop(slot, None))
