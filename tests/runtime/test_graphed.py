"""The graphed decoder: plan rows and LRU bookkeeping (pure), the step run op by op on the CPU, and on
a GPU the captured segments. Exact slot mechanisms must be bitwise identical to all-resident."""

import contextlib

import pytest
import torch

from tiny_models import FAMILIES, build_tiny

from spice_core.runtime.graphed_plan import KIND_EXT, KIND_GPU, KIND_NONE, plan_rows
from spice_core.types import ExpertKey

PROMPT = [5, 17, 33, 2, 9, 41, 7]


def test_plan_rows_order_selections_by_expert_and_slots_for_the_grouped_gemm():
    slot_e, perm, valid, by_slot, inv, *_ = plan_rows([7, 2, 5], [10, 30, 20], n_experts=8, n_slots=40)
    assert perm == [1, 2, 0] and slot_e == [30, 20, 10] and valid == [1, 1, 1]
    assert by_slot == [10, 20, 30]
    assert [by_slot[inv[j]] for j in range(3)] == slot_e      # inv maps expert order to slot-order rows


def test_plan_rows_put_dropped_selections_last_with_a_sentinel_slot():
    slot_e, perm, valid, by_slot, inv, *_ = plan_rows([3, 8, 1], [4, 6], n_experts=8, n_slots=9)
    assert perm == [2, 0, 1] and valid == [1, 1, 0] and slot_e == [6, 4, 0]
    assert by_slot == [4, 6, 9]


@pytest.mark.parametrize("slots", [[1, 1], [0, 5]])
def test_plan_rows_refuse_duplicate_or_out_of_range_slots(slots):
    with pytest.raises(ValueError):
        plan_rows([0, 1], slots, n_experts=4, n_slots=5)


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_graphed")
    return {f: build_tiny(f, root / f) for f in FAMILIES}


def _greedy(lm, n_slots, n_tokens, use_graphs):
    from spice_core.runtime.graphed import GraphedDecoder
    from spice_core.runtime.graphed_slots import LruSlots, ResidentSlots, resident_buffer

    copy_stream = torch.cuda.Stream() if lm.device.type == "cuda" else None
    if n_slots is None:
        buf, cb = resident_buffer(lm), ResidentSlots(lm)
    else:
        buf = torch.zeros((n_slots, lm.layout.numel), dtype=lm.layout.dtype, device=lm.device)
        cb = LruSlots(lm, buf, copy_stream)
    dec = GraphedDecoder(lm, buf, copy_stream, len(PROMPT) + n_tokens + 8, use_graphs=use_graphs)
    tok = dec.prefill(PROMPT, cb.prefill)
    toks, logits = [tok], []
    for _ in range(n_tokens - 1):
        tok = dec.step(tok, cb)
        toks.append(tok)
        logits.append(dec.last_logits.float().cpu())
    return toks, torch.stack(logits), cb


def _stock(d, n_tokens, device):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(d).to(device).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT], device=device), max_new_tokens=n_tokens, min_new_tokens=n_tokens,
                             do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("family", FAMILIES)
def test_eager_step_lru_is_bitwise_resident_and_matches_stock_generate(tiny_dirs, family):
    from spice_core.model.loader import load_model

    lm = load_model(tiny_dirs[family], "cpu")
    res_toks, res_logits, _ = _greedy(lm, None, 16, use_graphs=False)
    lru_toks, lru_logits, cb = _greedy(lm, lm.top_k + 1, 16, use_graphs=False)
    assert cb.misses > 0 and lru_toks == res_toks and torch.equal(lru_logits, res_logits)
    assert res_toks == _stock(tiny_dirs[family], 16, "cpu")


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_graphed_lru_is_bitwise_resident_over_64_steps(tiny_dirs, family):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.model.loader import load_model

    lm = load_model(tiny_dirs[family], "cuda")
    res_toks, res_logits, _ = _greedy(lm, None, 64, use_graphs=True)
    lru_toks, lru_logits, cb = _greedy(lm, lm.top_k + 2, 64, use_graphs=True)
    assert cb.misses > 0
    assert lru_toks == res_toks and torch.equal(lru_logits, res_logits)
    eager_toks, eager_logits, _ = _greedy(lm, None, 64, use_graphs=False)   # same ops, not captured
    assert eager_toks == res_toks and torch.equal(eager_logits, res_logits)


def test_decoder_refuses_unknown_kernel_and_a_cache_below_top_k(tiny_dirs):
    from spice_core.errors import ConfigError
    from spice_core.model.loader import load_model
    from spice_core.runtime.graphed import GraphedDecoder

    lm = load_model(tiny_dirs["mixtral"], "cpu")
    small = torch.zeros((lm.top_k - 1, lm.layout.numel), dtype=lm.layout.dtype)
    with pytest.raises(ConfigError, match="top-"):
        GraphedDecoder(lm, small, None, 32, use_graphs=False)
    with pytest.raises(ConfigError, match="kernel"):
        GraphedDecoder(lm, small, None, 32, kernel="triton", use_graphs=False)


def test_plan_rows_mark_lore_approximations_with_a_dummy_slot_and_the_expert_id():
    from spice_core.runtime.graphed_plan import APPROX_SLOT
    slot_e, perm, valid, by_slot, inv, approx, expert, kind = plan_rows([7, 2, 5], [10, APPROX_SLOT, 20],
                                                                        n_experts=8, n_slots=40)
    assert perm == [1, 2, 0] and approx == [1, 0, 0] and expert == [2, 5, 7]
    assert slot_e == [0, 20, 10] and valid == [1, 1, 1]
    assert by_slot == [10, 20, 40]            # the approximated selection is kept out of the grouped GEMM
    assert kind == [KIND_EXT, KIND_GPU, KIND_GPU]   # the slot kernel reads no slot for it (FASTPATH H2)


def test_plan_rows_give_dropped_selections_the_kind_that_reads_nothing():
    *_, kind = plan_rows([3, 8, 1], [4, 6], n_experts=8, n_slots=9)
    assert kind == [KIND_GPU, KIND_GPU, KIND_NONE]


def test_plan_rows_short_way_gives_the_general_rows_and_refuses_the_same_slots():
    """Every pick routed takes plan_rows' shorter way: the same rows as the definition, for any mix of kinds."""
    import random

    from spice_core.runtime.graphed_plan import APPROX_SLOT, CPU_SLOT, plan_rows_general

    rng = random.Random(0)
    for _ in range(300):
        k = rng.randint(1, 8)
        ids = rng.sample(range(64), k)
        slots = rng.sample(range(20), k)
        for i in range(k):
            if rng.random() < 0.3:
                slots[i] = rng.choice((APPROX_SLOT, CPU_SLOT))
        assert plan_rows(ids, slots, 64, 20) == plan_rows_general(ids, slots, 64, 20)
    for bad in ([1, 1], [1, 20], [1, -3]):
        for fn in (plan_rows, plan_rows_general):
            with pytest.raises(ValueError, match="must be distinct and in"):
                fn([4, 9], bad, 64, 20)


def _static_decoder(lm, room):
    from spice_core.runtime.graphed import GraphedDecoder
    from spice_core.runtime.graphed_slots import ResidentSlots, resident_buffer

    table = torch.arange(len(lm.moe_layers) * lm.n_experts, device=lm.device).view(len(lm.moe_layers), lm.n_experts)
    cb = ResidentSlots(lm)
    copy_stream = torch.cuda.Stream() if lm.device.type == "cuda" else None
    dec = GraphedDecoder(lm, resident_buffer(lm), copy_stream, len(PROMPT) + room, static_slots=table)
    return dec, cb


@pytest.mark.parametrize("family", ("qwen2_moe", "deepseek_v2"))
def test_a_static_step_run_ahead_gives_the_same_steps_and_rolls_back_for_another_token(tiny_dirs, family):
    """`step(run_ahead=True)` launches the next step before the host books this one: the same tokens, logits and
    per-layer routing as stepping one at a time; a token other than the greedy one undoes the step run ahead (its
    position and the cache's lengths) and runs the right one; a new prefill after a step run ahead starts clean;
    no step is run ahead past the cache. Op by op on the CPU."""
    from spice_core.model.loader import load_model

    _check_run_ahead(load_model(tiny_dirs[family], "cpu"))


@pytest.mark.cuda
@pytest.mark.parametrize("family", FAMILIES)
def test_a_static_step_run_ahead_replays_on_its_own_stream_with_the_same_steps(tiny_dirs, family):
    """The same on a GPU: the step run ahead is a replay of the one graph on the decoder's second stream."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from spice_core.model.loader import load_model

    _check_run_ahead(load_model(tiny_dirs[family], "cuda"))


def _check_run_ahead(lm):
    from spice_core.errors import ConfigError

    n = 10
    forced = {4: 7, 7: 3}          # step index -> a token fed instead of the greedy one

    def run(run_ahead):
        dec, cb = _static_decoder(lm, n + 2)
        seen = []

        def on_layer(layer, ids, ws):
            seen.append((layer, tuple(ids), tuple(round(w, 6) for w in ws)))
            return cb(layer, ids, ws)

        # On the decoder's stream, as the engine's run reads the logits (graph_exec.GraphStepper.context).
        with torch.cuda.stream(dec.stream) if dec.stream is not None else contextlib.nullcontext():
            toks, logits = [dec.prefill(PROMPT, cb.prefill)], []
            for i in range(n):
                tok = dec.step(forced.get(i, toks[-1]), on_layer, run_ahead=run_ahead)
                toks.append(tok)
                logits.append(dec.last_logits.float().cpu().clone())
            again = dec.prefill(PROMPT, cb.prefill)     # after a step run ahead: the cache starts clean
            after = dec.step(again, on_layer, run_ahead=run_ahead)
        dec.close()
        return toks, torch.stack(logits), seen, (again, after)

    toks, logits, seen, restart = run(run_ahead=False)
    a_toks, a_logits, a_seen, a_restart = run(run_ahead=True)
    assert a_toks == toks and torch.equal(a_logits, logits)
    assert a_seen == seen and len(seen) == (n + 1) * len(lm.moe_layers)
    assert a_restart == restart == (toks[0], toks[1])

    dec, cb = _static_decoder(lm, 1)          # room for one step after the prompt: nothing runs ahead past it
    tok = dec.step(dec.prefill(PROMPT, cb.prefill), cb, run_ahead=True)
    assert not dec.static.ahead
    with pytest.raises(ConfigError, match="max_cache_len"):
        dec.step(tok, cb, run_ahead=True)

    # A booking that fails leaves the decoder after its step with nothing run ahead: fed that step's token (the
    # reference run's), it goes on as if nothing had happened.
    dec, cb = _static_decoder(lm, n + 2)
    calls = []

    def flaky(layer, ids, ws):
        calls.append(layer)
        if len(calls) == 1:      # the first step's first layer (the step run ahead then leaves another token)
            raise RuntimeError("booking failed")
        return cb(layer, ids, ws)

    with torch.cuda.stream(dec.stream) if dec.stream is not None else contextlib.nullcontext():
        got, got_logits = [dec.prefill(PROMPT, cb.prefill)], []
        for i in range(n):
            tok_in = forced.get(i, got[-1])
            try:
                got.append(dec.step(tok_in, flaky, run_ahead=True))
                got_logits.append(dec.last_logits.float().cpu().clone())
            except RuntimeError:
                assert i == 0 and not dec.static.ahead
                got.append(toks[i + 1])
                got_logits.append(logits[i])
    dec.close()
    assert got == toks and torch.equal(torch.stack(got_logits), logits)


def test_a_token_is_taken_back_from_static_cache_layers_with_or_without_crop():
    """Roll-back on transformers 5.24 (`crop(-1)`) and on 5.17, whose static layers keep only length tensors."""
    from transformers.cache_utils import StaticLayer

    from spice_core.errors import SpiceError
    from spice_core.runtime.graphed_static import _rewind_one_token

    layer = StaticLayer(max_cache_len=8)
    layer.update(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))
    _rewind_one_token(layer)
    assert int(layer.get_seq_length()) == 2

    class LengthsOnly:                       # the 5.17 shape: no crop(), in-place length counters
        cumulative_length = torch.tensor(5)
        indexer_cumulative_length = torch.tensor(5)

    old = LengthsOnly()
    _rewind_one_token(old)
    assert int(old.cumulative_length) == 4 and int(old.indexer_cumulative_length) == 4
    with pytest.raises(SpiceError, match="no crop"):
        _rewind_one_token(object())
