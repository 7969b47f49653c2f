"""The story generator: deterministic by seed, a 2,000+-word lexicon, 20+ plot schemas,
and chat stories that follow their request."""
import re

from training import lexicon
from training.stories import (StoryRequest, generate_chat_story, generate_story, request_from_text,
                              training_document)
from training.story_schemas import SCHEMAS


def test_same_seed_gives_same_text():
    for seed in (0, 7, 123456789):
        assert generate_story(seed).text == generate_story(seed).text
        assert generate_chat_story(seed).document() == generate_chat_story(seed).document()
        assert training_document(seed) == training_document(seed)


def test_different_seeds_give_different_stories():
    texts = {generate_story(seed).text for seed in range(200)}
    assert len(texts) == 200


def test_lexicon_has_2000_words_and_the_generator_uses_them():
    assert len(lexicon.all_words()) >= 2000
    used = set()
    for seed in range(12000):
        used.update(re.findall(r"[a-z'-]+", training_document(seed).lower()))
    assert len(used) >= 2000


def test_at_least_20_plot_schemas_are_all_used():
    assert len(SCHEMAS) >= 20
    assert {generate_story(seed).schema for seed in range(2000)} == set(SCHEMAS)


def test_stories_have_named_characters_and_dialogue():
    stories = [generate_story(seed) for seed in range(300)]
    assert all(s.hero.name in s.text for s in stories)
    assert sum('"' in s.text for s in stories) / len(stories) > 0.8


def test_cat_and_ball_request_gives_a_story_about_a_cat_and_a_ball():
    request = request_from_text("Tell me a story about a cat and a ball")
    assert (request.kind, request.obj) == ("cat", "ball")
    for seed in range(50):
        story = generate_story(seed, request)
        assert story.hero.kind == "cat" and story.obj == "ball"
        assert re.search(r"\bcat\b", story.text) and re.search(r"\bball\b", story.text)


def test_chat_stories_follow_every_kind_of_request():
    checked = 0
    for seed in range(600):
        story = generate_chat_story(seed)
        req = story.request
        assert story.document().startswith(f"<|user|> {req.text} <|assistant|> ")
        assert story.document().endswith("<|endoftext|>")
        for word in (req.kind, req.obj, req.name, req.friend_kind, req.place):
            if word:
                assert re.search(rf"\b{re.escape(word)}\b", story.text), (req, story.text)
                checked += 1
        if req.schema:
            assert story.schema == req.schema
    assert checked > 600


def test_request_parser_tells_a_friend_from_an_object():
    assert request_from_text("Tell me a story about a cat and a dog.") == StoryRequest(
        kind="cat", friend_kind="dog", text="Tell me a story about a cat and a dog.")
    assert request_from_text("Can you tell me a story about a kite?").obj == "kite"
