"""DraftPredictor: SPICE's draft, aligned with the target's architecture, and its training.

    after MoE layer p's router:  x [1,H] ─► one matmul with p's stacked heads W_p [D*E,H] + b_p
        ─► logits [D,E] ─► log q = log_softmax(logits)         (distilled router distribution of layer p+d)
        ─► confidence = sigmoid(a·log q + m·(log q − log q_(k)) + c)   (per head; q_(k) the k-th largest)
        ─► LayerPrediction(d, layer p+d, confidence) for d = 1..min(D, ctx.max_lookahead)

One head per (MoE layer p, distance d). Head (p, d) predicts the MoE layer d steps later in
the token's layer order, wrapping into the next token(s): MoE position (p+d) mod n of token
t + (p+d) div n. That is what lets the last layers prefetch for the next token's first ones,
which the training-free gate predictor (next router on the current state) cannot see.

Why linear heads: a linear probe from layer l's hidden state is known to reach recall@6 ~0.92
one to eight layers ahead on DeepSeek-V2-Lite (DESIGN.md §2); a layer's heads then cost one
batched matmul at inference (one launch, ~E·D·H·2 bytes read) instead of a rollout.
Heads whose target is in the same token start from that layer's router weights (the gate
predictor's solution), so distillation only has to learn the drift of the residual stream.

Training (`train_draft`): distillation, i.e. cross-entropy to the target router's full
distribution (= KL up to a constant) on routing traces, all heads of all layers in one
batched step; early stopping on held-out rows. The confidence is the predicted probability
that the expert is among the layer's selected ones: a per-head monotone map of q (Platt
scaling on held-out rows), so ``--tau-prefetch`` reads as a probability of use.

This module knows nothing of files (predictor/artifacts.py) or of how predictions are used
(policy/prefetch.py).
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from spice_core.errors import ConfigError
from spice_core.policy.prefetch import LayerPrediction

log = logging.getLogger(__name__)

MAX_DISTANCES = 64


def _log_softmax_np(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def target_table(n_moe: int, distances: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For head (p, d-1): the target's MoE position (p+d) mod n and token offset (p+d) div n. Both [n,D]."""
    q = torch.arange(n_moe)[:, None] + torch.arange(1, distances + 1)[None, :]
    return q % n_moe, q // n_moe


def check_distances(distances: int) -> None:
    if not isinstance(distances, int) or not 1 <= distances <= MAX_DISTANCES:
        raise ConfigError(f"distances={distances!r} is out of range: use an integer D in [1, {MAX_DISTANCES}] "
                          "(--distances)")


class DraftPredictor:
    """Trained draft heads for every MoE layer and distance (see the module docstring)."""

    name = "draft"

    def __init__(self, moe_layers: tuple[int, ...], weight: torch.Tensor, bias: torch.Tensor, calib: torch.Tensor,
                 top_k: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float16,
                 router_rule: tuple[bool, float] = (False, 1.0)) -> None:
        """weight [n,D*E,H], bias [n,D*E], calib [n,D,3] (a, m, c). ``router_rule``: how the target's router
        weighs its top-k (`families.router_weight_rule`), which the predicted weights follow."""
        n, de, h = weight.shape
        assert n == len(moe_layers) and bias.shape == (n, de) and calib.shape[:2] == (n, calib.shape[1])
        self.moe_layers = tuple(moe_layers)
        self.distances = int(calib.shape[1])
        self.n_experts = de // self.distances
        self.hidden = h
        self.top_k = int(top_k)
        self.device = torch.device(device)
        self.weight = weight.to(self.device, dtype).contiguous()
        self.bias = bias.to(self.device, dtype).contiguous()
        # On the CPU a half-precision matmul costs ~3x a float32 one (42 against 14 µs a layer): the heads run
        # on float32 copies of the half weights (an exact widening) over the input rounded to half as the half
        # matmul rounds it, so their logits are the half matmul's without its rounding of the output to half
        # (within 2e-3, tests/predictor). The budget keeps charging the half weights (`nbytes`); the host holds
        # both copies (3x `nbytes`).
        self._host32 = None
        if self.device.type == "cpu" and dtype == torch.float16:
            self._host32 = (self.weight.float(), self.bias.float())
        self.router_rule = (bool(router_rule[0]), float(router_rule[1]))
        self.calib = calib.float().cpu()
        self._calib_np = self.calib.numpy()
        self._pos = {layer: p for p, layer in enumerate(self.moe_layers)}
        self._host_buf: torch.Tensor | None = None      # pinned landing buffer of the heads' readback
        self._launched = None                           # (layer, (logits, ready event)) from `launch`
        self._calib_dev: torch.Tensor | None = None     # calib on the device, for `head_readback`

    # ------------------------------------------------------------------ memory
    @property
    def nbytes(self) -> int:
        """Device memory of the heads (the calibration scalars stay on the host)."""
        return self.weight.numel() * self.weight.element_size() + self.bias.numel() * self.bias.element_size()

    def budget_bytes(self, native_expert_bytes: int, shape=None) -> int:
        """Bytes to reserve inside the routed-expert budget, in the loaded model's expert bytes.

        With a modeled target ``shape`` (e.g. DeepSeek-V2-Lite) the heads are sized for that
        shape's hidden width and charged in proportion to its expert size: one head of a
        DeepSeek-V2-Lite-sized draft is 1/66 of an expert, while a 128-wide miniature's head is
        about one expert, so charging native bytes would misstate the real trade-off.
        """
        if shape is None or getattr(shape, "name", "native") == "native":
            return self.nbytes
        head_bytes = len(self.moe_layers) * self.distances * self.n_experts * (shape.hidden + 1) * shape.dtype_bytes
        return int(math.ceil(head_bytes / shape.expert_bytes * native_expert_bytes))

    # ------------------------------------------------------------------ inference
    def confidence(self, p: int, logits: torch.Tensor) -> torch.Tensor:
        """logits [..., D', E] of MoE position p's first D' heads -> probability of use [..., D', E]."""
        logq = torch.log_softmax(logits.float(), dim=-1)
        kth = torch.topk(logq, min(self.top_k, logq.shape[-1]), dim=-1).values[..., -1:]
        c = self.calib[p, : logits.shape[-2]].to(logq.device)
        return torch.sigmoid(c[:, 0:1] * logq + c[:, 1:2] * (logq - kth) + c[:, 2:3])

    def _confidence_np(self, p: int, logits: np.ndarray) -> np.ndarray:
        """`confidence` for one token's [D', E] logits in numpy: at this size each torch op on the host
        costs ~10 µs against ~1 µs, and this runs after every MoE layer of every token."""
        return self._confidence_from_logq(p, _log_softmax_np(logits))

    def _confidence_from_logq(self, p: int, logq: np.ndarray) -> np.ndarray:
        E = logq.shape[-1]
        k = min(self.top_k, E)
        kth = np.partition(logq, E - k, axis=-1)[:, E - k:E - k + 1]
        c = self._calib_np[p, : logq.shape[0]]
        u = c[:, 0:1] * logq + c[:, 1:2] * (logq - kth) + c[:, 2:3]
        return np.exp(-np.logaddexp(0.0, -u)).astype(np.float32)     # sigmoid, without overflow

    def _weights_np(self, logq: np.ndarray) -> np.ndarray:
        """Predicted router weights [D', E] from log q: q as the target weighs its top-k (`router_rule`)."""
        q = np.exp(logq)
        normalised, scale = self.router_rule
        if normalised:
            E = q.shape[-1]
            k = min(self.top_k, E)
            q = q / np.partition(q, E - k, axis=-1)[:, E - k:].sum(axis=-1, keepdims=True)
        return (q * scale).astype(np.float32) if scale != 1.0 else q.astype(np.float32)

    def _weights(self, logq: torch.Tensor) -> torch.Tensor:
        """`_weights_np` on the device, [D, E] float32."""
        q = logq.exp()
        normalised, scale = self.router_rule
        if normalised:
            q = q / torch.topk(q, min(self.top_k, q.shape[-1]), dim=-1).values.sum(dim=-1, keepdim=True)
        return q * scale if scale != 1.0 else q

    @property
    def readback_numel(self) -> int:
        """Floats per layer `head_readback` makes: confidences, the ranking and the predicted weights."""
        return 3 * self.distances * self.n_experts

    def head_logits(self, layer: int, x_last: torch.Tensor) -> torch.Tensor:
        """x_last [1,H] -> every head's logits of this layer, [D*E] float32 (one matmul on x's device).
        The graphed executor captures this into the layer's segment and reads it back with the routing."""
        return self._logits(self._pos[layer], x_last).view(-1)

    def _logits(self, p: int, x_last: torch.Tensor) -> torch.Tensor:
        """Every head's logits at MoE position p, [1, D*E] float32."""
        if self._host32 is not None and x_last.device.type == "cpu":
            w32, b32 = self._host32
            return torch.addmm(b32[p][None], x_last.to(torch.float16).float(), w32[p].t())
        w, b = self.weight[p], self.bias[p]
        return torch.addmm(b[None], x_last.to(w.dtype), w.t()).float()

    @torch.no_grad()
    def launch(self, layer: int, x_last: torch.Tensor, ctx) -> None:
        """Queue this layer's heads on the device and their readback to the host, without waiting.

        Called before the routing is read back: that readback's synchronisation then covers the
        draft's too, so the draft adds no second host-device round trip per layer. ``ctx``: the
        run's PredictContext (runtime/context.py)."""
        p = self._pos[layer]
        # All D heads, whatever ctx.max_lookahead: it bounds prefetching (policy/prefetch.py),
        # while predictions beyond it still inform eviction, and cost the same single matmul.
        cuda = self.weight.device.type == "cuda"

        def run():  # the only device work: one matmul for all heads of this layer
            logits = self._logits(p, x_last)
            if not cuda:
                return logits, None
            if self._host_buf is None or self._host_buf.shape != logits.shape:
                with torch.inference_mode(False):   # outlives the run; written again by passes outside inference mode
                    self._host_buf = torch.empty(logits.shape, dtype=torch.float32, pin_memory=True)
            self._host_buf.copy_(logits, non_blocking=True)   # read in `predict` before the next launch
            ready = torch.cuda.Event()
            ready.record(ctx.stream if ctx.stream is not None else torch.cuda.current_stream(self.weight.device))
            return self._host_buf, ready

        start = ctx.clock.stamp()
        out = run()
        ctx.clock.draft(layer, 1, start)
        self._launched = (layer, out)

    def discard(self) -> None:
        """Drop a launched prediction the runtime decided not to use."""
        self._launched = None

    @torch.no_grad()
    def predict(self, layer: int, x_last: torch.Tensor, ctx) -> list[LayerPrediction]:
        """x_last [1,H]: layer ``layer``'s MoE input of the newest token (used unless `launch` ran)."""
        launched, self._launched = self._launched, None
        if launched is None or launched[0] != layer:
            self.launch(layer, x_last, ctx)
            launched, self._launched = self._launched, None
        logits, ready = launched[1]
        if ready is not None:
            ready.synchronize()
        return self.predictions_from_logits(layer, logits.numpy())

    def predictions_from_logits(self, layer: int, logits_np: np.ndarray) -> list[LayerPrediction]:
        """The heads' logits of ``layer`` (host, [D*E] or [D,E] float32) -> one LayerPrediction per distance."""
        p = self._pos[layer]
        depth, E = self.distances, self.n_experts
        logq = _log_softmax_np(np.asarray(logits_np, dtype=np.float32)[: depth * E].reshape(depth, E))
        conf_np = self._confidence_from_logq(p, logq)
        # The planner walks experts by descending confidence: one stable sort here instead of D in Python.
        order = np.argsort(-conf_np, axis=-1, kind="stable").tolist()
        conf, weights = conf_np.tolist(), self._weights_np(logq)   # weights: read a few times a plan, kept in numpy
        n = len(self.moe_layers)
        layers = self.moe_layers
        return [LayerPrediction(d + 1, layers[(p + d + 1) % n], conf[d], order[d], weights[d]) for d in range(depth)]

    def head_readback(self, layer: int, x_last: torch.Tensor) -> torch.Tensor:
        """x_last [1,H] -> what the graphed executor reads back per layer, [3*D*E] float32 on x's device: every
        head's confidence (`confidence`), then the experts by descending confidence, ties by index (ids as
        floats, exact below 2^24), then the predicted router weights (`_weights`). Captured into the layer's
        segment: the device ranks the 8 x 64 predictions, so the host step only parses them
        (`predictions_from_readback`; numpy took ~85 µs a layer)."""
        p = self._pos[layer]
        D, E = self.distances, self.n_experts
        if self._calib_dev is None or self._calib_dev.device != x_last.device:
            self._calib_dev = self.calib.to(x_last.device)      # made in the eager warm-up, before any capture
        logq = torch.log_softmax(self._logits(p, x_last).view(D, E), dim=-1)
        kth = torch.topk(logq, min(self.top_k, E), dim=-1).values[:, -1:]
        c = self._calib_dev[p, :D]
        conf = torch.sigmoid(c[:, 0:1] * logq + c[:, 1:2] * (logq - kth) + c[:, 2:3])
        order = torch.sort(conf, dim=-1, descending=True, stable=True).indices
        return torch.cat([conf.reshape(-1), order.reshape(-1).to(torch.float32), self._weights(logq).reshape(-1)])

    def predictions_from_readback(self, layer: int, arr: np.ndarray, ctx=None) -> list[LayerPrediction]:
        """`head_readback`'s numbers of ``layer`` (host, [3*D*E] float32) -> one LayerPrediction per distance (every
        head, whatever ``ctx.max_lookahead``: predictions beyond it inform eviction)."""
        p = self._pos[layer]
        D, E = self.distances, self.n_experts
        conf = arr[: D * E].reshape(D, E).tolist()
        order = arr[D * E: 2 * D * E].reshape(D, E).astype(np.int64).tolist()
        # Views of the read-back row, read by the plan this call feeds (before the next token overwrites the row),
        # a few times each: no list (~12 µs).
        weights = arr[2 * D * E: 3 * D * E].reshape(D, E)
        n, layers = len(self.moe_layers), self.moe_layers
        return [LayerPrediction(d + 1, layers[(p + d + 1) % n], conf[d], order[d], weights[d]) for d in range(D)]

    @torch.no_grad()
    def predict_batch(self, p: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """For evaluation: x [N,H] at MoE position p -> (log q [N,D,E], confidence [N,D,E]), float32."""
        w, b = self.weight[p].float(), self.bias[p].float()
        logits = torch.addmm(b[None], x.to(w.device).float(), w.t()).view(-1, self.distances, self.n_experts).cpu()
        return torch.log_softmax(logits, dim=-1), self.confidence(p, logits)

    def tensors(self) -> dict[str, torch.Tensor]:
        """What artifacts.py saves: weight float16, bias and calibration float32, on the host."""
        return {"weight": self.weight.detach().cpu().half().contiguous(),
                "bias": self.bias.detach().cpu().float().contiguous(), "calib": self.calib.contiguous()}


# ---------------------------------------------------------------------- training
@dataclass(frozen=True)
class DraftTrainConfig:
    distances: int = 8
    epochs: int = 12
    batch_tokens: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    eval_frac: float = 0.1
    seed: int = 0
    time_budget_s: float | None = None   # stop early (keeping the best epoch) after this long

    def __post_init__(self) -> None:
        check_distances(self.distances)
        if self.epochs < 1 or self.batch_tokens < 1:
            raise ConfigError(f"epochs={self.epochs}, batch_tokens={self.batch_tokens}: both must be >= 1")
        if not 0.0 < self.eval_frac < 1.0:
            raise ConfigError(f"eval_frac={self.eval_frac} is out of range: use a value in (0, 1)")


def _targets(traces, idx: torch.Tensor, tl: torch.Tensor, off: torch.Tensor, with_selection: bool = True):
    """Router distributions (and selections) of every head's target for tokens ``idx`` [B].

    Token-major, the layout the heads' logits come in: probs [n,B,D,E] float32, selected
    [n,B,D,E] bool (None without ``with_selection``), valid [n,B,D] (target in the same row).
    """
    N = traces.n_tokens
    j = idx[None, :, None] + off[:, None, :]                     # [n,B,D]
    jc = j.clamp(max=N - 1)
    valid = (j < N) & (traces.row[jc] == traces.row[idx][None, :, None])
    layer = tl[:, None, :].expand_as(jc)
    probs = traces.probs[layer, jc].float()
    sel = None
    if with_selection:
        sel = torch.zeros_like(probs, dtype=torch.bool)
        sel.scatter_(-1, traces.topk[layer, jc].long(), True)
    return probs, sel, valid


def _fit_calibration(logq: torch.Tensor, sel: torch.Tensor, valid: torch.Tensor, top_k: int,
                     steps: int = 60) -> torch.Tensor:
    """Platt scaling per head: logq, sel [n,B,D,E], valid [n,B,D] -> calib [n,D,3] (a, m, c).

    Heads are independent, so each MoE layer's D heads are fitted together (small tensors)."""
    n, _, D, _ = logq.shape
    out = torch.zeros(n, D, 3)
    for p in range(n):
        lq = logq[p]
        kth = torch.topk(lq, min(top_k, lq.shape[-1]), dim=-1).values[..., -1:]
        f1, f2, y = lq, lq - kth, sel[p].float()
        w = valid[p][..., None].float().expand_as(y)
        params = torch.zeros(D, 3)
        params[:, 0], params[:, 2] = 1.0, math.log(top_k)   # start near min(1, k*q)
        params.requires_grad_(True)
        opt = torch.optim.LBFGS([params], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

        def closure():
            opt.zero_grad()
            z = params[:, 0, None] * f1 + params[:, 1, None] * f2 + params[:, 2, None]
            loss = (F.binary_cross_entropy_with_logits(z, y, reduction="none") * w).sum() / w.sum().clamp(min=1)
            loss.backward()
            return loss

        opt.step(closure)
        out[p] = params.detach()
    return out


def train_draft(traces, cfg: DraftTrainConfig = DraftTrainConfig(), *,
                init_routers: list[torch.Tensor] | None = None,
                device: torch.device | str = "cpu") -> tuple[DraftPredictor, dict]:
    """Distil one head per (MoE layer, distance) from routing traces; returns (draft, report).

    ``init_routers``: each MoE layer's router weight [E,H] (moe_layers order): heads whose target
    is in the same token start from it. The report holds held-out loss per epoch and recall@k.
    """
    t0 = time.perf_counter()
    n, N, H = traces.hidden.shape
    E, K, D = traces.n_experts, traces.top_k, cfg.distances
    if N < 4:
        raise ConfigError(f"the calibration set has only {N} tokens: pass more text (--text, --max-tokens)")
    g = torch.Generator().manual_seed(cfg.seed)
    tl, off = target_table(n, D)
    train_tr, eval_tr = traces.split_rows(cfg.eval_frac)
    if eval_tr.n_tokens == 0 or train_tr.n_tokens == 0:
        train_tr = eval_tr = traces
    W = torch.zeros(n, D, E, H)
    if init_routers is not None:
        for p in range(n):
            for d in range(D):
                if int(off[p, d]) == 0:
                    W[p, d] = init_routers[int(tl[p, d])].float().cpu()
    # Bias starts at the log of each target's mean routing distribution (the popularity prior).
    mean_p = traces.probs.float().mean(dim=1).clamp_min(1e-8).log()          # [n,E]
    b = mean_p[tl] - mean_p[tl].mean(-1, keepdim=True)                        # [n,D,E]
    W = W.reshape(n, D * E, H).requires_grad_(True)
    b = b.reshape(n, D * E).clone().requires_grad_(True)
    opt = torch.optim.AdamW([W, b], lr=cfg.lr, weight_decay=cfg.weight_decay)
    Ntr = train_tr.n_tokens
    steps_per_epoch = max(1, math.ceil(Ntr / cfg.batch_tokens))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=cfg.lr, total_steps=cfg.epochs * steps_per_epoch,
                                                pct_start=0.1)
    ev_idx = torch.arange(eval_tr.n_tokens)
    if len(ev_idx) > 1536:
        ev_idx = ev_idx[torch.randperm(len(ev_idx), generator=g)[:1536]].sort().values
    ev_probs, ev_sel, ev_valid = _targets(eval_tr, ev_idx, tl, off)
    ev_x = eval_tr.hidden[:, ev_idx].float()

    def eval_logits(Wt, bt):                                                  # [n,B,D,E]
        return torch.baddbmm(bt[:, None, :], ev_x, Wt.transpose(1, 2)).view(n, -1, D, E)

    def heldout_loss(Wt, bt) -> float:
        lq = torch.log_softmax(eval_logits(Wt, bt), dim=-1)
        ce = -(ev_probs * lq).sum(-1)
        return float((ce * ev_valid).sum() / ev_valid.sum().clamp(min=1))

    with torch.no_grad():
        best = (heldout_loss(W, b), W.detach().clone(), b.detach().clone(), 0)
    history = [best[0]]
    stopped = "epochs"
    for epoch in range(1, cfg.epochs + 1):
        perm = torch.randperm(Ntr, generator=g)
        for s in range(steps_per_epoch):
            idx = perm[s * cfg.batch_tokens:(s + 1) * cfg.batch_tokens].sort().values
            probs, _, valid = _targets(train_tr, idx, tl, off, with_selection=False)
            x = train_tr.hidden[:, idx].float()                                   # [n,B,H]
            logits = torch.baddbmm(b[:, None, :], x, W.transpose(1, 2))           # [n,B,D*E]
            lq = torch.log_softmax(logits.view(n, -1, D, E), dim=-1)
            ce = -(probs * lq).sum(-1)                                            # [n,B,D]
            loss = (ce * valid).sum() / valid.sum().clamp(min=1)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        with torch.no_grad():
            h = heldout_loss(W, b)
        history.append(h)
        if h < best[0]:
            best = (h, W.detach().clone(), b.detach().clone(), epoch)
        if cfg.time_budget_s is not None and time.perf_counter() - t0 > cfg.time_budget_s:
            stopped = "time budget"
            break
    _, Wb, bb, best_epoch = best
    with torch.no_grad():
        lq = torch.log_softmax(eval_logits(Wb, bb), dim=-1)
    calib = _fit_calibration(lq, ev_sel, ev_valid, K)
    draft = DraftPredictor(traces.moe_layers, Wb, bb, calib, K, device=device)
    recall = recall_by_distance(lq, ev_sel, ev_valid, K)
    report = {"train_tokens": Ntr, "heldout_tokens": int(len(ev_idx)), "distances": D,
              "heldout_ce_per_epoch": [round(v, 5) for v in history], "best_epoch": best_epoch, "stopped": stopped,
              "heldout_recall_at_k": {str(d + 1): round(r, 4) for d, r in enumerate(recall)},
              "train_s": round(time.perf_counter() - t0, 1)}
    log.info("draft: %d heads, held-out CE %.4f -> %.4f, recall@%d d=1: %.3f, %.1fs", n * D, history[0], best[0], K,
             recall[0], report["train_s"])
    return draft, report


def recall_by_distance(scores: torch.Tensor, sel: torch.Tensor, valid: torch.Tensor, k: int) -> list[float]:
    """scores, sel [n,B,D,E], valid [n,B,D] -> per distance: mean |top-k(scores) ∩ selected| / k."""
    top = torch.topk(scores, k, dim=-1).indices
    hit = sel.gather(-1, top).float().sum(-1) / k                 # [n,B,D]
    v = valid.float()
    return ((hit * v).sum(dim=(0, 1)) / v.sum(dim=(0, 1)).clamp(min=1)).tolist()
