"""Routing-statistics formulas on hand-made routings (no model)."""
import numpy as np

from training.stats import RoutingTrace, consecutive_reuse, cross_layer_recall, load_entropy, load_shares, overlap


def _trace(topk, cross=None, seq_id=None, experts=8):
    topk = np.asarray(topk, dtype=np.int16)
    return RoutingTrace(layers=tuple(range(1, topk.shape[0] + 1)), topk=topk,
                        cross=np.asarray(cross if cross is not None else topk[1:], dtype=np.int16),
                        seq_id=np.asarray(seq_id if seq_id is not None else np.zeros(topk.shape[1], int)),
                        num_experts=experts)


def test_overlap_counts_shared_experts_over_k():
    a = np.array([[0, 1], [2, 3]])
    b = np.array([[1, 5], [6, 7]])
    assert overlap(a, b).tolist() == [0.5, 0.0]


def test_even_load_has_entropy_one_and_a_collapsed_expert_shows():
    even = _trace([[[e, (e + 1) % 8] for e in range(8)]])
    assert np.allclose(load_entropy(load_shares(even)), 1.0)
    skew = _trace([[[0, 1]] * 8])
    shares = load_shares(skew)
    assert shares[0, 2:].max() == 0 and load_entropy(shares)[0] < 0.4


def test_reuse_ignores_pairs_that_cross_a_sequence_boundary():
    trace = _trace([[[0, 1], [0, 1], [2, 3], [2, 3]]], seq_id=[0, 0, 1, 1])
    reuse, _ = consecutive_reuse(trace)
    assert reuse[0] == 1.0


def test_cross_layer_recall_is_one_when_the_next_router_agrees():
    layer1 = [[0, 1], [2, 3]]
    layer2 = [[4, 5], [6, 7]]
    recall, popular = cross_layer_recall(_trace([layer1, layer2], cross=[layer2]))
    assert recall.tolist() == [1.0] and 0 <= popular[0] <= 1
