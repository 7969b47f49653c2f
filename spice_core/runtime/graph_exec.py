"""GraphExecutor: the fast decode path. Prefill runs eager; each decode step replays CUDA-graph segments.

    prefill (T>1) ─► EagerExecutor's path (the engine's LayerRuntime.run_layer), into the decoder's StaticCache
    decode step  ─► GraphedDecoder.step: per MoE layer, after its segment's routing (and draft logits) land
                    in pinned memory ─► LayerRuntime.decide_layer ─► planner ─► demand copies on the copy
                    stream, waits for what the layer needs ─► slot of each selection ─► the next segment is
                    launched ─► LayerRuntime.run_deferred: the lookahead plans and issues its prefetches while
                    that segment runs (the layer's experts protected from eviction meanwhile)

The same planner decides as on the eager path, and copies, slots and the copy stream are the eager
executor's (this class extends it). What the graphs cannot do yet falls back to the eager executor
with a note (the engine decides, see `fast_path_refusal`): the CPU lane (cpu_compute) and
predictors that need the hidden state outside the captured segment (the gate predictor); an
orchestrating policy (spice) runs here with its CPU lane off, and says so. LoRE approximation is a
branch of the captured expert step (GraphedDecoder._lore_out). On the
CPU the decoder runs the same step op by op (`use_graphs=False`), which is how it is tested there.

Timing: one GPU-lane interval per segment (the layer's dense part plus the previous layer's
experts), copy intervals per expert, and stall intervals where the compute stream waits for a copy.
"""
from __future__ import annotations

import contextlib

import torch

from spice_core.runtime.eager import EagerExecutor
from spice_core.runtime.graphed import GraphedDecoder


def fast_path_refusal(spec, *, has_draft: bool) -> str:
    """Why this run cannot use the graphed executor ("" when it can)."""
    if spec.miss_mode == "cpu":
        return "the CPU lane (cpu_compute) runs on the eager executor only"
    if spec.predictor == "gate" or (spec.predictor == "draft" and not has_draft):
        return "the gate predictor reads hidden states the CUDA graphs keep: it runs on the eager executor only"
    return ""


CPU_LANE_OFF_NOTE = ("fast path: the CPU lane runs on the eager executor only, so exact misses are copied or "
                     "wait for their prefetch (run with the eager executor to use the CPU lane)")


def cache_bucket(n_tokens: int, max_context: int, step: int = 64) -> int:
    """The StaticCache length for a run of ``n_tokens`` (prompt + new tokens): rounded up to ``step``
    so that one captured decoder serves similar runs, and never past the model's context."""
    return min(max_context, -(-n_tokens // step) * step)


class GraphExecutor(EagerExecutor):
    name = "graphed"

    def __init__(self, lm, n_slots: int, clock, recorder, *, max_cache_len: int, draft=None,
                 use_graphs: bool | None = None, **kw) -> None:
        super().__init__(lm, n_slots, clock, recorder, **kw)
        self.max_cache_len, self.draft, self.use_graphs = max_cache_len, draft, use_graphs
        self.decoder: GraphedDecoder | None = None
        self.runtime = None
        self._moe_pos = {layer: i for i, layer in enumerate(lm.moe_layers)}

    def attach(self, runtime) -> None:
        """Capture the decode step (raises GraphCaptureError when it cannot) and take the runtime's decisions."""
        pre = extra = None
        if self.draft is not None:
            pre, extra = self.draft.head_readback, 2 * self.draft.distances * self.draft.n_experts
        self.decoder = GraphedDecoder(self.lm, self.slots.buffer, self.copy_stream, self.max_cache_len,
                                      use_graphs=self.use_graphs, wait_for_copies=False, pre_experts=pre,
                                      extra_numel=extra or 0, lore=self.lore)
        self.runtime = runtime
        if self.cuda:
            self.compute_stream = self.decoder.stream

    def start_token(self) -> None:
        if self.cuda:
            self.compute_stream = self.decoder.stream

    def on_layer(self, layer: int, expert_ids: list[int], weights: list[float]) -> list[int]:
        draft_logits = self.decoder.extra_np[self._moe_pos[layer]] if self.draft is not None else None
        return self.runtime.decide_layer(layer, expert_ids, weights, draft_logits)

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

    def forward(self, ids: list[int]) -> torch.Tensor:
        """``ids``: the prompt on the first call, then the one new token. Returns the next-token logits [V]."""
        dec = self.ex.decoder
        if not self._started:
            self._started = True
            dec.prefill(ids, own_experts=False)
            return dec.prefill_logits
        dec.step(ids[-1], self.ex.on_layer, self.ex.runtime.run_deferred)
        return dec.last_logits
