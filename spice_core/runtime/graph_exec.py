"""GraphExecutor: the fast decode path. Prefill runs eager; each decode step replays CUDA-graph segments.

    prefill (T>1) ─► EagerExecutor's path (the engine's LayerRuntime.run_layer), into the decoder's StaticCache
    decode step  ─► GraphedDecoder.step: per MoE layer, after its segment's routing (and draft logits) land
                    in pinned memory ─► LayerRuntime.decide_layer ─► planner ─► demand copies on the copy
                    stream, waits for what the layer needs ─► slot of each selection ─► the next segment is
                    launched ─► LayerRuntime.run_deferred: the lookahead plans and issues its prefetches while
                    that segment runs (the layer's experts protected from eviction meanwhile)

The same planner decides as on the eager path. This executor composes the mechanism: one `CopyEngine`
(slots, copy stream, link pacing), one `CpuJobs` (the CPU lane) and, for the eager prefill, an
`EagerExecutor` that shares both (``eager``: the runtime's `run_layer` runs the prompt through it, so the
prompt's copies land in the slots the decode steps read). A predictor that reads the hidden state (the draft's heads,
the gate predictor's next routers) runs as part of each layer's segment (``readback_predictor``: its
`head_readback` is captured, its numbers read back with the routing and parsed by
`predictions_from_readback`). A step that cannot be captured falls back to the eager executor with a note
(the engine's `build_runtime`). LoRE approximation is a branch of the captured expert step
(GraphedDecoder._lore_out).

The CPU lane inside the step (design A of the fast-path review): each segment reads its layer's
hidden state back with the routing; the host step submits the layer's CPU experts first (`submit_cpu`:
the lane computes them from the pinned slab), issues the demand copies, then joins them
(`join_cpu`) and writes their outputs into the decoder's pinned CPU rows, which the next segment's
captured H2D uploads with the plan row. The join comes before that segment's launch, so a job that
failed or ran past the lane's timeout is copied in instead, exactly, before anything reads it: the
worker returns its output to the driver and never writes a row itself, so a late worker cannot
race the upload. A miss the plan marks cpu_int8 is the same job with the int8 kernel (`CpuJobs.submit_int8`),
its output in the same CPU row. On the CPU the decoder runs the same step op by op (`use_graphs=False`),
which is how it is tested there.

Timing: one GPU-lane interval per segment (the layer's dense part plus the previous layer's
experts), copy intervals per expert, and stall intervals where the compute stream waits for a copy.
"""
from __future__ import annotations

import contextlib

import torch

from spice_core.policy.planner import int8_tasks
from spice_core.runtime.eager import EagerExecutor
from spice_core.runtime.graphed import GraphedDecoder
from spice_core.runtime.graphed_plan import CPU_SLOT, selection_rows
from spice_core.types import ExpertKey


def cache_bucket(n_tokens: int, max_context: int, step: int = 64) -> int:
    """The StaticCache length for a run of ``n_tokens`` (prompt + new tokens): rounded up to ``step``
    so that one captured decoder serves similar runs, and never past the model's context."""
    return min(max_context, -(-n_tokens // step) * step)


class GraphExecutor:
    name = "graphed"

    def __init__(self, lm, n_slots: int, clock, recorder, *, max_cache_len: int, readback_predictor=None,
                 use_graphs: bool | None = None, cpu_rows: bool = False, lore=None, **kw) -> None:
        """``cpu_rows``: the planner may send exact misses to the CPU lane (the decoder then reads each layer's
        hidden state back and uploads the lane's outputs with the plan row). ``kw``: the `EagerExecutor`'s
        mechanism arguments (copy stream, CPU lane, int8 copy, link pacing)."""
        self.eager = EagerExecutor(lm, n_slots, clock, recorder, lore=lore, **kw)
        self.copies, self.cpu, self.lore = self.eager.copies, self.eager.cpu, lore
        self.lm, self.clock, self.recorder = lm, clock, recorder
        self.device, self.cuda = lm.device, lm.device.type == "cuda"
        self.max_cache_len, self.use_graphs, self.cpu_rows = max_cache_len, use_graphs, cpu_rows
        self.readback_predictor = readback_predictor
        self.decoder: GraphedDecoder | None = None
        self.runtime = None
        self._moe_pos = {layer: i for i, layer in enumerate(lm.moe_layers)}

    def attach(self, runtime) -> None:
        """Capture the decode step (raises GraphCaptureError when it cannot) and take the runtime's decisions."""
        readback = n_draft = None
        if self.readback_predictor is not None:
            readback, n_draft = self.readback_predictor.head_readback, self.readback_predictor.readback_numel
        self.decoder = GraphedDecoder(self.lm, self.copies.slots.buffer, self.copies.copy_stream, self.max_cache_len,
                                      use_graphs=self.use_graphs, wait_for_copies=False, draft_readback=readback,
                                      draft_numel=n_draft or 0, lore=self.lore, cpu_rows=self.cpu_rows,
                                      static_slots=self._static_slots(runtime.planner))
        self.runtime = runtime
        if self.cuda:
            self.copies.compute_stream = self.decoder.stream

    def _static_slots(self, planner):
        """[M, E] the slot of every expert, when every expert is resident for the run's life (``resident``: its
        decode step is one graph with no host step, `GraphedDecoder`); else None."""
        if not planner.spec.preload_all or self.readback_predictor is not None or self.lore is not None or self.cpu_rows:
            return None
        where, layers = planner.residency.where, self.lm.moe_layers
        keys = [[ExpertKey(layer, e) for e in range(self.lm.n_experts)] for layer in layers]
        if not all(key in where for row in keys for key in row):
            return None
        return torch.tensor([[where[key] for key in row] for row in keys], dtype=torch.long, device=self.device)

    def start_token(self) -> None:
        if self.cuda:
            self.copies.compute_stream = self.decoder.stream

    def on_layer(self, layer: int, expert_ids: list[int], weights: list[float]) -> list[int]:
        dec = self.decoder
        if dec.segment_end is not None:       # a replayed segment produced this routing: the clock times it
            self.clock.segment(dec.segment_launch_s, dec.segment_end)
        readback_row = dec.draft_np[self._moe_pos[layer]] if self.readback_predictor is not None else None
        return self.runtime.decide_layer(layer, expert_ids, weights, readback_row)

    # ------------------------------------------------------------------ the CPU lane, inside the step
    def submit_cpu(self, layer: int, experts) -> dict:
        """Start layer ``layer``'s CPU experts (ascending ids) from the host slab, on the hidden state the segment
        read back (``decoder.x_host``; its D2H landed before the host step). ``experts``: the plan's `LayerPlan.cpu`,
        which says which of them run the int8 kernel. Returns expert -> job."""
        x = self.decoder.x_host[self._moe_pos[layer]].view(1, -1)
        act = self.lm.experts_modules[layer].act_fn
        int8, jobs, n = int8_tasks(experts), self.cpu, len(experts)
        return {e: (jobs.submit_int8 if e in int8 else jobs.submit)(ExpertKey(layer, e), x, 1, act, "cpu", decode=True,
                                                                    batch=n)
                for e in experts}

    def join_cpu(self, layer: int, jobs: dict, expert_ids: list[int], fallback) -> dict:
        """Wait for the CPU jobs of ``layer`` and write each output into the decoder's pinned CPU row of its
        selection (uploaded with the plan row when the next segment runs). A job that failed or ran past the
        lane's timeout falls back to an exact copy (``fallback(key)`` -> CopyOrder, its slot held busy), which
        the compute stream waits for. Returns expert -> CPU_SLOT, or the slot of the copy it fell back to."""
        i = self._moe_pos[layer]
        rows = selection_rows(expert_ids, self.lm.n_experts)
        out = {}
        for e, handle in jobs.items():
            key = ExpertKey(layer, e)
            y = self.cpu.collect(key, handle)
            if y is not None:
                self.decoder.cpu_host[i, rows[e]].copy_(y.reshape(-1))
                out[e] = CPU_SLOT
                continue
            order = fallback(key)
            self.copies.issue(order)
            self.copies.wait_ready(order.slot)
            out[e] = order.slot
        return out

    def stepper(self) -> "GraphStepper":
        return GraphStepper(self)

    def close(self) -> None:
        """End of a run: drop the captured graphs and the runtime. The runtime and this executor refer to each
        other, so without this the run's slot buffer (~23 GiB at full scale and 25%) waited for the cyclic
        garbage collector, and a few runs in a row ran the GPU out of memory."""
        if self.decoder is not None:
            self.decoder.close()
        self.decoder = None
        self.runtime = None


class GraphStepper:
    """Feeds the run one token at a time: the prompt first (eager prefill), then graph steps."""

    def __init__(self, ex: GraphExecutor) -> None:
        self.ex = ex
        self._started = False

    def context(self):
        s = self.ex.decoder.stream
        return torch.cuda.stream(s) if s is not None else contextlib.nullcontext()

    def forward(self, ids: list[int], *, run_ahead: bool = False) -> torch.Tensor:
        """``ids``: the prompt on the first call, then the one new token. Returns the next-token logits [V].
        ``run_ahead``: the caller will most likely feed back the greedy token (`GraphedDecoder.step`)."""
        dec = self.ex.decoder
        if not self._started:
            self._started = True
            dec.prefill(ids, own_experts=False)
            return dec.prefill_logits
        dec.step(ids[-1], self.ex.on_layer, self.ex.runtime.run_deferred, run_ahead=run_ahead)
        if dec.segment_end is not None and dec.static is None:
            self.ex.clock.segment(dec.segment_launch_s, dec.segment_end)   # the last segment: the layers after it
        return dec.last_logits
