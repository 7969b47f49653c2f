"""Can the GPU fetch its own demand misses? SMs copying pinned host rows into slots, against the copy engine (CUDA).

    python benchmarks/sm_fetch_probe.py [--expert-mb 17.3] [--experts 1 4 8] [--repeats 20] [--out FILE.json]

Why: the fast path's host step issues each demand copy itself, ~20 µs of Python and CUDA calls a copy with the GPU
idle (docs/benchmarks/fast-path/host-3e9dc52-h100/), which keeps `lru` and `spice_prefetch` above issue 21's host
targets. Pinned host memory is mapped into the GPU's address space, so a kernel can read it: a kernel that reads a
layer's missed experts and their slots from a device array (the plan row the step uploads anyway) needs no host call
per copy and can be captured in the layer's graph segment. That pays only if SMs move host memory about as fast as
the copy engine. This measures, for experts of ``--expert-mb`` (DeepSeek-V2-Lite's 17.3 MB by default):

- the copy engine: `Tensor.copy_` of each expert's pinned row into its slot, one side stream;
- a Triton kernel copying the experts named by a device index array into their slots, at several grid sizes;
- that kernel captured in a CUDA graph and replayed with other indices written between replays (the captured
  form), every copied row checked byte for byte.

Each time is the median of ``--repeats`` runs bracketed by CUDA events. Timing label: *measured* (this machine).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

try:                     # the GPU machine's torch brings Triton; elsewhere the probe says it needs a GPU
    import triton
    import triton.language as tl
except ImportError:
    triton = None

if triton is not None:
    @triton.jit
    def fetch(src, dst, idx, slot, row_elems, n_progs, BLOCK: tl.constexpr):
        """Copy row ``idx[e]`` of ``src`` (pinned host memory, read through its device mapping) into row ``slot[e]``
        of ``dst``: program (e, p) copies blocks p, p + n_progs, ... of that row."""
        e, p_ = tl.program_id(0), tl.program_id(1)
        src_row = src + tl.load(idx + e).to(tl.int64) * row_elems
        dst_row = dst + tl.load(slot + e).to(tl.int64) * row_elems
        for start in range(p_ * BLOCK, row_elems, n_progs * BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < row_elems
            tl.store(dst_row + offs, tl.load(src_row + offs, mask=m), mask=m)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--expert-mb", type=float, default=17.3)
    p.add_argument("--experts", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--programs", type=int, nargs="+", default=[4, 16, 64], help="programs per expert")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)

    import torch
    if not torch.cuda.is_available() or triton is None:
        print("error: needs a CUDA GPU and Triton", file=sys.stderr)
        return 2

    dev = torch.device("cuda")
    n_max = max(args.experts)
    row_elems = int(args.expert_mb * 1e6) // 4                  # int32 words: 16-byte loads where aligned
    row_bytes = row_elems * 4
    rows = 2 * n_max                                           # host rows: half of them copied per round
    src = torch.randint(-2**31, 2**31 - 1, (rows, row_elems), dtype=torch.int32).pin_memory()
    dst = torch.zeros(n_max, row_elems, dtype=torch.int32, device=dev)
    side = torch.cuda.Stream(dev)

    def timed(fn, stream) -> float:
        times = []
        for _ in range(args.repeats + 2):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            fn()
            b.record(stream)
            b.synchronize()
            times.append(a.elapsed_time(b))
        return statistics.median(times[2:])

    def check(ids: list[int]) -> bool:
        torch.cuda.synchronize()
        return all(torch.equal(dst[j].cpu(), src[i]) for j, i in enumerate(ids))

    out = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "host": platform.processor() or platform.machine(), "expert_bytes": row_bytes, "timing": "measured",
           "rows": []}
    for k in args.experts:
        ids = list(range(k, 2 * k))
        with torch.cuda.stream(side):
            def dma():
                for j, i in enumerate(ids):
                    dst[j].copy_(src[i], non_blocking=True)
            ms = timed(dma, side)
        ok = check(ids)
        out["rows"].append({"experts": k, "how": "copy engine (Tensor.copy_)", "ms": ms,
                            "gbps": k * row_bytes / ms / 1e6, "bytes_ok": ok})
        idx = torch.tensor(ids, dtype=torch.int32, device=dev)
        slot = torch.arange(k, dtype=torch.int32, device=dev)
        for n_progs in args.programs:
            dst.zero_()
            try:
                ms = timed(lambda: fetch[(k, n_progs)](src, dst, idx, slot, row_elems, n_progs, BLOCK=4096),
                           torch.cuda.current_stream(dev))
            except Exception as err:           # a refusal is the probe's answer too: report it, go on
                out["rows"].append({"experts": k, "how": f"SM kernel, {n_progs} programs an expert",
                                    "error": f"{type(err).__name__}: {err}"[:300]})
                continue
            out["rows"].append({"experts": k, "how": f"SM kernel, {n_progs} programs an expert", "ms": ms,
                                "gbps": k * row_bytes / ms / 1e6, "bytes_ok": check(ids)})
    # The captured form: one graph, indices rewritten on the device between replays.
    k, n_progs = n_max, max(args.programs)
    idx = torch.arange(k, dtype=torch.int32, device=dev)
    slot = torch.arange(k, dtype=torch.int32, device=dev)
    try:
        fetch[(k, n_progs)](src, dst, idx, slot, row_elems, n_progs, BLOCK=4096)      # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fetch[(k, n_progs)](src, dst, idx, slot, row_elems, n_progs, BLOCK=4096)
        oks, times = [], []
        for r in range(args.repeats):
            ids = [(r + j) % rows for j in range(k)]
            idx.copy_(torch.tensor(ids, dtype=torch.int32), non_blocking=False)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graph.replay()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
            oks.append(check(ids))
        ms = statistics.median(times)
        out["rows"].append({"experts": k, "how": f"SM kernel in a CUDA graph, {n_progs} programs an expert, "
                            f"{args.repeats} replays with new indices", "ms": ms, "gbps": k * row_bytes / ms / 1e6,
                            "bytes_ok": all(oks)})
    except Exception as err:
        out["rows"].append({"experts": k, "how": "SM kernel in a CUDA graph", "error": f"{type(err).__name__}: {err}"[:300]})

    print(f"# {out['gpu']}, expert {row_bytes / 1e6:.1f} MB, median of {args.repeats} (measured)")
    print("| experts | how | ms | GB/s | bytes ok |\n|---|---|---|---|---|")
    for r in out["rows"]:
        if "error" in r:
            print(f"| {r['experts']} | {r['how']} | – | – | {r['error']} |")
        else:
            print(f"| {r['experts']} | {r['how']} | {r['ms']:.3f} | {r['gbps']:.1f} | {r['bytes_ok']} |")
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
