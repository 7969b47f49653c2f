"""Generation features: sampling determinism, stop strings, EOS, chat template, streaming text."""
import pytest
import torch

from spice_core.api import RunSettings
from spice_core.errors import PromptError
from spice_core.generation import TextStreamer, sample_next


def test_sampling_is_deterministic_by_seed_and_differs_across_seeds(engines):
    eng = engines["olmoe"]
    ids = [4, 8, 15, 16, 23, 42]

    def run(seed):
        s = RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=16, temperature=1.5, top_p=0.95, seed=seed)
        return [st.token_id for st in eng.start_ids(ids, s)]

    assert run(1) == run(1)
    assert run(1) != run(2) or run(1) != run(3)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.tensor([10.0, 9.9, -5.0, -6.0])
    g = torch.Generator().manual_seed(0)
    picks = {sample_next(logits, 1.0, 0.5, g) for _ in range(50)}
    assert picks <= {0, 1}


def test_greedy_picks_argmax():
    assert sample_next(torch.tensor([0.1, 3.0, 2.0]), 0.0, 1.0, None) == 1


def test_stop_string_ends_generation_and_is_not_emitted(engines):
    eng = engines["mixtral"]
    s = RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=24)
    full = eng.start_prompt("the cat saw a ball", s)
    steps = list(full)
    text = full.summary().text
    words = text.split()
    if len(words) < 3:
        pytest.skip("tiny model produced too little text to pick a stop string")
    stop = words[2]
    run = eng.start_prompt("the cat saw a ball", RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=24,
                                                             stop=(stop,)))
    got = list(run)
    summ = run.summary()
    assert summ.finish_reason == "stop"
    assert stop not in summ.text
    assert len(got) <= len(steps)
    assert "".join(st.text for st in got) == summ.text


def test_streamed_deltas_concatenate_to_the_final_text(engines):
    eng = engines["qwen3_moe"]
    run = eng.start_chat([{"role": "user", "content": [{"type": "text", "text": "tell me a story about a dog"}]}],
                         RunSettings(policy="spice", cache_frac=0.5, max_new_tokens=12))
    deltas = [st.text for st in run]
    assert "".join(deltas) == run.summary().text


def test_chat_template_is_applied(engines):
    from spice_core.generation import build_prompt_ids

    tok = engines["olmoe"].lm.tokenizer
    ids = build_prompt_ids(tok, messages=[{"role": "user", "content": "hello"}])
    assert tok.convert_tokens_to_ids("<|assistant|>") == ids[-1]


@pytest.mark.parametrize("msgs", [[], [{"role": "user", "content": "   "}], [{"role": "user", "content": []}]])
def test_empty_chat_is_refused(engines, msgs):
    with pytest.raises(PromptError, match="empty"):
        engines["olmoe"].start_chat(msgs, RunSettings(policy="lru", cache_frac=0.5))


def test_eos_stops_generation(engines):
    eng = engines["olmoe"]
    ids = [4, 8, 15, 16]
    first = [st.token_id for st in eng.start_ids(ids, RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=8))]
    eos_tok = first[3]
    eng.lm.model.generation_config.eos_token_id = eos_tok
    try:
        run = eng.start_ids(ids, RunSettings(policy="lru", cache_frac=0.5, max_new_tokens=8))
        steps = list(run)
    finally:
        eng.lm.model.generation_config.eos_token_id = None
    assert run.summary().finish_reason == "eos"
    assert steps[-1].token_id == eos_tok and len(steps) == first.index(eos_tok) + 1


def test_text_streamer_holds_back_partial_stop_strings():
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(i) for i in ids)

    st = TextStreamer(Tok(), stop=("END",))
    out = "".join(st.push(ord(c)) for c in "abcEN")
    assert out == "abc"
    out += "".join(st.push(ord(c)) for c in "Dxyz")
    assert st.stopped and out == "abc" and st.text == "abc"


def test_plain_prompt_gets_the_tokenizers_bos_as_stock_generate_does(tmp_path):
    """A base tokenizer that prepends BOS (Mixtral's "<s> $A", DeepSeek-V2's add_bos_token): `tokenizer(prompt)` then
    `generate` sees it, so the engine's plain prompt must too; a chat template writes its own special tokens."""
    from tokenizers import processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from spice_core.generation import build_prompt_ids
    from tiny_models import save_tiny_tokenizer

    save_tiny_tokenizer(tmp_path)
    backend = AutoTokenizer.from_pretrained(tmp_path).backend_tokenizer
    backend.add_special_tokens(["<s>"])
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", bos_token="<s>")
    prompt = "the cat saw a big red ball"
    assert build_prompt_ids(tok, prompt=prompt) == tok(prompt)["input_ids"] == [bos] + tok(prompt, add_special_tokens=False)["input_ids"]
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}"
    ids = build_prompt_ids(tok, messages=[{"role": "user", "content": "hello"}])
    assert ids.count(bos) == 1 and ids[0] == bos          # the template's BOS, not a second one
