"""Recall@k and precision of the expert predictors, per distance, on held-out text.

    python benchmarks/predictor_recall.py [--model assets/spice-mini] [--device cpu|cuda]
        [--max-tokens 8192] [--distances 8] [--tau 0.2] [--out docs/benchmarks/predictor_recall.md]

Predictors, each scored on the same held-out tokens (the "eval" half of the model's held-out
split; the draft was trained on the disjoint "calibration" half):
  draft       SPICE's distilled heads (the artifacts beside the model; trained here on the
              calibration half when they are missing or have fewer than --distances heads)
  gate        training-free: layer l+d's router applied to layer l's MoE input (same token only)
  popularity  each layer's most frequently routed experts on the calibration half (static)
  oracle      the true routing (by definition 1.0; listed as the upper bound)

Metrics per distance d (head (l, d) predicts the MoE layer d after l, wrapping into the next
token): recall@k = |top-k predicted ∩ selected| / k with k the model's top-k; at threshold tau
(what the prefetcher copies): precision = selected / predicted-with-confidence >= tau, coverage =
share of the selected experts that were predicted, and experts predicted per layer. Overhead:
wall time of the predictors' per-token work measured here, and the modeled GPU time.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))      # bench_args, when imported from elsewhere

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.model.loader import load_model  # noqa: E402
from spice_core.predictor.artifacts import load_artifacts_if_present  # noqa: E402
from spice_core.runtime.context import PredictContext  # noqa: E402
from spice_core.predictor.draft import (MAX_DISTANCES, DraftTrainConfig, _targets, target_table,  # noqa: E402
                                        train_draft)
from spice_core.predictor.traces import MIN_CALIBRATION_TOKENS, traces_for_model  # noqa: E402


class _NoClock:
    """A clock that records nothing: only the predictor's own wall time is measured here."""

    def stamp(self, stream=None):
        return None

    def draft(self, layer, n_heads, start=None):
        return None


def _scores(name, lm, traces, draft, pop_freq, D):
    """Scores [n,B,D,E] (ranking) and confidences [n,B,D,E] of one predictor, or None where it has none."""
    n, N, _ = traces.hidden.shape
    E = traces.n_experts
    tl, off = target_table(n, D)
    if name == "draft":
        out = [draft.predict_batch(p, traces.hidden[p].float()) for p in range(n)]
        return torch.stack([o[0][:, :D] for o in out]), torch.stack([o[1][:, :D] for o in out])
    if name == "popularity":
        f = pop_freq[tl][:, None, :, :].expand(n, N, D, E)
        return f, f                        # the share of tokens that route to it: a probability of use
    if name == "gate":
        sc = torch.full((n, N, D, E), float("nan"))
        for p in range(n):
            x = traces.hidden[p].float()
            for d in range(D):
                if int(off[p, d]) == 0:
                    w = lm.moe_block(lm.moe_layers[int(tl[p, d])]).gate.weight.float().cpu()
                    sc[p, :, d] = torch.softmax(x @ w.t(), dim=-1)
        return sc, sc
    raise ValueError(name)


def _metrics(scores, conf, sel, valid, k, taus, D, same_token_only=None):
    """Per distance: recall@k, precision/coverage/count at each tau, and the number of scored pairs."""
    have = ~torch.isnan(scores[..., 0])                   # [n,B,D]
    v = valid & have
    if same_token_only is not None:
        v = v & same_token_only[:, None, :]
    s = torch.nan_to_num(scores, nan=-1.0)
    c = torch.nan_to_num(conf, nan=-1.0)
    top = torch.topk(s, k, dim=-1).indices
    hit = sel.gather(-1, top).float().sum(-1) / k
    rows = [{} for _ in range(D)]
    for d in range(D):
        m = v[:, :, d]
        cnt = int(m.sum())
        if cnt == 0:
            rows[d] = None
            continue
        rows[d] = {"recall_at_k": float(hit[:, :, d][m].mean()), "pairs": cnt, "at_tau": {}}
    for tau in taus:
        chosen = c >= tau
        tp = (chosen & sel).float().sum(-1)
        npred = chosen.float().sum(-1)
        for d in range(D):
            if rows[d] is None:
                continue
            m = v[:, :, d]
            rows[d]["at_tau"][str(tau)] = {
                "precision": float(tp[:, :, d][m].sum() / npred[:, :, d][m].sum().clamp(min=1)),
                "coverage": float(tp[:, :, d][m].sum() / (k * int(m.sum()))),
                "predicted_per_layer": float(npred[:, :, d][m].mean())}
    return rows


def _overhead_ms(lm, traces, predictor, depth, n_tokens=64):
    """Median wall ms per token of ``predictor.predict`` over all MoE layers (this machine)."""
    rt = PredictContext(max_lookahead=depth, clock=_NoClock())
    xs = [traces.hidden[p, :n_tokens].to(lm.device, lm.model.dtype) for p in range(len(lm.moe_layers))]
    times = []
    for t in range(min(n_tokens, traces.n_tokens)):
        if lm.device.type == "cuda":
            torch.cuda.synchronize(lm.device)
        t0 = time.perf_counter()
        for p, layer in enumerate(lm.moe_layers):
            predictor.predict(layer, xs[p][t:t + 1], rt)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[3:] or times)


def _fmt(x, nd=3):
    return "—" if x is None else f"{x:.{nd}f}"


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=bench_args.model, default=str(ROOT / "assets" / "spice-mini"))
    ap.add_argument("--device", type=ca.device, default="cpu")
    ap.add_argument("--max-tokens", type=ca.int_in(MIN_CALIBRATION_TOKENS), default=8192,
                    help="held-out tokens to score on")
    ap.add_argument("--calib-tokens", type=ca.int_in(MIN_CALIBRATION_TOKENS), default=24_576,
                    help="tokens to train a draft on if none fits")
    ap.add_argument("--distances", type=ca.int_in(1, MAX_DISTANCES), default=8)
    ap.add_argument("--tau", type=ca.fraction, nargs="+", default=[0.2, 0.8],
                    help="confidence thresholds for precision (default: the engine's --tau-prefetch default 0.2, and "
                         "0.8, the probability a late next-layer prefetch needs)")
    ap.add_argument("--draft", type=ca.existing_file, default=None,
                    help="a spice-draft.safetensors to score instead of the one beside the model")
    ap.add_argument("--threads", type=ca.threads, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "predictor_recall.md")
    args = ap.parse_args(argv)
    bench_args.check_out_file(ap, args.out, "--out")      # before the run: its results must not be lost at the end
    torch.set_num_threads(args.threads)
    from spice_core.predictor.gate import GatePredictor
    from spice_core.timing.profiles import get_profile

    t_start = time.perf_counter()
    lm = load_model(args.model, args.device)
    D, k, n = args.distances, lm.top_k, len(lm.moe_layers)
    if args.draft is not None:
        from spice_core.predictor.artifacts import load_draft
        draft, draft_note = load_draft(args.draft, lm), f"{args.draft.name} given with --draft"
    else:
        arts = load_artifacts_if_present(lm)
        draft, draft_note = (arts.draft if arts else None), "the artifacts beside the model"
    calib = traces_for_model(lm, max_tokens=args.calib_tokens, part="calibration")
    if draft is None or draft.distances < D:
        routers = [lm.moe_block(layer).gate.weight.detach() for layer in lm.moe_layers]
        draft, _ = train_draft(calib, DraftTrainConfig(distances=D), init_routers=routers, device=lm.device)
        draft_note = f"trained here on {calib.n_tokens} calibration tokens (no artifacts with {D} distances)"
    pop_freq = calib.expert_frequency()
    ev = traces_for_model(lm, max_tokens=args.max_tokens, part="eval")
    tl, off = target_table(n, D)
    _, sel, valid = _targets(ev, torch.arange(ev.n_tokens), tl, off)
    same = off == 0

    results = {}
    for name in ("draft", "gate", "popularity"):
        sc, cf = _scores(name, lm, ev, draft, pop_freq, D)
        results[name] = _metrics(sc, cf, sel, valid, k, args.tau, D)
        if name == "draft":
            results["draft (same token only)"] = _metrics(sc, cf, sel, valid, k, args.tau, D, same)
    draft_ms = _overhead_ms(lm, ev, draft, min(4, D))
    draft_ms_d = _overhead_ms(lm, ev, draft, D)
    gate_ms = _overhead_ms(lm, ev, GatePredictor(lm), 4)
    modeled = {}
    for prof in ("rtx4090-pcie4x16", "h200-pcie5x16"):
        kern = get_profile(prof).gpu_kernel_us / 1e3
        # ModeledTimeline.draft: n_heads * 2 kernels per call; the draft makes 1 batched call per MoE layer,
        # the gate predictor one per router it applies (up to 4 at --max-lookahead 4; fewer near the last layer).
        gate_heads = sum(min(4, n - 1 - p) for p in range(n))
        modeled[prof] = {"draft": n * 2 * kern, "gate_d4": gate_heads * 2 * kern}

    env = {"device": str(lm.device), "threads": torch.get_num_threads(), "torch": torch.__version__,
           "python": platform.python_version(), "machine": platform.machine()}
    report = {"model": lm.name, "eval_source": ev.source, "eval_tokens": ev.n_tokens, "calib_tokens": calib.n_tokens,
              "top_k": k, "n_experts": lm.n_experts, "moe_layers": n, "tau": args.tau, "draft": draft_note,
              "draft_bytes": draft.nbytes, "results": results,
              "overhead_ms_per_token_measured": {"draft_d4": draft_ms, f"draft_d{D}": draft_ms_d, "gate_d4": gate_ms},
              "overhead_ms_per_token_modeled": modeled, "environment": env,
              "seconds": round(time.perf_counter() - t_start, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    args.out.write_text(_markdown(report, argv if argv is not None else sys.argv[1:], D))
    print(args.out.read_text())
    return 0


def _markdown(r, argv, D) -> str:
    k, tau = r["top_k"], r["tau"]
    cmd = "python benchmarks/predictor_recall.py " + " ".join(argv)
    lines = [f"# Expert predictors: recall@{k} and precision per distance ({r['model']})", "",
             f"Measured on this machine's CPU/GPU as stated below (no timing model is involved in recall).",
             "", "```", cmd.strip(), "```", "",
             f"- held-out text: {r['eval_source']}, {r['eval_tokens']} tokens; MoE layers: {r['moe_layers']}, "
             f"{r['n_experts']} experts, top-{k}",
             f"- draft: {r['draft']} ({r['draft_bytes'] / 1e6:.2f} MB of heads)",
             f"- popularity: per-layer routing frequency on the calibration half ({r['calib_tokens']} tokens)",
             "- gate: the next routers applied to the current MoE input; it cannot see across the token "
             "boundary, so its rows average only over (layer, distance) pairs inside one token",
             "- oracle: the recorded routing itself, recall 1.000 and precision 1.000 at every distance", "",
             f"## recall@{k} (share of the {k} selected experts among the {k} top-ranked)", "",
             "| d | " + " | ".join(r["results"]) + " | oracle |", "|---" * (len(r["results"]) + 2) + "|"]
    for d in range(D):
        cells = [_fmt(rows[d]["recall_at_k"]) if rows[d] else "—" for rows in r["results"].values()]
        lines.append(f"| {d + 1} | " + " | ".join(cells) + " | 1.000 |")
    for t in tau:
        lines += ["", f"## At tau = {t}: precision / coverage / experts predicted per layer", "",
                  "Precision: share of the experts with confidence >= tau that the layer selected (what the "
                  "prefetcher would copy); coverage: share of the selected experts among them. Confidence is the "
                  "draft's calibrated probability of use, the gate's router probability, the expert's routing "
                  "frequency for popularity.", "",
                  "| d | " + " | ".join(r["results"]) + " |", "|---" * (len(r["results"]) + 1) + "|"]
        for d in range(D):
            cells = []
            for rows in r["results"].values():
                x = rows[d]["at_tau"][str(t)] if rows[d] else None
                cells.append("—" if not x else
                             f"{x['precision']:.2f} / {x['coverage']:.2f} / {x['predicted_per_layer']:.1f}")
            lines.append(f"| {d + 1} | " + " | ".join(cells) + " |")
    om, mo = r["overhead_ms_per_token_measured"], r["overhead_ms_per_token_modeled"]
    env = r["environment"]
    lines += ["", "## Predictor overhead per token", "",
              f"Measured (wall clock, {env['device']}, {env['threads']} thread(s), torch {env['torch']}; all "
              f"{r['moe_layers']} MoE layers, median over tokens):", ""]
    lines += [f"- {name}: {v:.3f} ms/token" for name, v in om.items()]
    lines += ["", "Modeled GPU time (the timing model's launch-bound cost; what modeled TPOT includes):", ""]
    lines += [f"- {prof}: draft {v['draft']:.3f} ms/token, gate at depth 4 {v['gate_d4']:.3f} ms/token"
              for prof, v in mo.items()]
    lines += ["", f"Benchmark took {r['seconds']} s.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
