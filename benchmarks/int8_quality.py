"""Speed and quality of the lossy int8 CPU-lane miss action (cpu_int8), measured on this machine's CPU.

    python benchmarks/int8_quality.py --out docs/benchmarks/cpu-lane/int8/results.json

1. The kernel (measured, wall clock on this CPU): one routed expert for one token, at the shipped
   miniature's expert (H 128, I 24) and at DeepSeek-V2-Lite's (H 2048, I 1408): bf16 ``F.linear`` (the exact
   lane's arithmetic), the int8 weight-only kernel (torch's ``_weight_int8pack_mm``, exec/int8.py) and its
   blockwise-dequantising fallback; median and best of ``--reps``, in µs per expert and GB/s of weights read,
   at one thread, at the lane's (every core but the driver's) and at every core; the int8
   kernel's relative error against the bf16 expert; the time to quantize one expert (median of 5, at one
   thread), and what the shipped miniature's int8 copy weighs and took to make.
2. Quality (measured on the CPU, on the shipped miniature; `spice_core.tools.quality`): teacher-forced
   perplexity change, mean KL and top-1 agreement against the exact model on the evaluation half of the
   held-out set, greedy agreement over held-out prompts, and the miss split, for spice at tau_approx 0.05
   (LoRE rank 4) with tau_int8 0 (LoRE alone), 0.1, 0.3 and 1.0, and at tau_approx 0 with tau_int8 1.0 (the
   int8 runs alone). Decisions as the headline's x8 runs make them: the fast path's decision profile
   (h200-pcie5x16-graphed) at 13 GB/s, DeepSeek-V2-Lite's sizes for every cost, a 25% budget, the CPU lane on.
   Timing is modeled (quality does not depend on the clock), so the modeled ms per step are the timing model's,
   not a measurement. The defaults (384 teacher-forced tokens, 4 prompts x 32 greedy tokens) keep the run near
   ten minutes on a 2-core CPU; `spice_core quality` scores 1,024 and 8 x 32 by default.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT_DIR = Path(__file__).resolve().parents[1]
for _path in (ROOT_DIR, ROOT_DIR / "benchmarks"):    # run as a script from anywhere: the repo's packages, bench_args
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.config import MAX_NEW_TOKENS_LIMIT  # noqa: E402
from spice_core.machine import cpu_model_name  # noqa: E402

SHAPES = (("spice-mini", 128, 24), ("deepseek-v2-lite", 2048, 1408))
SETTINGS = dict(policy="spice", cache_frac=0.25, tau_approx=0.05, lore_rank=4, tau_prefetch=0.2, max_lookahead=4,
                cpu_lane=True, profile="h200-pcie5x16-graphed", shape="deepseek-v2-lite")
LINK_GBPS = 13.0
CASES = ((0.05, 0.0), (0.05, 0.1), (0.05, 0.3), (0.05, 1.0), (0.0, 1.0))     # (tau_approx, tau_int8)


def _timed(fn, reps: int) -> tuple[float, float]:
    """(median, best) seconds of ``fn`` over ``reps`` calls, after a few warm-up calls."""
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), min(ts)


def kernel_rows(reps: int) -> list[dict]:
    from spice_core.exec.experts import expert_forward
    from spice_core.exec.int8 import (Int8Expert, int8_expert_forward, int8_linear_dequant, packed_kernel_available,
                                      quantize_rows)

    rows = []
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    for name, H, I in SHAPES:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(1, H, generator=g).to(torch.bfloat16)
        gate_up = (torch.randn(2 * I, H, generator=g) * H ** -0.5).to(torch.bfloat16)
        down = (torch.randn(H, I, generator=g) * I ** -0.5).to(torch.bfloat16)
        w = Int8Expert(*quantize_rows(gate_up), *quantize_rows(down))
        quantize_ms = 1e3 * _timed(lambda: (quantize_rows(gate_up), quantize_rows(down)), 5)[0]
        bf16_bytes = 3 * H * I * 2
        int8_bytes = 3 * H * I + 2 * (2 * I + H)

        def dequant():
            gate, up = int8_linear_dequant(x, w.q_gate_up, w.s_gate_up).chunk(2, dim=-1)
            return int8_linear_dequant(F.silu(gate) * up, w.q_down, w.s_down)

        kernels = {"bf16 F.linear (exact)": (lambda: expert_forward(x, gate_up, down, F.silu), bf16_bytes),
                   "int8 dequant in blocks (fallback)": (dequant, int8_bytes)}
        if packed_kernel_available():
            kernels["int8 _weight_int8pack_mm"] = (lambda: int8_expert_forward(x, w, F.silu), int8_bytes)
        exact = expert_forward(x.float(), gate_up.float(), down.float(), F.silu)
        rel_err = float((int8_expert_forward(x, w, F.silu).float() - exact).norm() / exact.norm())
        n = reps if H < 1000 else max(5, reps // 10)
        for threads in sorted({1, max(1, cores - 1), cores}):      # one; the lane's (a core left to the driver); all
            torch.set_num_threads(threads)
            for kernel, (fn, nbytes) in kernels.items():
                med, best = _timed(fn, n)
                rows.append({"shape": name, "hidden": H, "intermediate": I, "threads": threads, "kernel": kernel,
                             "weight_bytes": nbytes, "us_median": round(med * 1e6, 1), "us_best": round(best * 1e6, 1),
                             "gbps_median": round(nbytes / med / 1e9, 2), "gbps_best": round(nbytes / best / 1e9, 2),
                             "reps": n, "int8_rel_err_vs_bf16": round(rel_err, 5), "quantize_ms": round(quantize_ms, 2)})
                print(json.dumps(rows[-1]), flush=True)
    torch.set_num_threads(1)
    return rows


def quality_rows(args) -> tuple[list[dict], dict]:
    from spice_core.api import RunSettings
    from spice_core.engine import SpiceEngine
    from spice_core.tools.quality import eval_set, evaluate, exact_reference

    base_engine = SpiceEngine.load(args.model, device="cpu", timing="modeled")
    eng = SpiceEngine(base_engine.lm, timing="modeled", link_gbps=LINK_GBPS)
    eng.artifacts = base_engine.artifacts
    store = eng.int8_store()
    memory = {"experts": len(store), "int8_bytes": store.total_bytes, "checkpoint_bytes": eng.routed_bytes,
              "share_of_checkpoint": round(store.total_bytes / eng.routed_bytes, 4), "build_s": round(store.build_s, 3),
              "int8_bytes_per_expert": store.expert_bytes, "checkpoint_bytes_per_expert": eng.lm.expert_bytes}
    data = eval_set(base_engine, max_tokens=args.max_tokens, n_prompts=args.n_prompts)
    base = replace(RunSettings(), **SETTINGS)
    ref = exact_reference(eng, data, args.new_tokens, base=base)
    rows = []
    for tau_approx, tau_int8 in CASES:
        t0 = time.time()
        rep = evaluate(eng, replace(base, tau_approx=tau_approx, tau_int8=tau_int8), ref)
        split = {k: rep.miss_split.get(k, 0) for k in ("approx", "cpu", "cpu_int8", "copy")}
        misses = sum(split.values())
        row = {"tau_approx": tau_approx, "tau_int8": tau_int8, "ppl_delta_pct": round(rep.ppl_delta_pct, 4),
               "mean_kl": round(rep.mean_kl, 6), "top1_agreement": round(rep.top1_agreement, 4),
               "greedy_agreement": round(rep.greedy_agreement, 4), "first_divergence": list(rep.first_divergence),
               "miss_split": split, "int8_share_of_misses": round(split["cpu_int8"] / misses, 4) if misses else 0.0,
               "modeled_step_ms_median": round(rep.step_ms_median, 3), "notes": list(rep.notes),
               "seconds": round(time.time() - t0, 1)}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("tau_approx", "tau_int8", "ppl_delta_pct", "mean_kl", "greedy_agreement",
                                               "miss_split", "modeled_step_ms_median", "seconds")}), flush=True)
    prof = eng._costs(base).profile
    info = {"tokens": sum(len(w) - 1 for w in data.windows), "prompts": len(data.prompts),
            "new_tokens": args.new_tokens, "source": data.source, "memory": memory,
            "profile_lane": {"cpu_mem_gbps": prof.cpu_mem_gbps, "cpu_task_us": prof.cpu_task_us,
                             "h2d_pinned_gbps": prof.h2d_pinned_gbps}}
    return rows, info


def main(argv=None) -> int:
    ap = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=bench_args.model, default=None,
                    help="model folder (default: the shipped miniature)")
    ap.add_argument("--max-tokens", type=ca.int_in(2), default=384, help="teacher-forced tokens scored")
    ap.add_argument("--n-prompts", type=ca.positive_int, default=4)
    ap.add_argument("--new-tokens", type=ca.int_in(0, MAX_NEW_TOKENS_LIMIT), default=32,
                    help="greedy tokens per prompt (0: none)")
    ap.add_argument("--reps", type=ca.positive_int, default=300,
                    help="kernel calls timed at the miniature's shape (a tenth at DeepSeek-V2-Lite's)")
    ap.add_argument("--skip-quality", action="store_true", help="the kernel part only")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    bench_args.check_out_file(ap, args.out, "--out")
    torch.set_num_threads(1)
    t0 = time.time()
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    out = {"command": "python benchmarks/int8_quality.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": {"cpu": cpu_model_name(), "cores": os.cpu_count(), "torch": torch.__version__,
                       "cpu_capability": torch.backends.cpu.get_cpu_capability(), "load_average_at_start": load},
           "kernel": {"timing": "measured (wall clock on this CPU)", "rows": kernel_rows(args.reps)}}
    if not args.skip_quality:
        rows, info = quality_rows(args)
        out["quality"] = {"timing": "quality measured on the CPU; decisions made with the modeled profile below",
                          "settings": {**SETTINGS, "link_gbps": LINK_GBPS}, **info, "rows": rows}
    out["seconds"] = round(time.time() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0



if __name__ == "__main__":
    sys.exit(main())
