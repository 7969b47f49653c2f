"""The story-request benchmark's scores (benchmarks/story_requests.py; issue 24, defect 9): a story names what
was asked only when every asked word is there as a whole word; two stories that retell one plot with other
names and animals have a high raw distinctness but a plot distinctness near 0."""
from benchmarks.story_requests import (REQUEST_SEED_BASE, asked_words, held_out_requests, names_all,
                                       pair_scores)
from training.corpus import VALIDATION_SEED_BASE
from training.stories import request_from_text

MAX = ("Max's grandma lived in a little house near the lake. One day, grandma had a lot of bags to carry. "
       "\"Can I help you, Grandma?\" asked Max. Max carried the bags one by one. \"Thank you, my fair dog.\"")
TIM = MAX.replace("Max", "Tim").replace("dog", "rabbit")
OTHER = "Once upon a time a duck found a drum by the pond. She played it all day, and the frogs sang along."


def test_a_story_names_what_was_asked_only_with_every_word_whole():
    words = asked_words(request_from_text("Tell me a story about a cat and a ball."))
    assert words == ("cat", "ball")
    assert names_all("The Cat kicked the ball.", words)
    assert not names_all("The cat kicked the balloon.", words)           # a longer word is not the word
    assert names_all("She had a music box.", ["music box"]) and not names_all("music and a box", ["music box"])


def test_a_retold_plot_is_distinct_raw_but_not_as_a_plot():
    same = pair_scores([(MAX, ("dog", "Max")), (TIM, ("rabbit", "Tim"))])
    assert same["pairs"] == 1 and same["distinctness"] > 0.2
    assert same["plot_distinctness"] < 0.05 and same["near_identical_plot_pairs"] == 1
    apart = pair_scores([(MAX, ("dog",)), (OTHER, ("duck", "drum"))])
    assert apart["plot_distinctness"] > 0.9 and apart["near_identical_plot_pairs"] == 0


def test_held_out_requests_avoid_the_examples_and_come_from_unused_seeds():
    assert REQUEST_SEED_BASE > VALIDATION_SEED_BASE + 10**9          # above every held-out evaluation's seeds
    avoid = {frozenset({"cat", "ball"})}
    requests = held_out_requests(40, avoid)
    sets = [frozenset(asked_words(r)) for r in requests]
    assert len(set(sets)) == 40 and all(s and not {"cat", "ball"} <= s for s in sets)
    assert held_out_requests(40, avoid) == requests                      # the same for every model and run
