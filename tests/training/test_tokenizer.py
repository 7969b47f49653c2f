"""The shipped tokenizer: AutoTokenizer loads it with its specials and chat template."""
from training.stories import generate_chat_story


def test_specials_have_fixed_ids(shipped_tokenizer):
    tok = shipped_tokenizer
    assert len(tok) == 8192
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|user|>", "<|assistant|>", "<|pad|>"]) == [0, 1, 2, 3]
    assert (tok.eos_token_id, tok.bos_token_id, tok.pad_token_id) == (0, 0, 3)


def test_chat_template_renders_the_training_format(shipped_tokenizer):
    messages = [{"role": "user", "content": "Tell me a story about a cat and a ball"}]
    text = shipped_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == "<|endoftext|><|user|> Tell me a story about a cat and a ball <|assistant|>"


def test_a_generated_chat_round_trips_and_matches_its_template(shipped_tokenizer):
    story = generate_chat_story(3)
    ids = shipped_tokenizer(story.document())["input_ids"]
    assert shipped_tokenizer.decode(ids) == story.document()
    messages = [{"role": "user", "content": story.request.text}, {"role": "assistant", "content": story.text}]
    rendered = shipped_tokenizer.apply_chat_template(messages, tokenize=False)
    assert rendered == "<|endoftext|>" + story.document()
