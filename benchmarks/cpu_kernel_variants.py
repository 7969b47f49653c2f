"""Which host kernel computes one routed expert fastest, and which of them give the eager path's bits?

    python benchmarks/cpu_kernel_variants.py [--hidden 2048 --intermediate 1408] [--experts 64] [--reps 40]
        [--threads 0] [--out FILE.json]

The CPU lane's unit is one routed expert for one token (SwiGLU, bf16 weights): 17.3 MB of weights at
DeepSeek-V2-Lite's shape, read once, so its speed is a question of host DRAM bandwidth (~81 GB/s on the H200
host). bf16 `F.linear` (what `exec/experts.expert_forward` runs, the eager path's arithmetic) reached ~35 GB/s
there (docs/benchmarks/cpu-lane/). This measures the alternatives torch offers without a compiler step, on a
slab of experts larger than the caches, rotating so every run reads DRAM (wall clock, *measured*):

- ``linear``: bf16 `F.linear` twice (the lane's kernel today; the reference for bit equality);
- ``mv``: the same products as `torch.mv` (a GEMV kernel, no GEMM dispatch);
- ``packed``: oneDNN inner products on weights reordered once into its blocked layout
  (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`; needs AVX-512 with BF16);
- ``fp32``: float32 weights (twice the bytes; a host copy the lane would have to keep).

For each: ms per expert, GB/s of the bf16 weights' bytes (the expert's size, not what the variant reads), and the
share of output elements bit-equal to ``linear`` (1.0: a drop-in exact kernel).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.exec.cpu_lane import available_cores  # noqa: E402


def _linear(x, gu, dn):
    gate, up = F.linear(x, gu).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, dn)


def _mv(x, gu, dn):
    gate, up = torch.mv(gu, x[0]).chunk(2)
    return torch.mv(dn, F.silu(gate) * up).view(1, -1)


def _packed(x, gu, dn):
    lp = torch.ops.mkldnn._linear_pointwise
    gate, up = lp(x, gu, None, "none", [], "").chunk(2, dim=-1)
    return lp(F.silu(gate) * up, dn, None, "none", [], "")


def _fp32(x, gu, dn):
    """Rounded to bf16 where the bf16 kernels round (each product's output), accumulated in float32 as they are."""
    gate, up = F.linear(x.float(), gu).to(torch.bfloat16).chunk(2, dim=-1)
    return F.linear((F.silu(gate) * up).float(), dn).to(torch.bfloat16)


def variants(gu_all, dn_all) -> dict:
    """name -> (forward, per-expert weights); a variant whose weights cannot be made here is left out, with why."""
    out = {"linear": (_linear, list(zip(gu_all, dn_all))), "mv": (_mv, list(zip(gu_all, dn_all)))}
    try:
        reorder = torch.ops.mkldnn._reorder_linear_weight
        out["packed"] = (_packed, [(reorder(g, 1), reorder(d, 1)) for g, d in zip(gu_all, dn_all)])
    except (RuntimeError, AttributeError) as err:
        print(f"packed: not available here ({str(err).splitlines()[0]})", flush=True)
    out["fp32"] = (_fp32, [(g.float(), d.float()) for g, d in zip(gu_all, dn_all)])
    return out


def measure(fn, weights, x, reps: int) -> float:
    k = [0]

    def one():
        k[0] = (k[0] + 7) % len(weights)
        return fn(x, *weights[k[0]])

    for _ in range(5):
        one()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def expert_slab_args(ap: argparse.ArgumentParser) -> None:
    """The expert shape and slab options both host-kernel benchmarks take (DeepSeek-V2-Lite's by default)."""
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--reps", type=int, default=40)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    expert_slab_args(ap)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: every core but one)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    cores = available_cores()
    threads = a.threads or max(1, cores - 1)
    torch.set_num_threads(threads)
    gu = torch.randn(a.experts, 2 * a.intermediate, a.hidden).to(torch.bfloat16)
    dn = torch.randn(a.experts, a.hidden, a.intermediate).to(torch.bfloat16)
    x = torch.randn(1, a.hidden).to(torch.bfloat16)
    nbytes = (gu[0].numel() + dn[0].numel()) * 2
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    res = {"timing": "measured", "cores": cores, "threads": threads, "expert_mb": round(nbytes / 1e6, 3),
           "amx_bf16": "amx_bf16" in flags, "avx512_bf16": "avx512_bf16" in flags,
           "command": "python benchmarks/cpu_kernel_variants.py " + " ".join(sys.argv[1:]), "variants": []}
    vs = variants(gu.unbind(0), dn.unbind(0))
    refs = [_linear(x, gu[e], dn[e]) for e in range(4)]
    for name, (fn, weights) in vs.items():
        ms = measure(fn, weights, x, a.reps)
        outs = [fn(x, *weights[e]) for e in range(len(refs))]
        equal = min(float((y == r).float().mean()) for y, r in zip(outs, refs))
        rel = max(float((y.float() - r.float()).abs().max() / r.float().abs().max()) for y, r in zip(outs, refs))
        row = {"variant": name, "ms_per_expert": round(ms, 4), "gbps": round(nbytes / ms / 1e6, 1),
               "bit_equal_share": round(equal, 4), "max_rel_diff": rel}
        res["variants"].append(row)
        print(row, flush=True)
    text = json.dumps(res, indent=1)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
