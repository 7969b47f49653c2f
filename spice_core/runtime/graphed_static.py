"""StaticStep: the graphed decoder's step for a cache that never changes (every expert resident): one graph.

    step(token)  ─► replay the one graph (or take the step run ahead for ``token``; another token rolls it back)
                 ─► read the token, and the routing every layer staged on the device
                 ─► with run_ahead: launch the next step (its own stream) before the host books this one
                 ─► tell the host each layer's routing (``on_layer``), its slots checked against the table's

Each layer's plan row is computed on the device from its routing (`static_plan.StaticPlanner`), so no host
decision sits between layers. A step run ahead overlaps the host's booking and the caller's per-token work
with the GPU; a different token at the next call rolls it back (position and cache lengths). A measured clock
then sees that step only as the host's wait for it (its GPU work overlapped the last token's bookkeeping,
outside this token's window); TPOT, the wall time per delivered token, is unaffected.

The decoder (runtime/graphed.py) owns the graphs, the stream, the host rows and the step body; this class owns
what only the static step has: the slot table, the device planner, and the run-ahead state.
"""
from __future__ import annotations

import time

import torch

from spice_core.errors import SpiceError
from spice_core.runtime.static_plan import StaticPlanner


def _rewind_one_token(layer) -> None:
    """Take back a static cache layer's last token in place (its buffers keep their addresses): `crop(-1)` where
    the layer has it (transformers 5.24), else every in-place length counter it keeps (5.17's static layers have
    no `crop`)."""
    if hasattr(layer, "crop"):
        layer.crop(-1)
        return
    counters = [getattr(layer, n) for n in ("cumulative_length", "indexer_cumulative_length")
                if isinstance(getattr(layer, n, None), torch.Tensor)]
    if not counters:
        raise SpiceError(f"cannot take a token back from a {type(layer).__name__} cache layer: it has no crop() "
                         "and no length tensor; decode without running ahead (sampling) or update transformers")
    for c in counters:
        c.sub_(1)


class StaticStep:
    def __init__(self, dec, static_slots: torch.Tensor) -> None:
        """``dec``: the GraphedDecoder (its io, stream and graphs); ``static_slots`` [M, E] long on the device."""
        self.dec = dec
        self.table = static_slots.tolist()
        self.planner = StaticPlanner(static_slots, dec.n_slots, dec.io, slot_order=dec.kernel == "grouped")
        self.ahead = False                  # a step launched before the host booked the last one
        self.ahead_logits = None            # the last step's logits, kept from the step launched after it
        self.steps_run_ahead, self.steps_rolled_back = 0, 0
        self._stream = torch.cuda.Stream(dec.device) if dec.device.type == "cuda" else None   # run-ahead replays

    def step(self, token: int, run_ahead: bool) -> int:
        """The whole step at once (one graph on CUDA): run it, or take the one run ahead for ``token``, read its
        token and routing, run the next step ahead if asked, then tell the host each layer's routing."""
        dec = self.dec
        if self.ahead:
            self.settle()
            if token != dec._next_token:         # the step run ahead took another token: undo it, run this one
                self.steps_rolled_back += 1
                self.roll_back()
                self.launch(token)
        else:
            self.launch(token)
        if dec.use_graphs:
            dec._events[-1].synchronize()
            out = int(dec.io.token_np[0])
        else:
            with dec._on_stream():          # waits for the step's readback too (eager on CUDA)
                out = int(dec.logits[0, -1].argmax())
        # A step run ahead overwrites the host rows while this one is booked: book from a copy then.
        routing = (dec.io.idx_np.copy(), dec.io.w_np.copy()) if run_ahead else None
        self.ahead_logits = None
        if run_ahead:
            with dec._on_stream():
                self.ahead_logits = dec.logits[0, -1].clone()
            self.launch(out, ahead=True)
            self.steps_run_ahead += 1
        dec._pos_host += 1
        dec._next_token = out
        try:
            self.tell_layers(routing, overlapped=run_ahead and dec.use_graphs)
        except BaseException:
            if self.ahead:      # the step is done, its booking failed: the caller may not feed its token back
                self.settle()
                self.roll_back()
                dec._next_token = None       # `ids` hold the undone step's token now: the next step writes its own
            raise
        return out

    def launch(self, token: int, ahead: bool = False) -> None:
        """One static step at the device's position; ``ahead``: its input is the last step's greedy token, which
        the step itself left in ``ids``, replayed on a stream of its own so the caller's work does not queue
        behind it."""
        dec = self.dec
        if not dec.use_graphs:
            with dec._on_stream(), dec._hooked("eager"), torch.no_grad():
                if not ahead and token != dec._next_token:
                    dec.ids.fill_(token)
                dec.logits = dec._body()
            self.ahead = ahead
            return
        s = self._stream if ahead else dec.stream
        if ahead:
            s.wait_stream(dec.stream)
        with torch.cuda.stream(s):
            if not ahead and token != dec._next_token:
                dec.ids.fill_(token)
            dec._graphs[0].replay()
            dec._events[-1].record(s)
        # Not made to wait for it: the caller's work on the decoder's stream reads `last_logits` (a copy made
        # before the launch); whatever touches the step's state waits for it on the host (`settle`).
        self.ahead = ahead

    def settle(self) -> None:
        """Wait for a step run ahead (its results are read next); the last step's kept logits go."""
        if self.ahead and self.dec.use_graphs:
            self.dec._events[-1].synchronize()
        self.ahead, self.ahead_logits = False, None

    def roll_back(self) -> None:
        """Undo the last step's advance of the position and the cache's lengths: the next step rewrites its K/V."""
        dec = self.dec
        with dec._on_stream():
            dec.pos.sub_(1)
            for layer in dec.cache.layers:
                _rewind_one_token(layer)

    def tell_layers(self, routing, overlapped: bool = False) -> None:
        """``on_layer`` for every MoE layer of a static step, after it ran, from ``routing`` (its (ids, weights)
        rows): the host records what it did. Host time, unless the next step runs meanwhile (``overlapped``).
        Each layer's slots must be the table's."""
        dec, table = self.dec, self.table
        t0 = time.perf_counter()
        for i, layer in enumerate(dec.lm.moe_layers):
            _, ids, ws = dec._routed(i, routing)
            slots = dec._on_layer(layer, ids, ws)
            if list(slots) != [table[i][e] for e in ids]:
                raise SpiceError(f"layer {layer}: the host placed experts {ids} in slots {list(slots)}, not the static "
                                 "table's: a static step needs a cache that never changes")
            if dec._after_replay is not None:
                dec._after_replay()
        if overlapped:
            dec.overlap_s += time.perf_counter() - t0
        else:
            dec.host_s += time.perf_counter() - t0
        dec.host_layers += len(dec.lm.moe_layers)
