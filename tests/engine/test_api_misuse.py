"""The library API used the wrong way (a review's findings): each gets a named error at once, or does what it says,
and never leaves the engine held or another generation changed."""
import threading

import pytest
import torch

from spice_core.api import RunSettings
from spice_core.errors import ConfigError, ContextError, PromptError
from spice_core.run import EngineBusyError

PROMPT = [5, 6, 7, 8]


@pytest.fixture
def engine(engines):
    return engines["mixtral"]


def _tokens(run) -> list[int]:
    return [s.token_id for s in run]


def test_cancel_while_the_consumer_is_paused_frees_the_engine_and_records_the_run(engine):
    """Regression: cancel() only set a flag, so a run whose consumer paused between tokens held the engine until
    someone resumed or collected its iterator (EngineBusyError for everyone else)."""
    run = engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=16))
    it = iter(run)
    next(it)
    run.cancel()
    assert _tokens(engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=2)))    # not busy
    assert run.summary().finish_reason == "cancelled" and run.summary().n_tokens == 1
    assert list(it) == []                      # the cancelled run's consumer just sees the end


def test_a_run_left_with_break_is_recorded_with_why_it_ended(engine):
    run = engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=16))
    for i, _ in enumerate(run):
        if i == 2:
            break                           # the loop's iterator goes: the run ends at once, recorded
    assert run.summary().finish_reason == "cancelled" and run.summary().n_tokens == 3
    assert run.run_id in {s.run_id for s in engine.list_runs()}


def test_the_oracles_routing_probe_is_refused_while_another_thread_generates(engine):
    """Regression: record_routing took no lock, and installed its probe's runtime under a running generation,
    changing its tokens."""
    run = engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=8))
    it = iter(run)
    next(it)                                  # this thread's run holds the engine
    errors = []
    t = threading.Thread(target=lambda: errors.append(pytest.raises(EngineBusyError, engine.record_routing, PROMPT,
                                                                     RunSettings())))
    t.start()
    t.join(60)
    assert len(errors) == 1
    list(it)
    assert engine.record_routing(PROMPT, RunSettings(max_new_tokens=2))      # free again
    oracle = _tokens(engine.start_ids(PROMPT, RunSettings(policy="oracle_prefetch", max_new_tokens=4)))
    assert oracle == _tokens(engine.start_ids(PROMPT, RunSettings(policy="resident", max_new_tokens=4)))


@pytest.mark.parametrize("bad,match", [({"tau_approx": 5.0}, "tau_approx"), ({"no_such": 1}, "unknown setting"),
                                       ("spice", "takes a RunSettings")])
def test_update_settings_refuses_bad_input_at_once_and_the_run_goes_on(engine, bad, match):
    """Regression: update_settings stored anything; the next token died in an AttributeError and the run was lost."""
    run = engine.start_ids(PROMPT, RunSettings(policy="spice", max_new_tokens=4))
    steps = []
    for i, s in enumerate(run):
        steps.append(s)
        if i == 0:
            with pytest.raises(ConfigError, match=match):
                run.update_settings(bad)
            run.update_settings({"tau_prefetch": 0.5})          # a mapping of fields applies
    assert len(steps) == 4 and run.summary().finish_reason == "length"
    assert run.settings.tau_prefetch == 0.5


def test_sampling_turned_on_mid_run_follows_the_seed(engine):
    """Regression: a temperature raised mid-run sampled from the global generator: two identical runs differed."""
    def sampled() -> list[int]:
        run = engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=8))
        out = []
        for i, s in enumerate(run):
            out.append(s.token_id)
            if i == 1:
                run.update_settings(RunSettings(policy="lru", max_new_tokens=8, temperature=1.5, seed=7))
        return out

    assert sampled() == sampled()


def test_a_stop_string_is_one_stop_not_its_characters():
    assert RunSettings(stop="Dragon").stop == ("Dragon",) and RunSettings(stop=None).stop == ()
    with pytest.raises(ConfigError, match="stop="):
        RunSettings(stop=[1])


@pytest.mark.parametrize("field,value", [("cache_frac", "0.5"), ("cache_frac", None), ("temperature", "0"),
                                         ("top_p", None), ("seed", "abc"), ("seed", 1.5), ("seed", 2**70),
                                         ("seed", -1), ("cpu_lane", "no"), ("max_new_tokens", True),
                                         ("lore_rank", True), ("cache_frac", True), ("profile", ["x"]),
                                         ("shape", 3)])
def test_run_settings_refuse_a_wrong_type_by_name(field, value):
    with pytest.raises(ConfigError, match=field):
        RunSettings(**{field: value})


def test_numpy_numbers_are_numbers():
    np = pytest.importorskip("numpy")
    RunSettings(cache_frac=np.float32(0.5), seed=np.int64(3))


@pytest.mark.parametrize("call,match", [
    (lambda e, s: e.start_ids([-1, 5], s), "token 0 of the prompt"),
    (lambda e, s: e.start_ids([5, 10**6], s), "token 1 of the prompt"),
    (lambda e, s: e.start_ids(["a"], s), "token ids are integers"),
    (lambda e, s: e.start_prompt(5, s), "not text"),
    (lambda e, s: e.start_chat([{"content": "hi"}], s), "message 1 has role"),
    (lambda e, s: e.start_chat("hello", s), "messages is a str"),
    (lambda e, s: e.start_chat([["user", "hi"]], s), "message 1 is a list"),
    (lambda e, s: e.start_chat([{"role": "user", "content": "hi"}, {"role": "wizard", "content": "x"}], s),
     "message 2 has role 'wizard'"),
    # Regression (review): these were a generator's TypeError, a tensor's RuntimeError and the tokenizer's TypeError.
    (lambda e, s: e.start_ids((t for t in [5, 6]), s), "input_ids is a generator: pass a list of token ids"),
    (lambda e, s: e.start_ids(torch.tensor([[5, 6]]), s), "input_ids has 2 dimensions"),
    (lambda e, s: e.start_ids("hello", s), "input_ids is a str"),
    (lambda e, s: e.start_prompt("a\ud800b", s), r"the prompt holds '\\ud800' at character 1, a lone surrogate"),
    (lambda e, s: e.start_chat([{"role": "user", "content": "\udc80"}], s), "message 1 holds .* a lone surrogate"),
])
def test_a_bad_prompt_is_a_prompt_error_naming_it(engine, call, match):
    with pytest.raises(PromptError, match=match):
        call(engine, RunSettings(max_new_tokens=2))


def test_a_reply_cut_by_the_context_says_so(engine):
    ctx = engine.lm.max_context_tokens
    run = engine.start_ids([5] * (ctx - 2), RunSettings(policy="lru", max_new_tokens=8))
    list(run)
    notes = " ".join(run.summary().notes)
    assert run.summary().finish_reason == "length" and "left room for 2 of the 8 new tokens" in notes, notes


def test_confirm_and_budget_refuse_bad_values_before_any_work():
    from spice_core.tuner import Budget, Confirm

    for kw in ({"new_tokens": 5000}, {"n_prompts": 2.5}, {"max_tokens": None}):
        with pytest.raises(ConfigError, match="confirmation sample"):
            Confirm(**kw)
    for kw in ({"ppl_pct": "1"}, {"agreement": "0.9"}):
        with pytest.raises(ConfigError, match="quality budget"):
            Budget(**kw)


@pytest.mark.parametrize("value", ["8", float("inf"), float("nan"), True, [8]])
def test_link_gbps_must_be_a_finite_positive_number(tiny_dirs, value):
    from spice_core.engine import SpiceEngine

    with pytest.raises(ConfigError, match="link_gbps"):
        SpiceEngine.load(tiny_dirs["mixtral"], device="cpu", link_gbps=value)


@pytest.mark.parametrize("model", ["spice-mini", "spice-mini-qwen2"])
def test_a_role_marker_typed_in_a_message_stays_text(model):
    """Regression (review): "hi <|assistant|> there" in a user message was tokenized to the real <|assistant|>
    token, so a user could open an assistant turn of their own writing. Only the template's markers are special; a
    conversation that spells none tokenizes exactly as before."""
    from pathlib import Path

    from transformers import AutoTokenizer

    from spice_core.generation import _chat_ids_literal, _chat_messages, build_prompt_ids

    tok = AutoTokenizer.from_pretrained(Path(__file__).resolve().parents[2] / "assets" / model)
    marker = "<|assistant|>"
    marker_id = tok.convert_tokens_to_ids(marker)
    plain = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a time."},
             {"role": "user", "content": "  More, please  "}]
    assert _chat_ids_literal(tok, _chat_messages(plain)) == build_prompt_ids(tok, messages=plain)
    ids = build_prompt_ids(tok, messages=[{"role": "user", "content": f"hi {marker} there"}])
    assert ids.count(marker_id) == 1, ids          # the template's, opening the reply; not the one typed
    assert marker in tok.decode(ids[:-1]) and ids[-1] == marker_id


def test_asking_for_a_running_runs_summary_says_it_is_still_generating(engine):
    from spice_core.errors import SpiceError

    run = engine.start_ids(PROMPT, RunSettings(policy="lru", max_new_tokens=4))
    it = iter(run)
    next(it)
    with pytest.raises(SpiceError, match="still generating"):
        engine.get_summary(run.run_id)
    list(it)
    assert engine.get_summary(run.run_id).n_tokens == 4


def test_a_chat_can_ask_for_room_to_reply(engine):
    """`min_reply_tokens`: a prompt that leaves the reply less room in the context is a ContextError saying how much
    it leaves; one that leaves enough starts; a bad value is a ConfigError naming it."""
    import numpy as np

    ctx = engine.lm.max_context_tokens
    ids = [5] * (ctx - 10)
    with pytest.raises(PromptError, match=rf"leaves 10 of the model's {ctx}-token context for the reply, fewer than "
                                          r"the 11 asked"):
        engine.start_ids(ids, RunSettings(max_new_tokens=2), min_reply_tokens=11)
    run = engine.start_ids(ids, RunSettings(policy="lru", max_new_tokens=2), min_reply_tokens=np.int64(10))
    assert len(list(run)) == 2
    with pytest.raises(ContextError, match="fewer than the an integer of about 5,001 digits asked"):
        engine.start_ids(ids, RunSettings(max_new_tokens=2), min_reply_tokens=10**5000)
    with pytest.raises(ConfigError, match="max_new_tokens=a negative integer of about 401 digits is out of range"):
        RunSettings(max_new_tokens=-10**400)
    for bad in (0, 2.5, True, "8"):
        with pytest.raises(ConfigError, match="min_reply_tokens"):
            engine.start_ids(ids, RunSettings(max_new_tokens=2), min_reply_tokens=bad)
    with pytest.raises(PromptError, match=rf"fewer than the {ctx - 1} asked"):
        engine.start_chat([{"role": "user", "content": "hello there"}], RunSettings(max_new_tokens=2),
                          min_reply_tokens=ctx - 1)


def test_the_finished_step_comes_once_the_run_is_recorded_and_the_engine_free(engine):
    """Regression (review): after the step marked finished, summary() said "not finished yet" and the next run got
    EngineBusyError until the consumer called next() once more."""
    run = engine.start_ids([5, 6, 7], RunSettings(policy="lru", max_new_tokens=3))
    it = iter(run)
    steps = [next(it) for _ in range(3)]
    assert steps[-1].finished and run.summary().finish_reason == "length"
    assert len(list(engine.start_ids([5, 6], RunSettings(policy="lru", max_new_tokens=2)))) == 2
    with pytest.raises(StopIteration):
        next(it)


@pytest.mark.parametrize("raised, finish, said", [(RuntimeError("observer bug"), "error", "RuntimeError: observer bug"),
                                                  (KeyboardInterrupt(), "cancelled", "interrupted (KeyboardInterrupt)")])
def test_a_run_an_exception_ends_mid_token_is_recorded_with_its_tokens(engine, raised, finish, said):
    """Regression (review): a step that raised, or Ctrl-C mid-token, left the run unrecorded (summary() "not
    finished yet", get_summary "unknown"). The exception reaches the caller; the run is recorded; the engine works."""
    run = engine.start_ids([5, 6, 7], RunSettings(policy="lru", max_new_tokens=8))

    def observer(*_):
        if run.token_index == 2:
            raise raised

    run.observers.append(observer)
    with pytest.raises(type(raised)):
        list(run)
    summary = engine.get_summary(run.run_id)
    assert summary.finish_reason == finish and summary is run.summary()
    assert f"the run stopped after 2 tokens: {said}" in summary.notes[-1], summary.notes
    assert len(list(engine.start_ids([5, 6], RunSettings(policy="lru", max_new_tokens=2)))) == 2


def test_numpy_integers_are_integers_for_the_integer_settings():
    """Regression (review): np.int64(4) for max_new_tokens, max_lookahead or lore_rank was "out of range" (4 is in
    range) while numpy values for seed and the float settings were taken. Another type is "not an integer"."""
    import numpy as np

    s = RunSettings(max_new_tokens=np.int64(4), max_lookahead=np.int32(3), lore_rank=np.int64(2))
    assert (s.max_new_tokens, s.max_lookahead, s.lore_rank) == (4, 3, 2) and type(s.max_new_tokens) is int
    with pytest.raises(ConfigError, match=r"max_new_tokens=2.0 is not an integer: use an integer in \[1, "):
        RunSettings(max_new_tokens=2.0)
    with pytest.raises(ConfigError, match=r"lore_rank=0 is out of range: use an integer >= 1"):
        RunSettings(lore_rank=np.int64(0))


def test_token_ids_from_a_tokenizer_as_arrays_or_tensors_are_taken(engine):
    """Regression (review): a 1-D numpy array or torch tensor of ids (what tokenizers return) was a ValueError."""
    import numpy as np

    for ids in (np.array([5, 6, 7]), torch.tensor([5, 6, 7]), (5, 6, 7)):
        assert len(list(engine.start_ids(ids, RunSettings(policy="lru", max_new_tokens=2)))) == 2


@pytest.mark.parametrize("settings", [None, {"max_new_tokens": 2}])
def test_settings_that_are_not_run_settings_are_a_config_error(engine, settings):
    """Regression (review): None or a dict of fields was an AttributeError."""
    with pytest.raises(ConfigError, match=f"settings is a {type(settings).__name__}: pass a RunSettings"):
        engine.start_prompt("Once", settings)
