"""Pinned host memory of the offloaded experts against their weight bytes, and the copy rate from it.

    python benchmarks/pinned_memory.py [--model lift:assets/spice-mini] [--copies 128]

Builds the model as `bench` does (the lifted miniature: DeepSeek-V2-Lite shapes, 28.8 GB of routed
experts), offloads it (HostStore: one slab, registered with the driver) and prints, labelled
*measured*: the experts' weight bytes, the bytes pinned for them, whether the slab is page-locked,
and the host-to-device rate of ``--copies`` expert copies from it on a side stream (CUDA events).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))     # the package without installing it

import torch

from spice_core.types import ExpertKey


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="lift:assets/spice-mini")
    ap.add_argument("--copies", type=int, default=128)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark needs a CUDA GPU", file=sys.stderr)
        return 2
    from spice_core.tools.lift import lifted_model

    t0 = time.perf_counter()
    lm, tok, desc = lifted_model(Path(args.model.split(":", 1)[1]), "cuda")     # experts streamed into the slab
    build_s = time.perf_counter() - t0
    host = lm.host
    keys = host.keys()[:256]
    from spice_core.memory.host_store import HostStore
    per_expert = HostStore(lm.layout, pinned=True)             # the old layout: each expert pinned alone
    for key in keys:
        per_expert.put(key, *host.weights(key))
    buf = torch.empty((8, lm.layout.numel), dtype=lm.layout.dtype, device="cuda")
    stream = torch.cuda.Stream()

    def rate(store) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            for i in range(8):                                     # warm-up
                buf[i].copy_(store.flat(keys[i]), non_blocking=True)
            start.record(stream)
            for i in range(args.copies):
                buf[i % 8].copy_(store.flat(keys[(i * 37) % len(keys)]), non_blocking=True)
            end.record(stream)
        end.synchronize()
        return round(args.copies * lm.layout.nbytes / (start.elapsed_time(end) / 1e3) / 1e9, 2)

    rates = {"slab": [], "per_expert": []}
    for _ in range(3):                                             # interleaved
        rates["slab"].append(rate(host))
        rates["per_expert"].append(rate(per_expert))
    out = {
        "timing": "measured", "model": desc, "experts": len(host), "weight_bytes": host.total_bytes,
        "pinned_bytes": host.pinned_bytes, "pinned_over_weights": round(host.pinned_bytes / host.total_bytes, 4),
        "slab_page_locked": bool(host.flat(ExpertKey(*keys[0])).is_pinned()),
        "h2d_gbps_slab": rates["slab"], "h2d_gbps_per_expert_pinned": rates["per_expert"],
        "per_expert_pinned_bytes_for_256": per_expert.pinned_bytes, "build_s": round(build_s, 1),
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
    }
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
