"""Each shipped miniature's routing statistics, recomputed from its files and compared with its model
card (eval.json), and the bars each one meets on held-out text."""
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from training.evaluate import mixed_routing_sample, routing_sample
from training.model_card import MIN_SHARE_BAR, ROUTING_SEQ, ROUTING_WINDOWS
from training.sources import SourceMissingError
from training.stats import RoutingTrace, summarize, trace_routing


@dataclass(frozen=True)
class Bars:
    reuse_margin: float                 # consecutive-token reuse above its best baseline, on every sample
    mix_min_share: float | None         # least-used expert vs uniform on the training mix, every layer; None: none


# spice-mini (two stages) has no collapsed expert on held-out text. The Qwen2 miniature, after its one
# stage, has nearly idle experts in its first and last layers (its card lists them), so only the
# card's per-layer numbers are checked for it, not a bar.
MODELS = {"spice-mini": ("shipped_dir", "shipped_model", "shipped_eval", Bars(0.04, MIN_SHARE_BAR)),
          "spice-mini-qwen2": ("qwen2_dir", "qwen2_model", "qwen2_eval", Bars(0.02, None))}


@pytest.fixture(scope="module", params=list(MODELS))
def shipped(request):
    """(model, eval.json, bars) of one shipped miniature."""
    dir_name, model_name, eval_name, bars = MODELS[request.param]
    folder = request.getfixturevalue(dir_name)
    return folder, request.getfixturevalue(model_name), request.getfixturevalue(eval_name), bars


class _Body:
    """A causal LM's decoder stack alone, as `trace_routing` drives a model (``.model.layers``, called with
    ``input_ids``): the routing it records is the same to the bit, without the vocabulary projection of every
    token (a tenth of the pass), whose logits it never reads."""

    def __init__(self, lm):
        self.model = lm.model

    def __call__(self, **inputs):
        return self.model(**inputs)


@pytest.fixture(scope="module")
def routing_traces(shipped):
    """(story trace, training-mix trace or None): one forward pass over the mixed sample, whose first
    windows are the story sample (same batches, so the story numbers are those of a separate pass)."""
    folder, lm, _, _ = shipped
    model = _Body(lm)
    tok_json = folder / "tokenizer.json"
    stories = routing_sample(tok_json, ROUTING_WINDOWS, ROUTING_SEQ)
    try:
        rows = mixed_routing_sample(tok_json)
    except SourceMissingError:
        rows = None
    sample = rows if rows is not None else stories
    trace = trace_routing(model, [torch.from_numpy(sample[i:i + 8]) for i in range(0, len(sample), 8)])
    n = stories.size
    story = RoutingTrace(trace.layers, trace.topk[:, :n], trace.cross[:, :n], trace.seq_id[:n], trace.num_experts)
    return story, (trace if rows is not None else None)


def _assert_close_to_card(got, card, bars: Bars):
    assert got["tokens"] == card["tokens"]
    for key in ("load_entropy", "consecutive_reuse", "cross_layer_recall", "reuse_shuffled_baseline"):
        assert got["mean"][key] == pytest.approx(card["mean"][key], abs=0.01), key
    assert np.allclose(got["per_layer"]["cross_layer_recall"], card["per_layer"]["cross_layer_recall"], atol=0.02)
    assert np.allclose(got["per_layer"]["min_share_vs_uniform"], card["per_layer"]["min_share_vs_uniform"], atol=0.05)
    # Reuse and cross-layer predictability beat their baselines.
    reuse, base = got["mean"]["consecutive_reuse"], max(got["mean"]["reuse_shuffled_baseline"],
                                                         got["mean"]["reuse_random_baseline"])
    assert reuse > base + bars.reuse_margin
    assert got["mean"]["cross_layer_recall"] > got["mean"]["cross_layer_popularity_baseline"] + 0.3


def test_routing_statistics_on_held_out_stories_match_the_model_card(routing_traces, shipped):
    _, _, card, bars = shipped
    got = summarize(routing_traces[0])
    _assert_close_to_card(got, card["routing"], bars)
    assert min(got["per_layer"]["min_share_vs_uniform"]) > 0      # every expert is used on stories alone


def test_routing_statistics_on_the_training_mix_meet_the_bars(routing_traces, shipped):
    if routing_traces[1] is None:
        pytest.skip("held-out prose needs the source packages (see training/sources.py)")
    _, _, card, bars = shipped
    got = summarize(routing_traces[1])
    _assert_close_to_card(got, card["routing_mix"], bars)
    if bars.mix_min_share is not None:
        assert min(got["per_layer"]["min_share_vs_uniform"]) >= bars.mix_min_share   # no collapsed expert
