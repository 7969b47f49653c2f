"""The graphed decoder (one CUDA-graph segment per MoE layer) on a GPU: bitwise checks and speed.

    python benchmarks/graphed_decoder.py [--tokens 64] [--budget 0.25] [--no-tiny] [--out FILE.md]

Checks (every result is measured on this machine):
- tiny random checkpoints of each supported family: greedy tokens over --tokens steps with all experts
  resident equal an LRU cache of top-k + 2 slots (tokens and logits bitwise), and agreement with stock
  transformers `generate`; a family whose capture fails is reported with its error.
- the shipped miniature lifted to DeepSeek-V2-Lite's shapes: ms/token all-resident (gather and grouped
  kernels), host µs per MoE layer between segments, capture seconds, the segments replayed back to back
  (no host work), and an LRU cache of --budget of the routed experts on the native link (no pacing),
  bitwise against resident; greedy agreement with stock transformers eager `generate`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

PROMPT_TEXT = "Once upon a time, a little fox found a red ball."


def run_decoder(lm, buf, cb, prompt, n_tokens, kernel="gather", max_cache_len=256):
    """(tokens, logits [n-1, V] on the CPU, per-step seconds, decoder)."""
    from spice_core.runtime.graphed import GraphedDecoder

    dec = GraphedDecoder(lm, buf, cb.copy_stream, max_cache_len, kernel=kernel)
    tok = dec.prefill(prompt, cb.prefill)
    toks, logits, times = [tok], [], []
    for _ in range(n_tokens - 1):
        t = time.perf_counter()
        tok = dec.step(tok, cb)
        times.append(time.perf_counter() - t)
        toks.append(tok)
        logits.append(dec.last_logits.float().cpu())
    return toks, torch.stack(logits), times, dec


def callbacks(lm, n_slots, copy_stream):
    from spice_core.runtime.graphed_slots import LruSlots, ResidentSlots, resident_buffer

    if n_slots is None:
        buf, cb = resident_buffer(lm), ResidentSlots(lm)
    else:
        buf = torch.zeros((n_slots, lm.layout.numel), dtype=lm.layout.dtype, device=lm.device)
        cb = LruSlots(lm, buf, copy_stream)
    cb.copy_stream = copy_stream
    return buf, cb


def agree(a, b):
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), n)
    return {"same": sum(x == y for x, y in zip(a, b)), "of": n, "first_divergence": first}


def stock_greedy(model, prompt, n_tokens):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=n_tokens,
                             min_new_tokens=n_tokens, do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def tiny_checks(n_tokens):
    from tiny_models import FAMILIES, build_tiny
    from transformers import AutoModelForCausalLM

    from spice_core.model.loader import load_model

    prompt, rows = [5, 17, 33, 2, 9, 41, 7], {}
    with tempfile.TemporaryDirectory() as tmp:
        for fam in FAMILIES:
            try:
                d = build_tiny(fam, Path(tmp) / fam)
                ref = stock_greedy(AutoModelForCausalLM.from_pretrained(d).to("cuda").eval(), prompt, n_tokens)
                lm = load_model(d, "cuda")
                cs = torch.cuda.Stream()
                res = run_decoder(lm, *callbacks(lm, None, cs), prompt, n_tokens)
                buf, cb = callbacks(lm, lm.top_k + 2, cs)
                lru = run_decoder(lm, buf, cb, prompt, n_tokens)
                rows[fam] = {"captured": True, "dtype": str(lm.layout.dtype),
                             "lru_bitwise_tokens": lru[0] == res[0], "lru_bitwise_logits": torch.equal(lru[1], res[1]),
                             "lru_misses": cb.misses, "vs_stock": agree(res[0], ref),
                             "capture_s": round(res[3].capture_s, 3), "captured_host_io": res[3].captured_host_io}
            except Exception as err:  # noqa: BLE001 - report every family, go on with the next
                traceback.print_exc()
                rows[fam] = {"captured": False, "error": f"{type(err).__name__}: {err}"[:400]}
            print(fam, json.dumps(rows[fam]), flush=True)
    return rows


def replay_only_ms(dec, n=20):
    """The segments of one step replayed back to back, no host decisions (the graphs' GPU time)."""
    s = dec._stream
    with torch.cuda.stream(s):
        for g in dec._graphs:
            g.replay()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            for g in dec._graphs:
                g.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e3


def med_ms(times, skip=8):
    return round(statistics.median(times[skip:]) * 1e3, 3)


def lifted(n_tokens, budget):
    from spice_core.tools.bench import build_model
    from spice_core.model.loader import offload_model

    out = {}
    t = time.perf_counter()
    hf, tok, desc = build_model(f"lift:{ROOT / 'assets' / 'spice-mini'}", "cuda")
    prompt = tok(PROMPT_TEXT, add_special_tokens=False)["input_ids"]
    out["prompt_tokens"] = len(prompt)
    ref = stock_greedy(hf, prompt, n_tokens)
    lm = offload_model(hf, torch.device("cuda"), tokenizer=tok, path=Path(desc))
    out["load_s"] = round(time.perf_counter() - t, 1)
    n_routed = len(lm.moe_layers) * lm.n_experts
    cs = torch.cuda.Stream()
    buf, cb = callbacks(lm, None, cs)
    res_runs = {}
    for kernel in ("gather", "grouped"):
        try:
            toks, logits, times, dec = run_decoder(lm, buf, cb, prompt, n_tokens, kernel=kernel)
            res_runs[kernel] = (toks, logits)
            out[f"resident_{kernel}"] = {
                "ms_per_token": med_ms(times), "host_us_per_moe_layer": round(dec.host_s / dec.host_layers * 1e6, 1),
                "capture_s": round(dec.capture_s, 2), "segments": len(dec._graphs),
                "replay_only_ms_per_token": round(replay_only_ms(dec), 3), "captured_host_io": dec.captured_host_io,
                "vs_stock_eager": agree(toks, ref)}
            del dec
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            out[f"resident_{kernel}"] = {"error": f"{type(err).__name__}: {err}"[:400]}
        print(f"resident {kernel}", json.dumps(out[f"resident_{kernel}"]), flush=True)
    if len(res_runs) == 2:
        out["grouped_vs_gather"] = agree(res_runs["grouped"][0], res_runs["gather"][0])
    del buf
    torch.cuda.empty_cache()
    n_slots = max(lm.top_k, round(budget * n_routed))
    for kernel in ("gather", "grouped"):
        try:
            buf, cb = callbacks(lm, n_slots, cs)
            toks, logits, times, dec = run_decoder(lm, buf, cb, prompt, n_tokens, kernel=kernel)
            r_toks, r_logits = res_runs.get(kernel, res_runs["gather"])
            steps = len(times)
            out[f"lru_{kernel}"] = {
                "budget": budget, "slots": n_slots, "ms_per_token": med_ms(times),
                "mean_ms_per_token": round(statistics.mean(times[8:]) * 1e3, 3),
                "host_us_per_moe_layer": round(dec.host_s / dec.host_layers * 1e6, 1),
                "replay_only_ms_per_token": round(replay_only_ms(dec), 3),
                "copies_per_moe_layer_decode": round(cb.misses / (steps + 1) / len(lm.moe_layers), 2),
                "hit_rate": round(cb.hits / max(1, cb.hits + cb.misses), 3),
                "bitwise_tokens_vs_resident": toks == r_toks, "bitwise_logits_vs_resident": torch.equal(logits, r_logits),
                "resident_compared": kernel if kernel in res_runs else "gather (other kernel: bf16 agreement only)",
                "vs_stock_eager": agree(toks, ref)}
            del dec, buf
        except Exception as err:  # noqa: BLE001
            traceback.print_exc()
            out[f"lru_{kernel}"] = {"error": f"{type(err).__name__}: {err}"[:400]}
        print(f"lru {kernel}", json.dumps(out[f"lru_{kernel}"]), flush=True)
    return out


def markdown(res, cmd):
    lines = ["# Graphed decoder prototype (measured)", "", f"Command: `{cmd}`", "",
             f"Machine: {res['device']}; torch {res['torch']}, transformers {res['transformers']}.", ""]
    if "tiny" in res:
        lines += ["## Tiny random checkpoints: LRU (top-k + 2 slots) against all-resident, both captured", "",
                  "| family | captured | tokens bitwise | logits bitwise | LRU copies | greedy = stock generate |",
                  "|---|---|---|---|---|---|"]
        for fam, r in res["tiny"].items():
            if r.get("captured"):
                v = r["vs_stock"]
                lines.append(f"| {fam} | yes | {r['lru_bitwise_tokens']} | {r['lru_bitwise_logits']} | "
                             f"{r['lru_misses']} | {v['same']}/{v['of']} |")
            else:
                lines.append(f"| {fam} | **no**: {r['error']} | | | | |")
        lines.append("")
    lf = res.get("lifted", {})
    if lf:
        lines += ["## Lifted miniature (DeepSeek-V2-Lite shapes), batch 1, greedy, "
                  f"{res['tokens']} tokens, prompt of {lf.get('prompt_tokens')} tokens, max_cache_len 256", "",
                  "```json", json.dumps(lf, indent=1), "```", ""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--no-tiny", action="store_true")
    ap.add_argument("--no-lifted", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    import transformers

    res = {"label": "measured", "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "transformers": transformers.__version__, "tokens": args.tokens}
    if not args.no_tiny:
        res["tiny"] = tiny_checks(args.tokens)
    if not args.no_lifted:
        res["lifted"] = lifted(args.tokens, args.budget)
    print(json.dumps(res, indent=1))
    if args.out is not None:
        cmd = "python benchmarks/graphed_decoder.py " + " ".join(sys.argv[1:])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(markdown(res, cmd) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
