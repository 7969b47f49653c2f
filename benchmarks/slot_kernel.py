"""The expert step of one MoE layer at one token, slot kernel against the gather path, on a CUDA GPU.

    python benchmarks/slot_kernel.py [--hidden 2048] [--intermediate 1408] [--top-k 6] [--slots 416]
        [--out FILE.json]

Each variant is captured as a CUDA graph of ``--layers`` consecutive layer steps (each layer reads other
slots, as a decode step does) and replayed; the time per layer is the replay's CUDA-event time divided
by the layers. Variants: ``gather`` (index_select of the K experts' rows, two bmm, the weighting and the
ordered bf16 adds: the fast path's old step) and ``slots`` with several tile sizes. Also prints the HBM
bytes each reads and the bandwidth that implies. Timing label: *measured*.
"""
from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spice_core.exec import slot_kernels as sk  # noqa: E402
from spice_core.exec.experts import gathered_experts_forward  # noqa: E402

TILES = [(16, 256, 8, 256), (8, 512, 8, 256), (16, 256, 4, 512), (32, 128, 16, 128), (8, 256, 4, 256),
         (16, 512, 8, 512), (4, 512, 2, 512)]


def gather_step(x, buf, slot, perm, w, layout):
    K = slot.shape[0]
    y = gathered_experts_forward(x, buf, slot, layout, torch.nn.functional.silu)
    p = (y * w.index_select(0, perm).view(K, 1)).to(x.dtype)
    acc = p[0]
    for k in range(1, K):
        acc = acc + p[k]
    return acc.view(1, -1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--intermediate", type=int, default=1408)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--slots", type=int, default=416)
    ap.add_argument("--layers", type=int, default=26)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    H, I_, K = a.hidden, a.intermediate, a.top_k
    lay = types.SimpleNamespace(hidden=H, intermediate=I_, numel=3 * H * I_)
    dev = torch.device("cuda")
    buf = (torch.randn(a.slots, lay.numel, device=dev) * 0.02).to(torch.bfloat16)
    g = torch.Generator(device="cpu").manual_seed(0)
    slots = [torch.randperm(a.slots, generator=g)[:K].to(dev) for _ in range(a.layers)]
    perm = torch.arange(K, device=dev)
    kind = torch.ones(K, dtype=torch.long, device=dev)
    w = torch.rand(K, device=dev)
    x = torch.randn(1, H, device=dev).to(torch.bfloat16)
    h = torch.empty(K, I_, dtype=torch.bfloat16, device=dev)
    outs = [torch.empty(1, H, dtype=torch.bfloat16, device=dev) for _ in range(a.layers)]

    def timed(fn) -> float:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(2):
                fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=s):
            fn()
        graph.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(a.replays):
            graph.replay()
        e1.record()
        e1.synchronize()
        return e0.elapsed_time(e1) * 1e3 / (a.replays * a.layers)

    res = {"shape": {"hidden": H, "intermediate": I_, "top_k": K, "slots": a.slots},
           "bytes_per_layer": K * lay.numel * 2, "timing": "measured", "device": torch.cuda.get_device_name(),
           "variants": {}}
    res["variants"]["gather"] = timed(lambda: [gather_step(x, buf, sl, perm, w, lay) for sl in slots])
    ref = gather_step(x, buf, slots[0], perm, w, lay)
    for t in TILES:
        name = "slots " + "x".join(map(str, t))
        us = timed(lambda t=t: [sk.slot_experts_forward(x, buf, sl, kind, perm, w, None, lay, h, o, tiles=t)
                                for sl, o in zip(slots, outs)])
        got = sk.slot_experts_forward(x, buf, slots[0], kind, perm, w, None, lay, h, outs[0], tiles=t)
        res["variants"][name] = us
        res.setdefault("max_abs_diff_vs_gather", {})[name] = float((got.float() - ref.float()).abs().max())
    for name, us in res["variants"].items():
        print(f"{name:24s} {us:8.1f} us/layer  {res['bytes_per_layer'] / us / 1e3:7.0f} GB/s (measured)")
    print("max |slots - gather|:", res["max_abs_diff_vs_gather"])
    if a.out:
        a.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
