"""DirectCopy: a slot's host-to-device copy issued by the CUDA runtime's cudaMemcpyAsync, called directly.

    CopyEngine._issue_one ─► DirectCopy(slot, key) ─► cudaMemcpyAsync(slot row, pinned host row, bytes, H2D,
                                                                      copy stream)

Why: at batch 1 the fast path's host step issues each demand copy with the GPU idle, and `Tensor.copy_` spends
tens of µs of host in PyTorch's dispatcher, checks and stream bookkeeping for what the runtime issues in a few
(`benchmarks/host_primitives.py` measures both on the GPU's host). The copy is the same bytes on the same stream:
the slot buffer and the pinned host slab live for the whole run, so nothing PyTorch would track (the caching
allocators' stream uses) is needed. The runtime is the one PyTorch loaded (found in this process's mapped
libraries; with several mapped, the one of PyTorch's CUDA version first); `checked` makes one direct copy at start and keeps the direct path only when
it lands the host row's bytes. Where any of that fails (no Linux maps, no CUDA runtime library, a pageable host
buffer, an error code) the engine copies with `Tensor.copy_`, exactly as before.

Deliberately knows nothing of slots' meaning, policies or timing.
"""
from __future__ import annotations

import ctypes
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_H2D = 1        # cudaMemcpyHostToDevice


def _mapped_cudarts() -> list[str]:
    """Paths of the CUDA runtime libraries this process has mapped, each once, in map order."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = []
    for line in maps.splitlines():
        path = line.rsplit(" ", 1)[-1]
        if "/libcudart" in path and ".so" in path and path not in paths:
            paths.append(path)
    return paths


def _runtime_version(lib) -> int | None:
    """cudaRuntimeGetVersion of ``lib`` (e.g. 12080 for 12.8), or None."""
    v = ctypes.c_int(0)
    try:
        fn = lib.cudaRuntimeGetVersion
        fn.argtypes, fn.restype = [ctypes.POINTER(ctypes.c_int)], ctypes.c_int
        return v.value if fn(ctypes.byref(v)) == 0 else None
    except AttributeError:
        return None


def _torch_cuda_version() -> int | None:
    """PyTorch's CUDA version as the runtime spells it (12.8 -> 12080), or None."""
    try:
        major, minor = (torch.version.cuda or "").split(".")[:2]
        return int(major) * 1000 + int(minor) * 10
    except ValueError:
        return None


def _loaded_cudart():
    """(path, library) of the CUDA runtime to call among the mapped ones, or None when none loads. Several may be
    mapped (PyTorch's and one another library brought): PyTorch's version first, then its major version, then map
    order. Any of them drives the same device through the driver's primary context and takes the copy stream's
    driver handle; the start-up copy (`checked`) decides whether the one bound lands the bytes."""
    want = _torch_cuda_version()
    libs = []
    for order, path in enumerate(_mapped_cudarts()):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        v = _runtime_version(lib)
        rank = 0 if v is not None and v == want else 1 if v is not None and want is not None \
            and v // 1000 == want // 1000 else 2
        libs.append((rank, order, path, lib))
    if not libs:
        return None
    _, _, path, lib = min(libs, key=lambda t: t[:2])
    return path, lib


class DirectCopy:
    """Copies one expert's pinned host row into a slot row of ``buffer`` [n_slots, numel] on ``stream``."""

    def __init__(self, memcpy_async, get_last_error, buffer: torch.Tensor, stream) -> None:
        self._memcpy, self._clear = memcpy_async, get_last_error
        self._base, self.n_slots = buffer.data_ptr(), buffer.shape[0]
        self.row_bytes = buffer.shape[1] * buffer.element_size()
        self._stream = stream.cuda_stream
        self._src: dict = {}          # key -> host row address, looked up once

    @classmethod
    def load(cls, buffer: torch.Tensor, stream) -> "DirectCopy | None":
        """Bind cudaMemcpyAsync from PyTorch's CUDA runtime, or None where it cannot be found."""
        found = _loaded_cudart()
        if found is None:
            return None
        try:
            memcpy, last = found[1].cudaMemcpyAsync, found[1].cudaGetLastError
        except AttributeError:
            return None
        memcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        memcpy.restype = ctypes.c_int
        last.argtypes, last.restype = [], ctypes.c_int
        return cls(memcpy, last, buffer, stream)

    def __call__(self, slot: int, key, host_row: torch.Tensor) -> bool:
        """Queue the copy of ``host_row`` (``key``'s pinned row) into ``slot``; False (nothing queued, the error
        cleared) when the runtime refused it."""
        assert 0 <= slot < self.n_slots, f"slot {slot} is outside the buffer's {self.n_slots}"   # no write past it
        src = self._src.get(key)
        if src is None:
            src = self._src[key] = host_row.data_ptr()
        if self._memcpy(self._base + slot * self.row_bytes, src, self.row_bytes, _H2D, self._stream) == 0:
            return True
        self._clear()            # the runtime keeps the error for the next check: PyTorch's must not see it
        log.warning("cudaMemcpyAsync refused a slot copy: this and later copies use Tensor.copy_")
        return False


def checked(buffer: torch.Tensor, stream, host_row: torch.Tensor, key) -> tuple[DirectCopy | None, str]:
    """(a `DirectCopy` for ``buffer``, "") when a direct copy of ``host_row`` (pinned, one slot's bytes) into the
    first and the last slot lands its bytes there; else (None, why not), and copies go through `Tensor.copy_`.
    Synchronises the stream once; the first and last slots hold ``host_row`` after (compared byte for byte)."""
    if buffer.shape[0] == 0:
        return None, "no slot to copy into"
    if not host_row.is_pinned() or not host_row.is_contiguous() \
            or host_row.numel() != buffer.shape[1] or host_row.dtype != buffer.dtype:
        return None, "the host rows are not pinned, contiguous rows of a slot's shape"
    direct = DirectCopy.load(buffer, stream)
    if direct is None:
        why = "PyTorch's CUDA runtime library was not found among this process's mapped files"
        log.info("%s: slot copies use Tensor.copy_", why)
        return None, why
    last = buffer.shape[0] - 1          # the first and the last slot: the stride is checked too
    with torch.cuda.stream(stream):
        buffer[0].view(torch.uint8).fill_(0xFF)
        buffer[last].view(torch.uint8).fill_(0xFF)
        ok = direct(0, key, host_row) and direct(last, key, host_row)
        stream.synchronize()
        want = host_row.view(torch.uint8)
        ok = ok and torch.equal(buffer[0].cpu().view(torch.uint8), want) \
            and torch.equal(buffer[last].cpu().view(torch.uint8), want)
    if not ok:
        why = "a direct cudaMemcpyAsync did not land the host row's bytes at start-up"
        log.warning("%s: slot copies use Tensor.copy_", why)
        return None, why
    return direct, ""
