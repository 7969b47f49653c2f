"""The router weight rule the draft's predicted weights follow, against each family's own router."""
import pytest
import torch

from tiny_models import FAMILIES, tiny_config

from spice_core.model.families import is_moe_block, router_weight_rule


@pytest.mark.parametrize("family", FAMILIES)
def test_the_rule_turns_the_routers_softmax_into_the_weights_of_its_top_k(family):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_config(family)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    gate = next(layer.mlp for layer in model.model.layers if is_moe_block(layer.mlp)).gate
    with torch.no_grad():
        logits, weights, index = gate(torch.randn(5, cfg.hidden_size))
    q = torch.softmax(logits.float(), dim=-1)
    normalised, scale = router_weight_rule(cfg)
    if normalised:
        q = q / torch.topk(q, weights.shape[-1], dim=-1).values.sum(-1, keepdim=True)
    assert torch.allclose((q * scale).gather(-1, index.long()), weights.float(), atol=1e-6)
