"""Routing traces: what they hold, that they match the router, and bad calibration sets."""
import pytest
import torch

from spice_core.errors import ConfigError
from spice_core.model.loader import load_model
from spice_core.predictor.traces import collect_traces, pack_rows, read_text_file, traces_for_model


@pytest.fixture(scope="module")
def lm(tiny_dirs):
    return load_model(tiny_dirs["deepseek_v2_grouped"], "cpu")


def rows(n=6, length=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (length,), generator=g).tolist() for _ in range(n)]


def test_traces_hold_every_moe_layer_input_distribution_and_selection(lm):
    tr = collect_traces(lm, rows(4, 20) + rows(2, 11, seed=1))
    L, N = len(lm.moe_layers), 4 * 20 + 2 * 11
    assert tr.hidden.shape == (L, N, lm.layout.hidden)
    assert tr.probs.shape == (L, N, lm.n_experts) and tr.topk.shape == (L, N, lm.top_k)
    assert torch.allclose(tr.probs.sum(-1), torch.ones(L, N), atol=1e-5)
    # Rows come back in order with consecutive positions, so token i+1 follows token i.
    assert tr.row.tolist() == sorted(tr.row.tolist())
    assert all((tr.pos[tr.row == r] == torch.arange(int((tr.row == r).sum()))).all() for r in range(6))


def test_recorded_selection_is_the_routers_own_including_group_limited_topk(lm):
    tr = collect_traces(lm, rows(2, 16))
    for p, layer in enumerate(lm.moe_layers):
        _, _, idx = lm.moe_block(layer).gate(tr.hidden[p].to(lm.model.dtype))
        assert torch.equal(idx.sort(-1).values, tr.topk[p].long().sort(-1).values)


def test_tracing_leaves_the_experts_modules_as_it_found_them(lm):
    before = {layer: mod.runtime for layer, mod in lm.experts_modules.items()}
    collect_traces(lm, rows(1, 8))
    assert {layer: mod.runtime for layer, mod in lm.experts_modules.items()} == before


def test_popularity_lists_every_expert_most_frequent_first(lm):
    tr = collect_traces(lm, rows(4, 32))
    pop = tr.popularity()
    assert len(pop) == len(set(pop)) == len(lm.moe_layers) * lm.n_experts
    freq = tr.expert_frequency()
    values = [float(freq[lm.moe_layers.index(k.layer), k.expert]) for k in pop]
    assert values == sorted(values, reverse=True)
    assert torch.allclose(freq.sum(-1), torch.full((len(lm.moe_layers),), float(lm.top_k)))


def test_split_rows_keeps_whole_rows_apart(lm):
    tr = collect_traces(lm, rows(10, 8))
    train, ev = tr.split_rows(0.2)
    assert train.n_tokens + ev.n_tokens == tr.n_tokens
    assert set(train.row.tolist()).isdisjoint(ev.row.tolist()) and ev.n_tokens == 16


def test_empty_calibration_set_is_refused_clearly(lm):
    with pytest.raises(ConfigError, match="calibration set is empty"):
        collect_traces(lm, [])
    with pytest.raises(ConfigError, match="calibration set is empty"):
        collect_traces(lm, [[], []])


def test_empty_or_blank_text_file_is_refused_clearly(lm, tmp_path):
    f = tmp_path / "blank.txt"
    f.write_text("\n\n   \n")
    with pytest.raises(ConfigError, match="empty"):
        read_text_file(f)
    with pytest.raises(ConfigError, match="no such file"):
        read_text_file(tmp_path / "missing.txt")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ConfigError, match="UTF-8"):
        read_text_file(bad)


def test_text_too_short_to_calibrate_on_is_refused(lm, tmp_path):
    f = tmp_path / "one_word.txt"
    f.write_text("cat")
    with pytest.raises(ConfigError, match="only 2 tokens"):
        traces_for_model(lm, text_file=f, max_tokens=100)


def test_a_text_file_calibration_set(lm, tmp_path):
    f = tmp_path / "text.txt"
    f.write_text("the cat sat on the mat and the dog ran to the park .\n\n" * 20)
    tr = traces_for_model(lm, text_file=f, max_tokens=120, seq_len=32)
    assert tr.n_tokens == 120 and "text.txt" in tr.source


def test_pack_rows_drops_single_token_tails():
    assert pack_rows(list(range(7)), 3) == [[0, 1, 2], [3, 4, 5]]
    assert pack_rows(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    with pytest.raises(ConfigError):
        pack_rows([1, 2], 1)


def test_shipped_models_calibration_and_eval_halves_of_the_heldout_split_are_disjoint():
    from spice_core.predictor.traces import _shipped_heldout_texts

    cal, cal_src = _shipped_heldout_texts("calibration")
    ev, ev_src = _shipped_heldout_texts("eval")
    assert "held-out split" in cal_src and "calibration half" in cal_src and "eval half" in ev_src
    assert set(cal).isdisjoint(ev) and len(cal) > 1000
    assert sum("<|user|>" in t for t in cal) > 0.2 * len(cal)    # chat-wrapped stories, as in training


def test_a_second_shipped_model_calibrates_on_its_own_heldout_split(tmp_path, monkeypatch):
    """spice-mini-qwen2 (here a random miniature in a stand-in assets folder) reads the held-out file beside
    it, not spice-mini's."""
    import spice_core.model.shipped as shipped
    from spice_core.model.loader import load_model
    from spice_core.predictor.traces import calibration_texts
    from tiny_models import build_qwen2_miniature, write_heldout

    d = build_qwen2_miniature(tmp_path / "spice-mini-qwen2", hidden_size=32, moe_intermediate_size=4,
                              shared_expert_intermediate_size=8)
    write_heldout(d, "qwen2")
    monkeypatch.setattr(shipped, "ASSETS", tmp_path)
    texts, source = calibration_texts(load_model(d, "cpu"))
    assert source.startswith("spice-mini-qwen2's held-out split") and texts == ["the qwen2 story of a cat"]


def test_a_users_checkpoint_is_scored_on_text_it_was_not_calibrated_on(tiny_dirs):
    """A model with no held-out split of its own calibrates on the built-in prompts and the shipped stories; quality
    and tune score on the "eval" half. Both halves began with the same built-in prompts, so a pick was scored partly
    on its own training text."""
    from spice_core.model.loader import load_model
    from spice_core.predictor.traces import calibration_texts

    lm = load_model(tiny_dirs["mixtral"], "cpu")
    cal, cal_src = calibration_texts(lm, part="calibration")
    ev, ev_src = calibration_texts(lm, part="eval")
    assert cal and ev and set(cal).isdisjoint(ev)
    assert "calibration half" in cal_src and "eval half" in ev_src
