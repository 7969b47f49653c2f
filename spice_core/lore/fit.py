"""Fitting LoRE surrogates on real activations, and measuring them per rank.

    traces {layer: x [N,H]}  hidden states entering each MoE layer on calibration text
      └─ per MoE layer: the layer's own router ─► which tokens each expert serves
           per expert i: X = its tokens (+ a down-weighted sample of others), Y = E_i(X), S = shared(X)
             h = act(X Gᵀ) ⊙ (X Uᵀ)  all I neuron activations of the expert [n,I]
             1. greedy selection (orthogonal matching pursuit) of R neurons: each step takes the
                neuron whose activation, orthogonalised against those already taken, explains
                most of the remaining output
             2. least squares of Y on [1, h_sel] in the orthonormal basis of that order (QR):
                C, and T = R⁻¹, so every prefix of the order is its own least-squares refit
             3. α: least squares of the remaining residual on S (kept only where it helps)
      ─► LoreBank (lore/bank.py)

Why this surrogate (measured; see docs/benchmarks/speed-quality.md and `lore_error_report`):
- a *linear* rank-r map (reduced-rank regression of Y on X) cannot represent the gated product
  act(g)·u, which is mostly even in x; on the activations experts see it explained little of
  their output at any rank, on random and on trained experts alike;
- truncated SVD of the weights ignores which directions the activations use (DESIGN §2:
  rank 64 keeps ~20% of a DeepSeek-V2-Lite expert's weight energy);
- r neurons chosen on activations, with the output projection refitted so it also carries
  what the dropped neurons contributed, beat both at every rank we measured, are nested (one
  file serves every rank up to R) and are fitted in closed form (deterministic, no training loop).

Input contract (shared with `spice_core.predictor.traces` / `spice_core.tools.calibrate`): ``traces`` is
a mapping MoE layer -> tensor [N,H] of that layer's MoE inputs, row t of every layer being the
same token. Also accepted: values that are ``(hidden, router_probs)`` tuples or dicts with a
``"hidden"`` entry, or an object with a ``hidden_by_layer()`` method returning that mapping
(`spice_core.predictor.traces.RoutingTraces`). Router probabilities are not needed (routing is recomputed with each layer's own router, exact for every family).

This module does not know where traces come from or where the bank is saved.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import torch
from torch.nn import functional as F

from spice_core.errors import ConfigError
from spice_core.exec.experts import expert_forward
from spice_core.lore.bank import LoreBank, LoreLayer, check_rank, expert_weights_hash, shared_fn_for
from spice_core.types import ExpertKey

log = logging.getLogger(__name__)

DEFAULT_BACKGROUND = 0.25     # other tokens' total weight, relative to the expert's own tokens
MAX_TOKENS_PER_EXPERT = 4096  # routed tokens used per expert (a deterministic subsample beyond)
MIN_ALPHA_GAIN = 0.01         # keep α_i only if it removes >= 1% of the remaining squared error
_PREFILTER = 256              # wider experts: greedy selection among the most important neurons only


# ---------------------------------------------------------------------- traces
def hidden_by_layer(traces, lm) -> dict[int, torch.Tensor]:
    """Normalise ``traces`` (see the module docstring) to {MoE layer: tensor [N,H]} on the CPU."""
    src = traces.hidden_by_layer() if hasattr(traces, "hidden_by_layer") else traces
    if not isinstance(src, Mapping) or not src:
        raise ConfigError("the calibration traces are empty: record them over some text "
                          "(python -m spice_core calibrate --model M)")
    out: dict[int, torch.Tensor] = {}
    for layer, v in src.items():
        if isinstance(v, Mapping):
            v = v["hidden"]
        elif isinstance(v, (tuple, list)):
            v = v[0]
        out[int(layer)] = torch.as_tensor(v).detach().to("cpu")
    missing = [layer for layer in lm.moe_layers if layer not in out]
    if len(missing) == len(lm.moe_layers):
        raise ConfigError(f"the calibration traces reach none of the MoE layers {list(lm.moe_layers)}: "
                          "record the hidden states entering the MoE layers")
    if missing:
        raise ConfigError(f"the calibration traces lack MoE layers {missing}: record every MoE layer's input")
    for layer in lm.moe_layers:
        t = out[layer]
        if t.dim() != 2 or t.shape[1] != lm.layout.hidden:
            raise ConfigError(f"calibration traces for layer {layer} have shape {tuple(t.shape)}: expected "
                              f"[tokens, {lm.layout.hidden}] (the model's hidden size)")
    n = {out[layer].shape[0] for layer in lm.moe_layers}
    if len(n) != 1 or 0 in n:
        raise ConfigError(f"calibration traces must hold the same number (> 0) of tokens for every MoE layer, "
                          f"got {sorted(n)}: record them in one pass over some text")
    return {layer: out[layer] for layer in lm.moe_layers}


@torch.no_grad()
def _layer_inputs(lm, layer: int, x: torch.Tensor):
    """Routing and shared-expert output for calibration tokens x [N,H] (run on the model's device).

    Returns (x float32 [N,H], top-k index [N,K], S float32 [N,H] or None), all on the CPU."""
    mlp = lm.moe_block(layer)
    xd = x.to(lm.device, dtype=lm.model.dtype)     # as the block sees it
    _, _, top_i = mlp.gate(xd)
    shared = shared_fn_for(lm)
    s = shared(layer, xd).float().cpu() if shared is not None else None
    return x.float(), top_i.cpu(), s


def _neurons(x: torch.Tensor, gate_up: torch.Tensor, act) -> torch.Tensor:
    """All I neuron activations act(x g_j)·(x u_j) of one expert: x [n,H], gate_up [2I,H] -> [n,I]."""
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return act(gate) * up


# ---------------------------------------------------------------------- one expert
def _select_rows(routed: torch.Tensor, n_total: int, background: float, hidden: int, gen: torch.Generator):
    """Rows and sample weights for one expert: its routed tokens (weight 1, capped) plus a sample
    of the others whose total weight is ``background`` x the routed count."""
    if routed.numel() > MAX_TOKENS_PER_EXPERT:
        routed = routed[torch.randperm(routed.numel(), generator=gen)[:MAX_TOKENS_PER_EXPERT]].sort().values
    mask = torch.ones(n_total, dtype=torch.bool)
    mask[routed] = False
    others = mask.nonzero().flatten()
    n_bg = min(others.numel(), max(routed.numel() // 2, 2 * hidden)) if (background > 0 or not routed.numel()) else 0
    bg = others[torch.randperm(others.numel(), generator=gen)[:n_bg]]
    w_bg = background * routed.numel() / max(n_bg, 1) if routed.numel() else 1.0
    w = torch.cat([torch.ones(routed.numel(), dtype=torch.float64),
                   torch.full((bg.numel(),), w_bg, dtype=torch.float64)])
    return torch.cat([routed, bg]), w


def fit_expert(h: torch.Tensor, y: torch.Tensor, s: torch.Tensor | None, w: torch.Tensor, max_rank: int,
               importance: torch.Tensor | None = None):
    """Greedy neuron selection and nested least-squares refit for one expert.

    h [n,I] neuron activations, y [n,H] expert output, s [n,H] shared output or None, w [n]
    sample weights. Returns (order [R] neuron indices, T [R+1,R+1], C [R+1,H], alpha), float64:
    y ≈ [1, h[:, order[:r]]] · T[:r+1,:r+1] · C[:r+1] + alpha·s for every r <= R.

    Works on Gram matrices of the weighted features F = √w·[1, h] (one pass over the tokens),
    so each greedy step costs O(I²·r + I·r·H) whatever the number of tokens:
        score_j = ‖F_jᵀ·res‖² / ‖F_j − proj_S F_j‖²   (res ⊥ F_S, so F_jᵀ·res = G_jY − G_jS·β_S)
        T = R⁻¹ with G_SS = RᵀR (Cholesky, selection order), C = Tᵀ·(F_Sᵀ·y)"""
    n, I = h.shape
    sw = (w / w.sum()).sqrt().double().unsqueeze(1)
    cand = torch.arange(I)
    if importance is not None and I > max(_PREFILTER, 4 * max_rank):
        cand = torch.argsort(importance, descending=True)[: max(_PREFILTER, 4 * max_rank)]
    feats = torch.cat([torch.ones(n, 1, dtype=torch.float64), h[:, cand].double()], dim=1) * sw   # [n,m+1]
    yw = y.double() * sw
    G = feats.T @ feats
    G += (1e-12 * G.diagonal().mean().clamp_min(1e-300)) * torch.eye(G.shape[0], dtype=G.dtype)
    GY = feats.T @ yw
    diag = G.diagonal().clone()
    sel = [0]                                      # the constant feature first: every prefix has an intercept
    for _ in range(min(max_rank, cand.numel())):
        L = torch.linalg.cholesky(G[sel][:, sel])
        beta = torch.cholesky_solve(GY[sel], L)                       # [k,H]
        num = ((GY - G[:, sel] @ beta) ** 2).sum(1)                   # ‖F_jᵀ·res‖²
        z = torch.cholesky_solve(G[sel], L)                           # [k,m+1]
        den = diag - (G[:, sel] * z.T).sum(1)                         # ‖F_j ⟂ F_S‖²
        score = num / den.clamp_min(1e-300)
        score[sel] = -1.0
        score[den <= 1e-9 * diag] = -1.0                              # (numerically) dependent on S
        j = int(score.argmax())
        if score[j] < 0:
            break
        sel.append(j)
    k = len(sel) - 1
    R = torch.linalg.cholesky(G[sel][:, sel]).T                       # upper, G_SS = RᵀR
    t = torch.linalg.solve_triangular(R, torch.eye(k + 1, dtype=torch.float64), upper=True)
    qy = t.T @ GY[sel]                                                # Qᵀy [k+1,H]
    alpha = 0.0
    if s is not None:
        sws = s.double() * sw
        qs = t.T @ (feats[:, sel].T @ sws)                            # Qᵀs
        den = float((sws * sws).sum() - (qs * qs).sum())
        num = float((sws * yw).sum() - (qs * qy).sum())
        resid = float((yw * yw).sum() - (qy * qy).sum())
        if den > 0 and num * num / den >= MIN_ALPHA_GAIN * max(resid, 0.0):
            alpha = num / den
            qy = qy - alpha * qs
    order = [int(cand[j - 1]) for j in sel[1:]]
    # Fewer usable neurons than R (tiny calibration sets): pad with unused ones at zero weight.
    taken = set(order)
    order += [i for i in range(I) if i not in taken][: max_rank - k]
    T = torch.zeros(max_rank + 1, max_rank + 1, dtype=torch.float64)
    C = torch.zeros(max_rank + 1, y.shape[1], dtype=torch.float64)
    T[: k + 1, : k + 1], C[: k + 1] = t, qy
    return order, T, C, alpha


# ---------------------------------------------------------------------- the bank
@torch.no_grad()
def fit_lore_bank(lm, traces, max_rank: int, *, background: float = DEFAULT_BACKGROUND, use_shared: bool = True,
                  seed: int = 0, progress=None) -> LoreBank:
    """Fit a rank-``max_rank`` surrogate for every routed expert of ``lm`` on ``traces`` (see the
    module docstring for the accepted forms); any lower rank is then `LoreBank.with_rank`.
    ``progress(done, total)`` is called after each MoE layer."""
    check_rank(max_rank, max_rank=min(lm.layout.intermediate, lm.layout.hidden), expert_width=lm.layout.intermediate,
               flag="--lore-max-rank")
    if not 0.0 <= background <= 10.0:
        raise ConfigError(f"background={background} is out of range: use a value in [0, 10]")
    hidden = hidden_by_layer(traces, lm)
    gen = torch.Generator().manual_seed(seed)
    E, H, I = lm.n_experts, lm.layout.hidden, lm.layout.intermediate
    dtype = lm.layout.dtype
    n_tokens = next(iter(hidden.values())).shape[0]
    layers: dict[int, LoreLayer] = {}
    unseen = 0
    for li, layer in enumerate(lm.moe_layers):
        x, top_i, s = _layer_inputs(lm, layer, hidden[layer])
        s = s if use_shared else None
        act = lm.experts_modules[layer].act_fn
        G = torch.zeros(E, max_rank, H, dtype=dtype)
        U = torch.zeros(E, max_rank, H, dtype=dtype)
        T = torch.zeros(E, max_rank + 1, max_rank + 1)
        C = torch.zeros(E, max_rank + 1, H)
        alpha = torch.zeros(E)
        for e in range(E):
            routed = (top_i == e).any(dim=1).nonzero().flatten()
            unseen += routed.numel() == 0
            rows, w = _select_rows(routed, n_tokens, background, H, gen)
            gate_up, down = (t.float() for t in lm.host.weights(ExpertKey(layer, e)))
            h = _neurons(x[rows], gate_up, act)
            y = F.linear(h, down)
            importance = (w.unsqueeze(1) * h.double() ** 2).sum(0) * (down.double() ** 2).sum(0)
            order, t_e, c_e, a_e = fit_expert(h, y, None if s is None else s[rows], w, max_rank, importance)
            G[e], U[e] = gate_up[:I][order].to(dtype), gate_up[I:][order].to(dtype)
            T[e], C[e], alpha[e] = t_e.float(), c_e.float(), a_e
        layers[layer] = LoreLayer(G, U, T, C, alpha)
        if progress is not None:
            progress(li + 1, len(lm.moe_layers))
    if unseen:
        log.warning("%d experts saw no calibration token: their surrogates are fitted on other tokens only; "
                    "calibrate on more text for better ones", unseen)
    info = {"method": "greedy neuron selection + least-squares refit on activations"
                      + (" + shared-expert term" if use_shared and lm.family.shared_attr else ""),
            "tokens": n_tokens, "background": background, "experts_without_tokens": int(unseen), "seed": seed}
    return LoreBank(layers, hidden=H, expert_width=I, n_experts=E, act=lm.experts_modules[lm.moe_layers[0]].act_fn,
                    dtype=dtype, shared_fn=shared_fn_for(lm), device="cpu", target_device=lm.device,
                    fingerprint=expert_weights_hash(lm), info=info)


# ---------------------------------------------------------------------- quality per rank
def _linear_rrr(x: torch.Tensor, y: torch.Tensor, max_rank: int, ridge: float = 1e-3):
    """Reduced-rank regression y ≈ (x − μx)·A·B + μy (the linear alternative, for the report):
    returns a function rank -> predictor."""
    x, y = x.double(), y.double()
    mx, my = x.mean(0), y.mean(0)
    xc, yc = x - mx, y - my
    gram = xc.T @ xc
    gram = gram + (ridge * gram.diagonal().mean().clamp_min(1e-12)) * torch.eye(x.shape[1], dtype=gram.dtype)
    w = torch.linalg.solve(gram, xc.T @ yc)
    fitted = xc @ w
    ev, vec = torch.linalg.eigh(fitted.T @ fitted)
    v = vec[:, torch.argsort(ev, descending=True)[:max_rank]]
    return lambda xe, r: ((xe.double() - mx) @ (w @ v[:, :r]) @ v[:, :r].T + my).float()


def _svd(w: torch.Tensor):
    return torch.linalg.svd(w.double(), full_matrices=False)


def _truncate(usv, r: int) -> torch.Tensor:
    u, sv, vh = usv
    return ((u[:, :r] * sv[:r]) @ vh[:r]).float()


@torch.no_grad()
def lore_error_report(lm, traces, ranks, *, bank: LoreBank | None = None, heldout_frac: float = 0.25,
                      **fit_kw) -> list[dict]:
    """Relative output error per rank of LoRE, of plain truncated SVD of the weights and of a
    linear reduced-rank regression, on held-out activations. One dict per rank, as given:

        rank, lore_rel_err, svd_rel_err, linear_rel_err, pairs, fit_tokens, heldout_tokens
        (or rank, skipped: why, for ranks the expert width or the bank does not allow)

    rel_err = sqrt(Σ‖E_i(x) − Ê_i(x)‖² / Σ‖E_i(x)‖²) over every (held-out token, expert it is
    routed to) pair of every MoE layer; 1.0 is what dropping the expert costs. ``svd`` runs the
    expert with each of its three weight matrices truncated to rank r; ``linear`` is fitted on
    the same tokens as LoRE (routed ones only). Without ``bank`` one is fitted (``fit_kw``) on the
    first 1 − heldout_frac of the tokens and evaluated on the rest; with ``bank``, all of
    ``traces`` counts as held out."""
    if not 0.0 < heldout_frac < 1.0:
        raise ConfigError(f"heldout_frac={heldout_frac} is out of range: use a value in (0, 1)")
    hidden = hidden_by_layer(traces, lm)
    width = lm.layout.intermediate
    limit = min(width, lm.layout.hidden) if bank is None else bank.max_rank
    valid = [r for r in ranks if isinstance(r, int) and 1 <= r <= limit]
    if not valid:
        raise ConfigError(f"no usable rank in {list(ranks)}: the expert width is {width}; use ranks in [1, {limit}]")
    n = next(iter(hidden.values())).shape[0]
    fit_hidden = None
    if bank is None:
        n_fit = int(round(n * (1.0 - heldout_frac)))
        if n_fit < 1 or n - n_fit < 1:
            raise ConfigError(f"{n} calibration tokens are too few to hold some out: record more text")
        fit_hidden = {k: v[:n_fit] for k, v in hidden.items()}
        bank = fit_lore_bank(lm, fit_hidden, max(valid), **fit_kw)
        hidden = {k: v[n_fit:] for k, v in hidden.items()}
    errs = {(m, r): 0.0 for m in ("lore", "svd", "linear") for r in valid}
    subs = {r: bank.with_rank(r, device="cpu") for r in valid}
    energy, pairs = 0.0, 0
    for layer in lm.moe_layers:
        x, top_i, s = _layer_inputs(lm, layer, hidden[layer])
        fit_x, fit_top = (None, None) if fit_hidden is None else _layer_inputs(lm, layer, fit_hidden[layer])[:2]
        act = lm.experts_modules[layer].act_fn
        for e in range(lm.n_experts):
            rows = (top_i == e).any(dim=1).nonzero().flatten()
            if rows.numel() == 0:
                continue
            key = ExpertKey(layer, e)
            xe = x[rows]
            gate_up, down = (t.float() for t in lm.host.weights(key))
            y = expert_forward(xe, gate_up, down, act)
            energy += float((y * y).sum())
            pairs += rows.numel()
            svds = (_svd(gate_up[:width]), _svd(gate_up[width:]), _svd(down))
            linear = None
            if fit_x is not None:
                fit_rows = (fit_top == e).any(dim=1).nonzero().flatten()
                if fit_rows.numel() > 1:
                    fx = fit_x[fit_rows]
                    linear = _linear_rrr(fx, expert_forward(fx, gate_up, down, act), max(valid))
            for r in valid:
                y_hat = subs[r].apply(key, xe, shared=None if s is None else s[rows]).float()
                errs[("lore", r)] += float(((y - y_hat) ** 2).sum())
                if r < width:
                    gu_r = torch.cat([_truncate(svds[0], r), _truncate(svds[1], r)])
                    errs[("svd", r)] += float(((y - expert_forward(xe, gu_r, _truncate(svds[2], r), act)) ** 2).sum())
                y_lin = linear(xe, r) if linear is not None else y.new_zeros(y.shape)
                errs[("linear", r)] += float(((y - y_lin) ** 2).sum())
    energy = max(energy, 1e-30)
    out = []
    for r in ranks:
        if r not in valid:
            why = (f"above the expert width {width}" if isinstance(r, int) and r > width
                   else f"above the bank's rank {limit}" if isinstance(r, int) and r >= 1 else "not a rank >= 1")
            out.append({"rank": r, "skipped": why})
            continue
        row = {"rank": r, **{f"{m}_rel_err": math.sqrt(errs[(m, r)] / energy) for m in ("lore", "svd", "linear")},
               "pairs": pairs, "fit_tokens": 0 if fit_hidden is None else next(iter(fit_hidden.values())).shape[0],
               "heldout_tokens": next(iter(hidden.values())).shape[0]}
        if fit_hidden is None:
            row["linear_rel_err"] = None      # no fitting tokens to fit the linear baseline on
        out.append(row)
    return out

