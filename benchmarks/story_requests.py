"""Does a story contain what was asked for, and are two stories different stories? For each shipped model.

    python benchmarks/story_requests.py [--models spice-mini spice-mini-qwen2] [--requests 16]
        [--max-new-tokens 192] [--out docs/benchmarks/stories]

Requests: ``--requests`` drawn by the story generator's own request maker (training.stories.random_request:
its ten phrasings and seven forms: a kind and an object, a kind alone, an object alone, a kind with a name, a
kind and a friend, a kind in a place, a kind with a plot theme) from seeds in a held-out range that no training
document and no other held-out evaluation uses, leaving out any request that names what the app's chat
examples or a model card's samples name; then four requests with words the generator never writes ("new
words"), reported apart. The same requests go to every model.

Stories: the chat's path at exact settings (SpiceEngine, policy ``resident``, greedy, the app's default of
192 new tokens, the model's chat template), generated on the CPU, one request at a time, as a visitor gets
them (the engine is token-identical to stock transformers; its CPU path computes in float32).

Scores (pure functions below, tested in tests/training/test_story_requests.py):
- **names what was asked**: every word the request gives (the hero's kind, the object, a name, the friend's
  kind, a place) occurs in the story as a whole word, case-insensitively: the model card's
  `training.evaluate.request_following` measure ("names both the requested kind of hero and the requested
  object"), extended to every request form;
- **distinctness** of two stories: 1 - Jaccard similarity of their sets of distinct word trigrams, averaged over
  every pair of stories of different requests (1: no three-word sequence in common). **Plot distinctness** is
  the same with both requests' words and every character name replaced by one placeholder first, so two stories
  that tell the same plot with other names and animals score near 0; a pair whose masked trigram Jaccard is
  >= 0.5 counts as **near-identical plots**;
- **ended by itself**: the story ended (end-of-text) within the token limit.

Greedy tokens can differ between CPUs (issue 24, defect 12): the output names the CPU it ran on.
"""
from __future__ import annotations

import itertools
import json
import os
import platform
import random
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _path in (ROOT, ROOT / "benchmarks"):        # the package and bench_args, run from anywhere
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import bench_args  # noqa: E402
from bench_args import ca  # noqa: E402
from spice_core.config import MAX_NEW_TOKENS_LIMIT  # noqa: E402
from spice_core.machine import cpu_model_name  # noqa: E402

from training import lexicon  # noqa: E402
from training.corpus import VALIDATION_SEED_BASE  # noqa: E402
from training.stories import StoryRequest, random_request, request_from_text  # noqa: E402

# Training documents use seeds below VALIDATION_SEED_BASE; the held-out evaluations use VALIDATION_SEED_BASE and
# VALIDATION_SEED_BASE + 10**9 upward (training.corpus, training.evaluate). These requests come from further up.
REQUEST_SEED_BASE = VALIDATION_SEED_BASE + 3 * 10**9
# Words the generator's lexicon lacks (checked at start): what a visitor may well ask for.
NEW_WORD_REQUESTS = (("Tell me a story about a dragon and a violin.", ("dragon", "violin")),
                     ("Tell me a story about a knight and a storm.", ("knight", "storm")),
                     ("Tell me a story about an astronaut and a kite.", ("astronaut", "kite")),
                     ("Tell me a story about a pirate and a ball.", ("pirate", "ball")))
NEAR_IDENTICAL = 0.5            # masked trigram Jaccard at or above which two stories tell the same plot
MASK = "<x>"
_WORD = re.compile(r"[a-z]+(?:-[a-z]+)*")        # "max's" is "max", "s": a name's possessive is masked with it
_CHARACTER_NAMES = frozenset(n.lower() for n in lexicon.GIRL_NAMES + lexicon.BOY_NAMES)


# --- scores (pure) -----------------------------------------------------------------------------
def asked_words(request: StoryRequest) -> tuple[str, ...]:
    """The words a story must name to be about what was asked, in the request's order."""
    return tuple(w for w in (request.kind, request.obj, request.name, request.friend_kind, request.place) if w)


def request_form(request: StoryRequest) -> str:
    """Which of the generator's request forms ``request`` is (training.stories.random_request)."""
    if request.schema:
        return "a kind with a plot theme"
    if request.name:
        return "a kind with a name"
    if request.friend_kind:
        return "a kind and a friend"
    if request.place:
        return "a kind in a place"
    if request.kind and request.obj:
        return "a kind and an object"
    return "a kind alone" if request.kind else "an object alone"


def names_all(text: str, words) -> bool:
    """Every one of ``words`` (a multi-word one as a phrase) occurs in ``text`` as a whole word, any case."""
    return all(re.search(rf"(?<![\w-]){re.escape(w)}(?![\w-])", text, re.IGNORECASE) for w in words)


def trigrams(text: str, mask=frozenset()) -> set[tuple[str, ...]]:
    """The distinct word trigrams of ``text`` (lower case), each word in ``mask`` replaced by one placeholder."""
    words = [MASK if w in mask else w for w in _WORD.findall(text.lower())]
    return {tuple(words[i:i + 3]) for i in range(len(words) - 2)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 1.0


def plot_mask(*word_lists) -> frozenset[str]:
    """What `trigrams` hides to compare plots: the requests' words (each word of a phrase) and character names."""
    return frozenset(part for words in word_lists for w in words for part in w.lower().split()) | _CHARACTER_NAMES


def pair_scores(stories: list[tuple[str, tuple[str, ...]]]) -> dict:
    """Over every pair of (text, asked words): mean distinctness, mean plot distinctness, near-identical plots."""
    raw, plot, same = [], [], 0
    for (ta, wa), (tb, wb) in itertools.combinations(stories, 2):
        raw.append(1 - jaccard(trigrams(ta), trigrams(tb)))
        mask = plot_mask(wa, wb)
        similar = jaccard(trigrams(ta, mask), trigrams(tb, mask))
        plot.append(1 - similar)
        same += similar >= NEAR_IDENTICAL
    n = len(raw)
    return {"pairs": n, "distinctness": sum(raw) / n if n else None,
            "plot_distinctness": sum(plot) / n if n else None, "near_identical_plot_pairs": same}


# --- requests ----------------------------------------------------------------------------------
def avoided_words(prompts) -> set[frozenset[str]]:
    """The asked-word sets of prompts the benchmark must not reuse (the chat's examples, the cards' samples)."""
    return {frozenset(asked_words(request_from_text(p))) for p in prompts} - {frozenset()}


def held_out_requests(n: int, avoid: set[frozenset[str]]) -> list[StoryRequest]:
    """``n`` requests from the held-out seed range, none naming what an avoided prompt names, none twice."""
    out, seen, seed = [], set(), REQUEST_SEED_BASE
    while len(out) < n:
        request = random_request(random.Random(seed))
        seed += 1
        words = frozenset(asked_words(request))
        if not words or words in seen or any(a <= words for a in avoid):
            continue
        seen.add(words)
        out.append(request)
    return out


def card_prompts(model_dir: Path) -> list[str]:
    """The prompts of a model card's samples ("prompt: `...`")."""
    card = model_dir / "README.md"
    return re.findall(r"prompt: `([^`]+)`", card.read_text(encoding="utf-8")) if card.is_file() else []


# --- generation --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Story:
    request: str
    form: str
    asked: tuple[str, ...]
    text: str
    ended: bool
    tokens: int

    @property
    def named(self) -> bool:
        return names_all(self.text, self.asked)


def tell(engine, prompt: str, max_new_tokens: int):
    """One greedy story at exact settings, through the chat's path (the engine's chat template)."""
    from spice_core.api import RunSettings

    t0 = time.perf_counter()
    steps = list(engine.start_chat([{"role": "user", "content": prompt}],
                                   RunSettings(policy="resident", max_new_tokens=max_new_tokens, temperature=0.0)))
    print(f"  {len(steps)} tokens in {time.perf_counter() - t0:.1f} s: {prompt}", file=sys.stderr, flush=True)
    return "".join(s.text for s in steps).strip(), steps[-1].finish_reason == "eos", len(steps)


def summary(stories: list[Story]) -> dict:
    forms: dict[str, list[int]] = {}
    for s in stories:
        counts = forms.setdefault(s.form, [0, 0])
        counts[0] += s.named
        counts[1] += 1
    return {"requests": len(stories), "named_what_was_asked": sum(s.named for s in stories), "by_form": forms,
            "share_named": sum(s.named for s in stories) / len(stories),
            "ended_by_itself": sum(s.ended for s in stories),
            **pair_scores([(s.text, s.asked) for s in stories])}



def main(argv: list[str] | None = None) -> int:
    parser = bench_args.Parser(prog=bench_args.prog(__file__), description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", type=bench_args.model, default=["spice-mini", "spice-mini-qwen2"],
                        help="shipped model names or folders")
    parser.add_argument("--requests", type=ca.positive_int, default=16, help="held-out requests per model")
    parser.add_argument("--max-new-tokens", type=ca.int_in(1, MAX_NEW_TOKENS_LIMIT), default=192,
                        help="the app's default reply length")
    parser.add_argument("--threads", type=ca.threads, default=1,
                        help="torch threads (1: a tiny model gains nothing from more, and spins on a shared CPU)")
    parser.add_argument("--out", type=Path, default=None, help="folder for results.json and README.md")
    args = parser.parse_args(argv)
    from spice_core.errors import SpiceError
    from spice_core.model.shipped import model_argument

    try:       # the defaults too: a shipped model whose folder is missing is named before anything loads
        folders = [Path(model_argument(m, "--models")) for m in args.models]
    except SpiceError as e:
        parser.error(str(e))
    if args.out is not None:
        bench_args.check_out_dir(parser, args.out, "--out")

    import torch
    from spice_core.engine import SpiceEngine

    torch.set_num_threads(args.threads)
    known = set(lexicon.ANIMALS) | set(lexicon.TOYS) | set(lexicon.PEOPLE_KINDS) | set(lexicon.PLACES)
    assert all(any(w not in known for w in words) for _, words in NEW_WORD_REQUESTS), "a 'new word' is known"
    from pages.chat import EXAMPLES      # the chat's example requests: not held out
    avoid = avoided_words([*EXAMPLES, *(p for f in folders for p in card_prompts(f))])
    requests = held_out_requests(args.requests, avoid)
    new_words = list(NEW_WORD_REQUESTS)

    started = time.perf_counter()
    results = {"models": {}}
    for folder in folders:
        t0 = time.perf_counter()
        engine = SpiceEngine.load(folder, device="cpu")
        name = engine.info().model_name
        held = [Story(r.text, request_form(r), asked_words(r), *tell(engine, r.text, args.max_new_tokens))
                for r in requests]
        new = [Story(p, "new words", w, *tell(engine, p, args.max_new_tokens)) for p, w in new_words]
        results["models"][name] = {"held_out": summary(held), "new_words": summary(new),
                                   "seconds": round(time.perf_counter() - t0, 1),
                                   "stories": [s.__dict__ | {"named": s.named} for s in held + new]}
        h = results["models"][name]["held_out"]
        print(f"{name}: {h['named_what_was_asked']}/{h['requests']} name what was asked, distinctness "
              f"{h['distinctness']:.3f}, plot distinctness {h['plot_distinctness']:.3f}, "
              f"{h['near_identical_plot_pairs']}/{h['pairs']} near-identical plots", flush=True)
        del engine
    results |= {
        "command": "python benchmarks/story_requests.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "measured": "on the CPU", "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "load_average_1min_at_end": round(os.getloadavg()[0], 1), "torch": torch.__version__,
        "settings": {"policy": "resident", "greedy": True, "max_new_tokens": args.max_new_tokens},
        "request_seed_base": REQUEST_SEED_BASE, "near_identical_jaccard": NEAR_IDENTICAL,
        "requests": [r.text for r in requests], "new_word_requests": [p for p, _ in new_words],
        "seconds": round(time.perf_counter() - started, 1),
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
        (args.out / "README.md").write_text(report(results))
        print(f"wrote {args.out / 'results.json'} and {args.out / 'README.md'}")
    return 0


# --- report ------------------------------------------------------------------------------------
def report(results: dict) -> str:
    models = results["models"]
    row = lambda name, part: (lambda s: (     # noqa: E731
        f"| {name} | {s['named_what_was_asked']} / {s['requests']} ({100 * s['share_named']:.0f}%) | "
        f"{s['ended_by_itself']} / {s['requests']} | {s['distinctness']:.3f} | {s['plot_distinctness']:.3f} | "
        f"{s['near_identical_plot_pairs']} / {s['pairs']} |"))(models[name][part])
    head = ("| model | names what was asked | ended by itself | distinctness | plot distinctness | "
            "near-identical plots |\n|---|---|---|---|---|---|")
    misses = [f"- {name}: “{s['request']}” → {', '.join(w for w in s['asked'] if not names_all(s['text'], [w]))} "
              f"missing" for name, m in models.items() for s in m["stories"][:len(results["requests"])]
              if not s["named"]]
    s = results["settings"]
    forms = sorted({f for m in models.values() for f in m["held_out"]["by_form"]})
    by_form = ["| request form | " + " | ".join(models) + " |", "|---|" + "---|" * len(models),
               *(f"| {f} | " + " | ".join("{} / {}".format(*m["held_out"]["by_form"][f]) if f in m["held_out"]["by_form"]
                                          else "–" for m in models.values()) + " |" for f in forms)]
    return "\n".join([
        f"# Story requests: does a story contain what was asked, and do two requests get two stories?",
        "",
        f"Measured **{results['measured']}** on {results['date']} ({results['cpu']}, {results['cores']} cores, {results['threads']} torch "
        f"thread, torch {results['torch']}); greedy, policy `{s['policy']}` (exact), at most {s['max_new_tokens']} "
        f"new tokens, the app's chat path; {results['seconds']:.0f} s in all, on a machine shared with other work "
        f"(1-minute load average {results['load_average_1min_at_end']} at the end).",
        "",
        "```",
        results["command"],
        "```",
        "",
        f"## Held-out requests ({len(results['requests'])} per model, the same for both)",
        "",
        "Drawn by the story generator's own request maker from seeds no training document and no other held-out "
        "evaluation uses, leaving out what the chat's examples and the model cards' samples ask for. The "
        "generator's lexicon is small, so the words of a request (and often its pair) do occur in training "
        "stories: this measures following a request, not knowing new words.",
        "",
        head, *(row(n, "held_out") for n in models),
        "",
        "- **names what was asked**: every word the request gives (the hero's kind, the object, a name, the "
        "friend's kind, a place) is in the story as a whole word, any case (the cards' `request_following` "
        "measure, for every request form).",
        "- **distinctness**: 1 − Jaccard similarity of two stories' distinct word trigrams, mean over every pair "
        "of requests (1: no three words in a row in common). **Plot distinctness**: the same with both "
        "requests' words and every character name masked, so a plot retold with other names and animals "
        f"scores near 0; **near-identical plots**: pairs whose masked trigram Jaccard is ≥ "
        f"{results['near_identical_jaccard']}.",
        "",
        "The model cards' own measure (`training.evaluate.request_following`: 16 random “a kind and an object” "
        "requests, 48 new tokens) reads 16 of 16 on both cards; here that is one form of seven, at the app's reply "
        "length. By request form (stories naming what was asked / requests):",
        "",
        *by_form,
        "",
        "Requests whose story left something out:" if misses else "Every story named what was asked.",
        *([""] + misses if misses else []), "",
        "## Requests with words the generator never writes",
        "",
        head, *(row(n, "new_words") for n in models),
        "",
        "Requests: " + "; ".join(f"“{p}”" for p in results["new_word_requests"]) + ".",
        "",
        "## The requests",
        "",
        *(f"{i + 1}. {r}" for i, r in enumerate(results["requests"])),
        "",
        "Every story, its request and its scores: `results.json` beside this file.",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
