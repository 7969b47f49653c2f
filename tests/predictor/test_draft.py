"""The draft heads: targets across the token boundary, distillation, confidences, inference."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from spice_core.errors import ConfigError
from spice_core.model.loader import load_model
from spice_core.predictor.draft import (DraftPredictor, DraftTrainConfig, _targets, recall_by_distance,
                                        target_table, train_draft)
from spice_core.predictor.traces import collect_traces
from spice_core.timing.profiles import get_shape


@pytest.fixture(scope="module")
def lm(tiny_dirs):
    return load_model(tiny_dirs["deepseek_v2"], "cpu")


@pytest.fixture(scope="module")
def traces(lm):
    g = torch.Generator().manual_seed(0)
    return collect_traces(lm, [torch.randint(0, 96, (64,), generator=g).tolist() for _ in range(40)])


@pytest.fixture(scope="module")
def trained(lm, traces):
    routers = [lm.moe_block(layer).gate.weight.detach() for layer in lm.moe_layers]
    return train_draft(traces, DraftTrainConfig(distances=4, epochs=8, batch_tokens=256), init_routers=routers)


class RecordingClock:
    """Observes draft launches the way a timeline does (stamp before, draft after)."""

    def __init__(self):
        self.calls = []

    def stamp(self, stream=None):
        return None

    def draft(self, layer, n_heads, start=None):
        self.calls.append((layer, n_heads))


def runtime(max_lookahead):
    from spice_core.runtime.context import PredictContext
    return PredictContext(max_lookahead=max_lookahead, clock=RecordingClock())


def test_target_table_wraps_into_the_next_tokens_first_layers():
    layer, offset = target_table(3, 4)
    assert layer.tolist() == [[1, 2, 0, 1], [2, 0, 1, 2], [0, 1, 2, 0]]
    assert offset.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1], [1, 1, 1, 2]]


def test_targets_never_cross_into_another_row(traces):
    tl, off = target_table(len(traces.moe_layers), 4)
    idx = torch.arange(traces.n_tokens)
    _, _, valid = _targets(traces, idx, tl, off)
    row_len = torch.bincount(traces.row.long())[traces.row.long()]               # [N]
    expected = traces.pos[None, :, None] + off[:, None, :] < row_len[None, :, None]
    assert torch.equal(valid, expected)
    last = valid[:, traces.pos == 63, :]                     # a row's last token has no next-token target
    assert not last.permute(0, 2, 1)[off > 0].any()


def test_distillation_beats_popularity_on_its_training_distribution(traces, trained):
    draft, report = trained
    n, D = len(traces.moe_layers), draft.distances
    tl, off = target_table(n, D)
    idx = torch.arange(traces.n_tokens)
    _, sel, valid = _targets(traces, idx, tl, off)
    logq = torch.stack([draft.predict_batch(p, traces.hidden[p].float())[0] for p in range(n)])
    freq = traces.expert_frequency()[tl][:, None, :, :].expand_as(logq)
    draft_recall = recall_by_distance(logq, sel, valid, traces.top_k)
    pop_recall = recall_by_distance(freq, sel, valid, traces.top_k)
    assert all(d > p + 0.05 for d, p in zip(draft_recall, pop_recall)), (draft_recall, pop_recall)
    assert min(report["heldout_ce_per_epoch"]) < report["heldout_ce_per_epoch"][0]


def test_confidences_are_probabilities_and_follow_the_distilled_distribution(traces, trained):
    draft, _ = trained
    logq, conf = draft.predict_batch(0, traces.hidden[0, :50].float())
    assert conf.min() >= 0 and conf.max() <= 1
    order_q = torch.argsort(logq, dim=-1)
    assert (conf.gather(-1, order_q).diff(dim=-1) >= -1e-6).all()     # monotone in q within each head


def test_confidence_is_calibrated_roughly(traces, trained):
    """Mean confidence of the top-k predictions is close to how often they were used."""
    draft, _ = trained
    n, D = len(traces.moe_layers), draft.distances
    tl, off = target_table(n, D)
    _, sel, valid = _targets(traces, torch.arange(traces.n_tokens), tl, off)
    conf = torch.stack([draft.predict_batch(p, traces.hidden[p].float())[1] for p in range(n)])
    m = valid[..., None].expand_as(conf)
    assert abs(conf[m].mean().item() - sel[m].float().mean().item()) < 0.08


def test_predict_runs_one_batched_launch_and_wraps_across_the_token_boundary(lm, traces, trained):
    draft, _ = trained
    rt = runtime(max_lookahead=4)
    last = lm.moe_layers[-1]
    preds = draft.predict(last, traces.hidden[-1, :1].float(), rt)
    assert [p.distance for p in preds] == [1, 2, 3, 4]   # all 4 trained heads
    assert [p.layer for p in preds] == [lm.moe_layers[0], lm.moe_layers[1], lm.moe_layers[2], lm.moe_layers[0]]
    assert rt.clock.calls == [(last, 1)]
    assert all(len(p.probs) == lm.n_experts for p in preds)


def test_predict_matches_the_batched_evaluation_path(lm, traces, trained):
    draft, _ = trained
    x = traces.hidden[1, 7:8].float()
    preds = draft.predict(lm.moe_layers[1], x, runtime(4))
    _, conf = draft.predict_batch(1, x)
    got = torch.tensor([p.probs for p in preds])
    assert torch.allclose(got, conf[0], atol=2e-3)   # float16 heads vs float32 evaluation


def test_half_heads_run_in_float32_on_the_cpu_and_agree_with_the_half_matmul(lm, traces, trained):
    """On the CPU the half weights are widened once (a half matmul costs ~3x a float32 one there); the
    logits are the widened weights' float32 product, within half rounding of the half matmul, and the
    budget keeps charging half weights."""
    draft, _ = trained
    assert draft.weight.dtype == torch.float16 and draft._host32 is not None
    x = traces.hidden[1, 3:4].float() * (1 + 1e-4)           # float32 values that half cannot hold
    assert not torch.equal(x, x.half().float())
    got = draft.head_logits(lm.moe_layers[1], x)
    w, b = draft.weight[1], draft.bias[1]
    assert torch.equal(got, torch.addmm(b.float()[None], x.half().float(), w.float().t()).view(-1))
    half = torch.addmm(b[None], x.half(), w.t()).float().view(-1)
    assert torch.allclose(got, half, rtol=2e-3, atol=2e-3)
    # predict (launch, then the confidences) runs the same heads
    preds = draft.predict(lm.moe_layers[1], x, runtime(4))
    conf = draft._confidence_np(1, got.numpy().reshape(draft.distances, draft.n_experts))
    assert [list(p.probs) for p in preds] == conf.tolist()
    assert draft.nbytes == (draft.weight.numel() + draft.bias.numel()) * 2


def test_predict_returns_every_trained_distance_whatever_the_prefetch_bound(lm, traces, trained):
    """max_lookahead bounds prefetching (in the planner); farther predictions still inform eviction."""
    draft, _ = trained
    x = traces.hidden[0, :1].float()
    assert len(draft.predict(lm.moe_layers[0], x, runtime(2))) == 4
    assert len(draft.predict(lm.moe_layers[0], x, runtime(9))) == 4


def test_nbytes_is_the_heads_device_memory_and_budget_scales_to_the_modeled_shape(trained, lm):
    draft, _ = trained
    n, D, E, H = len(draft.moe_layers), draft.distances, draft.n_experts, draft.hidden
    assert draft.nbytes == (n * D * E * H + n * D * E) * 2
    assert draft.budget_bytes(lm.layout.nbytes, None) == draft.nbytes
    shape = get_shape("deepseek-v2-lite")
    # At DeepSeek-V2-Lite scale one head [E, 2048] in bf16 is 64*2049*2/17.3e6 of an expert.
    expected_experts = n * D * E * (shape.hidden + 1) * 2 / shape.expert_bytes
    assert draft.budget_bytes(lm.layout.nbytes, shape) == pytest.approx(expected_experts * lm.layout.nbytes, abs=1)


def test_tensors_round_trip(trained, lm):
    draft, _ = trained
    t = draft.tensors()
    again = DraftPredictor(draft.moe_layers, t["weight"], t["bias"], t["calib"], draft.top_k)
    x = torch.randn(3, draft.hidden)
    assert torch.allclose(again.predict_batch(0, x)[1], draft.predict_batch(0, x)[1], atol=1e-6)


@pytest.mark.parametrize("d", [0, -1, 65, 2.5])
def test_distances_out_of_range_are_refused_with_the_flag(d):
    with pytest.raises(ConfigError, match="--distances"):
        DraftTrainConfig(distances=d)


def test_training_config_bad_values():
    with pytest.raises(ConfigError, match="eval_frac"):
        DraftTrainConfig(eval_frac=1.0)
    with pytest.raises(ConfigError, match="epochs"):
        DraftTrainConfig(epochs=0)


def test_the_device_ranked_readback_gives_the_predictions_the_host_computes_from_logits(lm, traces, trained):
    """The graphed executor reads back confidences and their ranking (`head_readback`, captured into the segment)
    instead of raw logits: the same predictions as `predictions_from_logits`, to float rounding."""
    draft, _ = trained
    layer = lm.moe_layers[2]
    for t in (3, 7, 11):
        x = traces.hidden[2, t:t + 1].float()
        ref = draft.predictions_from_logits(layer, draft.head_logits(layer, x).numpy())
        got = draft.predictions_from_readback(layer, draft.head_readback(layer, x).numpy())
        assert [(p.distance, p.layer) for p in got] == [(p.distance, p.layer) for p in ref]
        for g, r in zip(got, ref):
            assert torch.allclose(torch.tensor(g.probs), torch.tensor(r.probs), atol=1e-5)
            assert torch.allclose(torch.as_tensor(np.asarray(g.weights)), torch.as_tensor(np.asarray(r.weights)),
                                  atol=1e-5)
            assert sorted(g.order) == list(range(draft.n_experts))
            probs = torch.tensor(r.probs)
            assert all(probs[a] >= probs[b] - 1e-5 for a, b in zip(g.order, g.order[1:]))   # descending
            assert g.order[:6] == list(r.order[:6]) or torch.allclose(probs[g.order[:6]], probs[list(r.order[:6])],
                                                                      atol=1e-5)


@pytest.mark.parametrize("rule", [(False, 1.0), (False, 1.5), (True, 1.0)])
def test_predicted_weights_are_the_distilled_router_distribution_weighed_as_the_family_weighs_its_top_k(
        lm, traces, trained, rule):
    """q = softmax(head logits); renormalised over the top-k and scaled where the family's router does that."""
    draft, _ = trained
    draft.router_rule = rule
    try:
        layer = lm.moe_layers[1]
        x = traces.hidden[1, 5:6].float()
        logits = draft.head_logits(layer, x).view(draft.distances, draft.n_experts)
        q = torch.softmax(logits, dim=-1)
        if rule[0]:
            q = q / torch.topk(q, draft.top_k, dim=-1).values.sum(-1, keepdim=True)
        want = q * rule[1]
        for path in (draft.predictions_from_logits(layer, logits.reshape(-1).numpy()),
                     draft.predictions_from_readback(layer, draft.head_readback(layer, x).numpy())):
            got = torch.as_tensor(np.stack([np.asarray(p.weights) for p in path]))
            assert torch.allclose(got, want, atol=1e-5)
    finally:
        draft.router_rule = (False, 1.0)
