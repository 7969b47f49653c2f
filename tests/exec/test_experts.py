"""Expert math of one token: the gathered batch computes what the per-expert path computes, and the combine
rounds as the stock experts loop does (y·w in the router's dtype, cast, added in ascending expert order)."""
import pytest
import torch
from torch.nn import functional as F

from spice_core.exec.experts import combine_one_token, expert_forward, gathered_experts_forward
from spice_core.memory.host_store import ExpertLayout

H, I, K = 32, 8, 4


def _slots(dtype=torch.float32, n_slots=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    lay = ExpertLayout(H, I, dtype)
    return lay, (torch.randn(n_slots, lay.numel, generator=g) * 0.3).to(dtype)


def _stock_loop(x, ys, experts, positions, w):
    """transformers' eager experts loop at one token: zeros, then y_e * w_e cast and added, experts ascending."""
    final = torch.zeros_like(x)
    for e in sorted(experts):
        j = experts.index(e)
        final.add_((ys[j].view(1, -1) * w[:, positions[j]:positions[j] + 1]).to(final.dtype))
    return final


def test_gathered_batch_matches_each_expert_computed_alone():
    lay, buf = _slots()
    x = torch.randn(1, H)
    slots = [7, 2, 9, 0]
    ys = gathered_experts_forward(x, buf, torch.tensor(slots), lay, F.silu)
    for j, s in enumerate(slots):
        gate_up, down = lay.views(buf[s])
        assert torch.allclose(ys[j], expert_forward(x, gate_up, down, F.silu)[0], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine_rounds_as_the_stock_loop_from_one_batch_or_from_pieces(dtype):
    lay, buf = _slots(dtype)
    x = torch.randn(1, H).to(dtype)
    experts = [40, 3, 17, 9]                  # top-k position order, as the router returns them
    w = torch.rand(1, K)                      # router weights in float32
    routes = {e: ([0], [p]) for p, e in enumerate(experts)}
    needed = sorted(experts)
    ys = gathered_experts_forward(x, buf, torch.tensor([1, 5, 2, 8]), lay, F.silu)      # row j: position j
    want = _stock_loop(x, ys, experts, list(range(K)), w)
    one_batch = combine_one_token(x, needed, routes, {}, [(ys, experts)], w)
    assert one_batch.dtype == dtype and torch.equal(one_batch, want)
    # The same outputs split over two batches and a separate output (a LoRE or CPU-lane expert): same bits.
    pieces = combine_one_token(x, needed, routes, {9: ys[3].view(1, -1)},
                               [(ys[:1], experts[:1]), (ys[1:3], experts[1:3])], w)
    assert torch.equal(pieces, want)


def test_combine_of_a_token_without_valid_experts_is_zero():
    x = torch.randn(1, H)
    assert torch.equal(combine_one_token(x, [], {}, {}, [], torch.rand(1, K)), torch.zeros(1, H))
