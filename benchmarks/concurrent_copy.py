"""Does a second GPU's host-to-device copying slow this GPU's? (Two GPUs of one host.)

    python benchmarks/concurrent_copy.py [--seconds 3] [--chunk-mb 256] [--out FILE.json]

For every visible GPU alone, then for all of them at once (one thread per GPU, each on its own
copy stream from its own pinned buffer), copies ``--chunk-mb`` chunks host→device for
``--seconds`` and prints the rate, labelled *measured*. If the rate of each GPU with the others
copying stays within a few percent of its rate alone, measurements on one GPU are not disturbed
by copies on another (the benchmark protocol asks for this before running link measurements on
two GPUs at the same time).
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch


def _copy_rate_gbps(device: int, host: torch.Tensor, seconds: float, start: threading.Barrier | None) -> float:
    torch.cuda.set_device(device)
    dst = torch.empty(host.numel(), dtype=torch.uint8, device=f"cuda:{device}")
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        dst.copy_(host, non_blocking=True)          # warm-up
    stream.synchronize()
    if start is not None:
        start.wait()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with torch.cuda.stream(stream):
            for _ in range(4):
                dst.copy_(host, non_blocking=True)
        stream.synchronize()
        n += 4
    return n * host.numel() / (time.perf_counter() - t0) / 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--chunk-mb", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this benchmark needs CUDA GPUs", file=sys.stderr)
        return 2
    n_gpu = torch.cuda.device_count()
    hosts = [torch.empty(args.chunk_mb << 20, dtype=torch.uint8).pin_memory() for _ in range(n_gpu)]
    alone = [_copy_rate_gbps(d, hosts[d], args.seconds, None) for d in range(n_gpu)]
    together = [0.0] * n_gpu
    barrier = threading.Barrier(n_gpu)

    def work(d: int) -> None:
        together[d] = _copy_rate_gbps(d, hosts[d], args.seconds, barrier)

    threads = [threading.Thread(target=work, args=(d,)) for d in range(n_gpu)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = {"timing": "measured", "gpus": [torch.cuda.get_device_name(d) for d in range(n_gpu)],
              "chunk_mb": args.chunk_mb, "seconds": args.seconds,
              "alone_gbps": [round(x, 2) for x in alone], "together_gbps": [round(x, 2) for x in together],
              "together_over_alone": [round(t / a, 3) for t, a in zip(together, alone)]}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
