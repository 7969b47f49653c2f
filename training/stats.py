"""Routing statistics of a DeepSeek-V2 or Qwen2-MoE model on held-out text, with plain transformers.

    model + token windows ─► trace_routing (forward hooks) ─► RoutingTrace ─► load / reuse / cross-layer stats

What is measured, per MoE layer l (dense layers, such as DeepSeek-V2's first, have no router
and are skipped; both families' routers are ``mlp.gate`` returning ``(logits, weights, top-k)``):
- load: the share of routed slots each expert receives; normalised entropy H(p)/log E
  (1 = perfectly even) and min share / uniform share (no collapsed expert: >= 0.2).
- reuse: mean |S_t ∩ S_{t-1}| / k between consecutive tokens of a sequence, against two
  baselines: random k-subsets (k/E) and the same layer's routing of two random tokens
  ("shuffled", which keeps popularity skew).
- cross-layer recall@k: apply layer l+1's router to layer l's MoE input (the hidden state
  after layer l's post-attention norm) and compare its top-k with the experts layer l+1 really
  picks; baseline: always predicting layer l+1's k most popular experts.

Everything after ``trace_routing`` is numpy on plain arrays, so tests can check the
formulas without a model. This module knows nothing about training or the engine.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RoutingTrace:
    layers: tuple[int, ...]     # decoder-layer index of each MoE layer, in order
    topk: np.ndarray            # [L, N, k] experts each token was routed to (N tokens, in sequence order)
    cross: np.ndarray           # [L-1, N, k] layer l+1's router applied to layer l's MoE input
    seq_id: np.ndarray          # [N] which sequence each token belongs to
    num_experts: int


def trace_routing(model, windows) -> RoutingTrace:
    """Run ``windows`` (an iterable of LongTensor [B, T]) through ``model`` and record routing."""
    import torch

    moe = [(i, layer.mlp) for i, layer in enumerate(model.model.layers) if hasattr(layer.mlp, "gate")]
    k = moe[0][1].gate.top_k
    num_experts = moe[0][1].gate.num_experts
    topk: list[list[np.ndarray]] = [[] for _ in moe]
    cross: list[list[np.ndarray]] = [[] for _ in moe[:-1]]
    seq_ids: list[np.ndarray] = []
    prev_input: list = [None]

    def pre_hook(j):
        def hook(module, args):
            x = args[0].reshape(-1, args[0].shape[-1])                               # [B*T, H]
            if j > 0:
                w = module.gate.weight.float()
                logits = prev_input[0].float() @ w.T                                  # [B*T, E]
                cross[j - 1].append(torch.topk(logits, k, dim=-1).indices.cpu().numpy().astype(np.int16))
            prev_input[0] = x
        return hook

    def gate_hook(j):
        def hook(module, args, output):
            topk[j].append(output[2].reshape(-1, k).cpu().numpy().astype(np.int16))
        return hook

    handles = []
    for j, (_, mlp) in enumerate(moe):
        handles.append(mlp.register_forward_pre_hook(pre_hook(j)))
        handles.append(mlp.gate.register_forward_hook(gate_hook(j)))
    try:
        n_seq = 0
        with torch.inference_mode():
            for batch in windows:
                model(input_ids=batch, use_cache=False)
                b, t = batch.shape
                seq_ids.append(np.repeat(np.arange(n_seq, n_seq + b), t))
                n_seq += b
    finally:
        for h in handles:
            h.remove()
    return RoutingTrace(
        layers=tuple(i for i, _ in moe),
        topk=np.stack([np.concatenate(x) for x in topk]),
        cross=np.stack([np.concatenate(x) for x in cross]) if cross else np.zeros((0, 0, k), np.int16),
        seq_id=np.concatenate(seq_ids), num_experts=num_experts)


def overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|a_i ∩ b_i| / k for expert sets a, b of shape [N, k]."""
    return (a[:, :, None] == b[:, None, :]).any(-1).sum(-1) / a.shape[1]


def load_shares(trace: RoutingTrace) -> np.ndarray:
    """[L, E] share of routed slots per expert (rows sum to 1)."""
    counts = np.stack([np.bincount(t.reshape(-1), minlength=trace.num_experts) for t in trace.topk])
    return counts / counts.sum(axis=1, keepdims=True)


def load_entropy(shares: np.ndarray) -> np.ndarray:
    """Normalised entropy H(p)/log E per layer."""
    p = np.where(shares > 0, shares, 1.0)
    return -(shares * np.log(p)).sum(axis=1) / np.log(shares.shape[1])


def consecutive_reuse(trace: RoutingTrace, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(reuse [L], shuffled baseline [L]) of expert sets between consecutive tokens."""
    same = trace.seq_id[1:] == trace.seq_id[:-1]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(trace.topk.shape[1])
    reuse = np.array([overlap(t[1:][same], t[:-1][same]).mean() for t in trace.topk])
    shuffled = np.array([overlap(t, t[perm]).mean() for t in trace.topk])
    return reuse, shuffled


def cross_layer_recall(trace: RoutingTrace) -> tuple[np.ndarray, np.ndarray]:
    """(recall [L-1] of layer l+1's experts from its router on layer l's input, popularity baseline [L-1])."""
    k = trace.topk.shape[2]
    recall = np.array([overlap(trace.cross[j], trace.topk[j + 1]).mean() for j in range(len(trace.cross))])
    popular = []
    for j in range(len(trace.cross)):
        counts = np.bincount(trace.topk[j + 1].reshape(-1), minlength=trace.num_experts)
        top = np.argsort(-counts, kind="stable")[:k]
        popular.append(overlap(np.broadcast_to(top, trace.topk[j + 1].shape), trace.topk[j + 1]).mean())
    return recall, np.array(popular)


def summarize(trace: RoutingTrace) -> dict:
    """Per-layer and overall numbers, as plain floats for JSON and the model card."""
    shares = load_shares(trace)
    entropy = load_entropy(shares)
    min_ratio = shares.min(axis=1) * trace.num_experts
    max_ratio = shares.max(axis=1) * trace.num_experts
    reuse, shuffled = consecutive_reuse(trace)
    recall, popular = cross_layer_recall(trace)
    k = trace.topk.shape[2]
    return {
        "tokens": int(trace.topk.shape[1]), "moe_layers": list(trace.layers), "top_k": k,
        "num_experts": trace.num_experts,
        "per_layer": {
            "load_entropy": entropy.round(4).tolist(), "min_share_vs_uniform": min_ratio.round(3).tolist(),
            "max_share_vs_uniform": max_ratio.round(3).tolist(), "consecutive_reuse": reuse.round(4).tolist(),
            "reuse_shuffled_baseline": shuffled.round(4).tolist(),
            "cross_layer_recall": recall.round(4).tolist(), "cross_layer_popularity_baseline": popular.round(4).tolist(),
        },
        "mean": {
            "load_entropy": round(float(entropy.mean()), 4), "consecutive_reuse": round(float(reuse.mean()), 4),
            "reuse_random_baseline": round(k / trace.num_experts, 4),
            "reuse_shuffled_baseline": round(float(shuffled.mean()), 4),
            "cross_layer_recall": round(float(recall.mean()), 4),
            "cross_layer_popularity_baseline": round(float(popular.mean()), 4),
        },
        "min": {"load_entropy": round(float(entropy.min()), 4),
                "min_share_vs_uniform": round(float(min_ratio.min()), 3),
                "cross_layer_recall": round(float(recall.min()), 4)},
    }
