"""The graphed decoder's pinned host I/O: what each segment reads back, and what the host writes for the next.

Row i of each buffer belongs to MoE layer i:

    segment i  ─► D2H: routing (idx_host, w_host), the draft heads' numbers (draft_host),
                       with a CPU lane the hidden state (x_host)
    host step  ─► writes plan_host[i] (graphed_plan.plan_rows) and, with a CPU lane, cpu_host[i]
    segment i+1 ◄─ H2D: plan_dev[i] ← plan_host[i], cpu_dev[i] ← cpu_host[i]
    last segment ─► D2H: the step's greedy token (token_host)

Pinned on CUDA, so the copies are asynchronous and, where the platform allows (`probe_captured`), captured
into the segments themselves; plain tensors on the CPU, where the decoder runs the same step op by op. The
numpy views (``*_np``) give the host step zero-copy access. Knows nothing of policies or of the graphs.
"""
from __future__ import annotations

import logging

import torch

from spice_core.runtime.graphed_plan import PLAN_ROWS

log = logging.getLogger(__name__)


class HostIO:
    """Pinned (on CUDA) host buffers and their device twins, one row per MoE layer."""

    def __init__(self, n_layers: int, top_k: int, hidden: int, dtype: torch.dtype, device: torch.device, *,
                 draft_numel: int = 0, cpu_rows: bool = False) -> None:
        pin = device.type == "cuda"
        self.pin, M, K = pin, n_layers, top_k
        self.plan_host = torch.zeros((M, PLAN_ROWS, K), dtype=torch.long, pin_memory=pin)
        self.plan_dev = torch.zeros((M, PLAN_ROWS, K), dtype=torch.long, device=device)
        self.idx_host = torch.zeros((M, K), dtype=torch.long, pin_memory=pin)
        self.w_host = torch.zeros((M, K), dtype=torch.float32, pin_memory=pin)
        self.token_host = torch.zeros(1, dtype=torch.long, pin_memory=pin)
        self.draft_host = torch.zeros((M, max(1, draft_numel)), dtype=torch.float32, pin_memory=pin)
        self.cpu_rows = bool(cpu_rows)
        if self.cpu_rows:
            self.x_host = torch.zeros((M, hidden), dtype=dtype, pin_memory=pin)
            self.cpu_host = torch.zeros((M, K, hidden), dtype=dtype, pin_memory=pin)
            self.cpu_dev = torch.zeros((M, K, hidden), dtype=dtype, device=device)
        self.plan_np, self.idx_np, self.w_np = self.plan_host.numpy(), self.idx_host.numpy(), self.w_host.numpy()
        self.draft_np, self.token_np = self.draft_host.numpy(), self.token_host.numpy()

    def readback(self, i: int, top_k_index: torch.Tensor, top_k_weights: torch.Tensor, x: torch.Tensor | None = None) -> None:
        """Layer i's routing (and, with a CPU lane, its hidden state) to the host rows."""
        self.idx_host[i].copy_(top_k_index.view(-1), non_blocking=self.pin)
        self.w_host[i].copy_(top_k_weights.view(-1), non_blocking=self.pin)
        if self.cpu_rows and x is not None:
            self.x_host[i].copy_(x.view(-1), non_blocking=self.pin)

    def read_draft(self, i: int, draft: torch.Tensor) -> None:
        self.draft_host[i, : draft.numel()].copy_(draft, non_blocking=self.pin)

    def upload(self, i: int) -> None:
        """Plan row i (and the CPU lane's outputs of layer i) to the device: captured at the head of segment i+1."""
        self.plan_dev[i].copy_(self.plan_host[i], non_blocking=self.pin)
        if self.cpu_rows:
            self.cpu_dev[i].copy_(self.cpu_host[i], non_blocking=self.pin)

    def read_token(self, token_dev: torch.Tensor) -> None:
        self.token_host.copy_(token_dev.view(1), non_blocking=self.pin)


def probe_captured(device: torch.device, stream) -> bool:
    """Whether D2H into / H2D from pinned memory can be captured on ``stream`` here (else the host issues them)."""
    try:
        src = torch.arange(4, device=device)
        h_out = torch.zeros(4, dtype=torch.long, pin_memory=True)
        h_in = torch.zeros(4, dtype=torch.long, pin_memory=True)
        d_in = torch.zeros(4, dtype=torch.long, device=device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            h_out.copy_(src * 2, non_blocking=True)
            d_in.copy_(h_in, non_blocking=True)
        h_in.fill_(7)
        g.replay()
        torch.cuda.synchronize(device)
        return h_out.tolist() == [0, 2, 4, 6] and d_in.tolist() == [7] * 4
    except RuntimeError as err:
        log.info("pinned copies cannot be captured here (%s): the host issues them", err)
        return False
