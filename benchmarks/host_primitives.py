"""Host µs per CUDA primitive the fast path's host step calls, one at a time (CUDA).

    python benchmarks/host_primitives.py [--repeats 2000] [--copy-kib 64] [--out FILE.json]

The host step between two graph segments issues copies, records and waits on events and switches streams;
on a batch-1 decode each of them is host time with the GPU idle. This measures each primitive's host cost
in a tight loop (median of 5 batches of ``--repeats`` calls): creating an event and recording it against
recording one from a ring, a stream waiting on an event, querying one, switching the current stream, an
H2D copy from pinned memory by `Tensor.copy_` against the runtime's `cudaMemcpyAsync` called directly
(ctypes), and `torch.cuda._sleep` (the link emulation). Copies are small (``--copy-kib``) so the copy
queue never fills: the host's cost to issue a copy does not depend on its size. Timing label: *measured*
(wall clock, this machine).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def per_call_us(fn, repeats: int, batches: int = 5) -> float:
    fn()
    out = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        out.append((time.perf_counter() - t0) / repeats * 1e6)
        torch.cuda.synchronize()
    return statistics.median(out)


def cudart():
    """The CUDA runtime library torch loaded (found in this process's maps), or None."""
    torch.zeros(1, device="cuda")
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libcudart" in path:
            lib = ctypes.CDLL(path)
            lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p]
            lib.cudaMemcpyAsync.restype = ctypes.c_int
            return lib
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--copy-kib", type=int, default=64)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("host_primitives needs a CUDA device")
    dev = torch.device("cuda")
    cs, s = torch.cuda.Stream(dev), torch.cuda.current_stream(dev)
    n = a.copy_kib * 1024 // 2
    src = torch.empty(n, dtype=torch.bfloat16).pin_memory()
    dst = torch.empty((64, n), dtype=torch.bfloat16, device=dev)
    rows = dst.unbind(0)
    ring = [torch.cuda.Event() for _ in range(64)]
    timed_ring = [torch.cuda.Event(enable_timing=True) for _ in range(64)]
    for ev in ring + timed_ring:
        ev.record(s)
    i = [0]

    def nxt():
        i[0] = (i[0] + 1) & 63
        return i[0]

    res = {}
    res["event_new_record_us"] = per_call_us(lambda: torch.cuda.Event().record(s), a.repeats)
    res["event_new_timing_record_us"] = per_call_us(lambda: torch.cuda.Event(enable_timing=True).record(s), a.repeats)
    res["event_ring_record_us"] = per_call_us(lambda: ring[nxt()].record(s), a.repeats)
    res["event_ring_timing_record_us"] = per_call_us(lambda: timed_ring[nxt()].record(s), a.repeats)
    res["stream_wait_event_us"] = per_call_us(lambda: cs.wait_event(ring[nxt()]), a.repeats)
    res["event_query_us"] = per_call_us(lambda: ring[nxt()].query(), a.repeats)
    res["set_stream_us"] = per_call_us(lambda: torch.cuda.set_stream(cs) or torch.cuda.set_stream(s), a.repeats) / 2
    res["current_stream_us"] = per_call_us(lambda: torch.cuda.current_stream(dev), a.repeats)
    torch.cuda.set_stream(cs)
    res["tensor_copy_h2d_us"] = per_call_us(lambda: rows[nxt()].copy_(src, non_blocking=True), a.repeats)
    lib = cudart()
    if lib is not None:
        nbytes, sp, handle = src.numel() * 2, src.data_ptr(), cs.cuda_stream
        ptrs = [r.data_ptr() for r in rows]
        res["cudart_memcpy_async_us"] = per_call_us(lambda: lib.cudaMemcpyAsync(ptrs[nxt()], sp, nbytes, 1, handle),
                                                    a.repeats)
    res["cuda_sleep_us"] = per_call_us(lambda: torch.cuda._sleep(10), a.repeats)
    torch.cuda.set_stream(s)
    torch.cuda.synchronize()
    ok = None
    if lib is not None:     # the direct copy moves the same bytes as copy_
        src.copy_(torch.randn(n).to(torch.bfloat16))
        lib.cudaMemcpyAsync(rows[3].data_ptr(), src.data_ptr(), n * 2, 1, cs.cuda_stream)
        cs.synchronize()
        ok = bool(torch.equal(rows[3].cpu(), src))
    out = {"timing": "measured", "repeats": a.repeats, "copy_kib": a.copy_kib, "device": torch.cuda.get_device_name(),
           "cudart_copy_equal": ok, "host_us": {k: round(v, 3) for k, v in res.items()}}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
