"""Simple stories in the TinyStories style, generated from a seed.

    seed ─► random.Random ─► _Cast (hero, friend, object, place, ...) ─► opening + schema beats + ending
                                   ▲
    StoryRequest (chat: "Tell me a story about a cat and a ball") fixes parts of the cast

Every draw comes from one ``random.Random(seed)``, so a seed always gives the same text
(the module uses no global random state). A chat story is generated *from* its request:
the hero's kind, object, name, friend, place or plot are set by what the user asked for,
so the model can learn to follow it. This module knows nothing of tokenizers or training;
``training_document`` gives the exact text (with special tokens) a training row holds.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from training import lexicon as L
from training.story_schemas import ENDINGS, SCHEMAS

EOS, USER, ASSISTANT = "<|endoftext|>", "<|user|>", "<|assistant|>"

_MOOD = {
    "happy": "happy glad joyful cheerful delighted thrilled pleased merry".split(),
    "sad": "sad upset gloomy unhappy".split(),
    "scared": "scared afraid frightened nervous worried".split(),
    "lonely": ["lonely"], "tired": ["tired", "sleepy"], "bored": ["bored", "restless"], "sorry": ["sorry"],
    "proud": ["proud"], "shy": ["shy", "nervous"], "curious": ["curious"], "jealous": ["jealous"],
    "sick": ["sick"], "impatient": ["impatient", "restless"], "embarrassed": ["embarrassed", "silly"],
    "pretty": ["pretty", "beautiful", "lovely"], "shiny": ["shiny", "sparkly", "glittery"],
    "yummy": ["yummy", "delicious", "tasty"], "brave": ["brave", "bold"], "faded": ["faded", "shabby", "tattered"],
    "kindly": ["kindly", "gently", "warmly"], "carefully": ["carefully", "gently"], "shyly": ["shyly", "quietly", "softly"],
}
_GOOD_TRAITS = [t for t in L.TRAITS if t not in ("lazy", "careless", "naughty", "grumpy", "bossy", "messy", "stubborn", "clumsy")]
_SHELTERS = ("cave", "barn", "shed", "treehouse", "hollow log", "little hut", "big tent")
_DANGERS = ("pond", "river", "lake", "well", "road", "old bridge", "deep hole")
_STUCK = ("in a tree", "in a hole", "in the mud", "on a high rock", "in a bush", "behind a fence", "in a net")
_BIG = ("little", "small", "tiny", "young", "big")
_LANDMARKS = ("tree", "rock", "bush", "hedge", "log", "puddle", "boulder", "fence", "flower", "sunflower", "oak tree",
              "pine tree", "big stone", "old well", "haystack")
_PLANTS = ("flowers", "trees", "roses", "tulips", "daisies", "sunflowers", "lilies", "plants", "bushes", "ferns",
           "berries", "dandelions", "leaves", "clovers", "pinecones")
_BAKED = ("cake", "pie", "apple pie", "bread", "cookies", "muffins", "cupcakes", "pancakes", "carrot cake",
          "gingerbread", "cinnamon rolls", "banana bread")


@dataclass(frozen=True)
class Character:
    name: str
    kind: str        # "cat", "girl", ...
    female: bool

    @property
    def pronouns(self) -> tuple[str, str, str, str]:
        """(subject, object, possessive, reflexive)."""
        return ("she", "her", "her", "herself") if self.female else ("he", "him", "his", "himself")


@dataclass(frozen=True)
class StoryRequest:
    """What a chat prompt asks for; None leaves the choice to the generator."""
    kind: str | None = None          # hero kind: "cat", "girl"
    obj: str | None = None           # the hero's object: "ball"
    name: str | None = None          # hero name
    friend_kind: str | None = None   # "a cat and a dog": the dog is the friend
    place: str | None = None
    schema: str | None = None        # a plot theme ("who loses ...")
    text: str = ""                   # the user's message


@dataclass(frozen=True)
class Story:
    seed: int
    schema: str
    hero: Character
    friend: Character
    obj: str
    place: str
    text: str
    request: StoryRequest | None = None

    def document(self) -> str:
        """The exact training text: plain ``story<|endoftext|>`` or the chat-wrapped form."""
        if self.request is None:
            return self.text + EOS
        return f"{USER} {self.request.text} {ASSISTANT} {self.text}{EOS}"


def _character(rng: random.Random, kind: str | None = None, name: str | None = None, avoid: str = "") -> Character:
    if kind is None:
        kind = rng.choice(L.PEOPLE_KINDS) if rng.random() < 0.3 else rng.choice(L.ANIMALS)
    if name is not None:
        female = name in L.GIRL_NAMES or (name not in L.BOY_NAMES and rng.random() < 0.5)
    else:
        female = kind == "girl" or (kind != "boy" and rng.random() < 0.5)
        pool = L.GIRL_NAMES if female else L.BOY_NAMES
        name = rng.choice(pool)
        while name == avoid:
            name = rng.choice(pool)
    return Character(name, kind, female)


@dataclass
class _Cast:
    rng: random.Random
    hero: Character
    friend: Character
    obj: str
    place: str
    slots: dict[str, str] = field(default_factory=dict)

    def build(self) -> None:
        r, h, f = self.rng, self.hero, self.friend
        he, him, his, self_ = h.pronouns
        fhe, fhim, fhis, _ = f.pronouns
        animal = h.kind not in L.PEOPLE_KINDS
        obj2 = r.choice([t for t in L.TOYS if t != self.obj])
        food = r.choice(L.FOODS)
        parent = r.choice(L.PARENTS)
        baked = r.choice(_BAKED)
        s = {
            "H": h.name, "Hk": h.kind, "he": he, "He": he.capitalize(), "him": him, "his": his,
            "His": his.capitalize(), "self": self_,
            "F": f.name, "Fk": f.kind, "Fa": L.article(f"{r.choice(_BIG)} {f.kind}" if r.random() < 0.5 else f.kind),
            "fhe": fhe, "Fhe": fhe.capitalize(), "fhim": fhim, "fhis": fhis, "Fhis": fhis.capitalize(),
            "ftrait": r.choice(_GOOD_TRAITS), "fbody": r.choice(("paw", "nose", "wing", "tail"))
            if f.kind not in L.PEOPLE_KINDS else "finger",
            "P": parent,
            "O": self.obj, "Oadj": r.choice(L.QUALITIES), "Ocol": r.choice(L.COLORS),
            "O2": obj2, "O2adj": r.choice(L.QUALITIES),
            "PL": self.place, "pladj": r.choice(L.PLACE_ADJECTIVES), "shelter": r.choice(_SHELTERS),
            "danger": r.choice(_DANGERS), "stuck": r.choice(_STUCK),
            "FD": food, "FDa": L.article(food), "FDs": L.plural(food),
            "N1": r.choice(_LANDMARKS), "N2": r.choice(_LANDMARKS), "N1s": r.choice(_PLANTS),
            "A3": r.choice(L.ANIMALS), "Pn": parent.capitalize(), "baked": baked, "baked_a": L.article(baked),
            "A2": r.choice(L.ANIMALS), "A2name": r.choice(L.GIRL_NAMES + L.BOY_NAMES),
            "T2s": L.plural(r.choice(L.TOYS)),
            "time": r.choice(("morning", "afternoon", "evening", "day")), "time2": r.choice(("dinner", "the sun went down", "it got dark")),
            "weather": r.choice(L.WEATHER), "day": r.choice(L.WEEKDAYS), "num": r.choice(L.NUMBERS[1:9]),
            "col": r.choice(L.COLORS), "col2": r.choice(L.COLORS), "shape": r.choice(L.SHAPES),
            "smell": r.choice(L.SMELLS), "spot": r.choice(L.SPOTS), "spot2": r.choice(L.SPOTS),
            "cloth": r.choice(L.CLOTHES), "game": r.choice(L.GAMES), "trait": r.choice(_GOOD_TRAITS),
            "trait2": r.choice(L.TRAITS), "adv": r.choice(L.ADVERBS), "job": r.choice(L.JOBS),
            "hands": "paws" if animal else "hands", "body": r.choice(L.BODY) if animal else r.choice(("eyes", "hands", "feet")),
            "size": r.choice(L.SIZES), "act2": "",
        }
        act, acted = r.choice(L.ACTIVITIES)
        s.update(act=act, acted=acted, acting=L.ing(act))
        s["Oa"] = L.article(f"{s['Oadj']} {s['Ocol']} {self.obj}" if r.random() < 0.4 else f"{s['Oadj']} {self.obj}")
        s["O2a"] = L.article(f"{s['O2adj']} {obj2}")
        s["A2s"] = L.plural(s["A2"])
        s["fixer"] = f"{his} {parent}" if r.random() < 0.5 else f.name
        for slot, words in _MOOD.items():
            s[slot] = r.choice(words)
        self.slots = s

    def fill(self, template: str) -> str:
        text = template.format_map(self.slots)
        for i, ch in enumerate(text):
            if ch.isalpha():
                return text[:i] + ch.upper() + text[i + 1:]
        return text


_OPENINGS = (
    "Once upon a time, there was a {size} {Hk} named {H}.",
    "Once upon a time, in a {pladj} {PL}, there lived a {trait} {Hk} named {H}.",
    "There once was a {trait} little {Hk} called {H}.",
    "{H} was a {size} {Hk} who lived near the {PL}.",
    "Once there was a {Hk} named {H}. {He} was {trait} and {trait2}.",
    "In a {pladj} {PL} far away, there lived a {Hk}. {His} name was {H}.",
)
_DESCRIPTIONS = (
    "{He} was very {trait} and liked to {act}.",
    "{He} loved to {act} in the {PL} every {time}.",
    "{He} had {Oa} that {he} took everywhere.",
    "{His} favorite food was {FDs}.",
    "{He} had {col} {body} and a big smile.",
    "{He} wanted to be a {job} one day.",
    "Every {day}, {he} liked to play {game} with {his} friends.",
    "{He} always carried {his} {O} with {him}.",
)
_OBJECT_INTROS = (
    "{He} loved {his} {O} very much.",
    "{He} had a {O}, and {he} loved it.",
    "{He} loved {his} {O} more than anything.",
)
_AMBIENT = (
    "The sun was shining and the {N1s} were {col}.",
    "The air smelled like {smell}.",
    "A {col} {A3} {acted} by.",
    "The wind was soft and the sky was {weather}.",
    "Far away, a bird was singing.",
)
_REQUEST_FORMS = (
    "Tell me a story about {x}", "Tell me a story about {x}.", "Can you tell me a story about {x}?",
    "Please tell me a story about {x}.", "Write a story about {x}.", "Tell me a short story about {x}.",
    "I want a story about {x}.", "Tell me a bedtime story about {x}.", "Tell me a story about {x}!",
    "Could you write a short story about {x}?",
)
# Plot themes a request can name: "a cat who loses a ball" -> schema lost_and_found.
_THEMES = {
    "lost_and_found": "who loses {o}", "sharing": "who learns to share", "new_friend": "who makes a new friend",
    "fear_of_dark": "who is afraid of the dark", "treasure_hunt": "who finds a treasure",
    "lost_way": "who gets lost in the woods", "baking": "who bakes a cake", "planting": "who plants a seed",
    "race": "who runs a race", "dream_flight": "who dreams of flying", "helping_grandma": "who helps grandma",
    "learn_to_ride": "who learns to ride a bike", "snow_day": "who plays in the snow",
    "moving_house": "who moves to a new house", "broken_and_fixed": "whose {obj} breaks",
    "storm": "who is caught in a storm", "birthday_gift": "who makes a birthday gift",
}


def random_request(rng: random.Random) -> StoryRequest:
    """Draw what a user might ask for, and the message that asks it."""
    kind = rng.choice(L.PEOPLE_KINDS[:2]) if rng.random() < 0.25 else rng.choice(L.ANIMALS)
    obj = rng.choice(L.TOYS)
    a_kind, a_obj = L.article(kind), L.article(obj)
    form = rng.random()
    if form < 0.35:
        req = StoryRequest(kind=kind, obj=obj, text=f"{a_kind} and {a_obj}")
    elif form < 0.5:
        req = StoryRequest(kind=kind, text=a_kind)
    elif form < 0.6:
        req = StoryRequest(obj=obj, text=a_obj)
    elif form < 0.7:
        female = kind == "girl" or (kind != "boy" and rng.random() < 0.5)
        name = rng.choice(L.GIRL_NAMES if female else L.BOY_NAMES)
        req = StoryRequest(kind=kind, name=name, text=f"{a_kind} named {name}")
    elif form < 0.8:
        friend = rng.choice([a for a in L.ANIMALS if a != kind])
        req = StoryRequest(kind=kind, friend_kind=friend, text=f"{a_kind} and {L.article(friend)}")
    elif form < 0.87:
        place = rng.choice(L.PLACES)
        req = StoryRequest(kind=kind, place=place, text=f"{a_kind} in the {place}")
    else:
        schema = rng.choice(sorted(_THEMES))
        theme = _THEMES[schema].format(o=a_obj, obj=obj)
        has_obj = "{o}" in _THEMES[schema] or "{obj}" in _THEMES[schema]
        req = StoryRequest(kind=kind, obj=obj if has_obj else None, schema=schema, text=f"{a_kind} {theme}")
    return StoryRequest(**{**req.__dict__, "text": rng.choice(_REQUEST_FORMS).format(x=req.text)})


def generate_story(seed: int, request: StoryRequest | None = None) -> Story:
    """One story from ``seed``; with ``request`` the cast and plot follow it."""
    rng = random.Random(seed)
    req = request or StoryRequest()
    schema = req.schema or rng.choice(sorted(SCHEMAS))
    hero = _character(rng, req.kind, req.name)
    friend = _character(rng, req.friend_kind or (rng.choice(L.ANIMALS) if rng.random() < 0.7 else None), avoid=hero.name)
    obj = req.obj or rng.choice(L.TOYS)
    place = req.place or rng.choice(L.PLACES)
    cast = _Cast(rng, hero, friend, obj, place)
    cast.build()

    sentences = [cast.fill(rng.choice(_OPENINGS))]
    descriptions = list(_DESCRIPTIONS)
    rng.shuffle(descriptions)
    wanted = descriptions[:rng.randint(1, 3)]
    if req.obj:
        # A requested object is named right after the opening, the same way each time, so the
        # model learns to copy it from the request (the first training run, without this, did not).
        wanted = [t for t in wanted if "{O" not in t]
        wanted.insert(0, rng.choice(_OBJECT_INTROS))
    if req.place and not any("{PL}" in t for t in [*wanted, sentences[0]]):
        wanted.append("{He} loved to {act} in the {PL} every {time}.")
    if req.friend_kind:
        wanted.append(rng.choice(("{His} best friend was {Fa} named {F}.", "{He} had a friend, {Fa} named {F}.")))
    sentences += [cast.fill(t) for t in wanted]
    if hero.kind in L.SOUNDS and rng.random() < 0.3:
        sentences.append(cast.fill(f'"{L.SOUNDS[hero.kind].capitalize()}!" said {{H}} {{adv}}.'))
    paragraphs = [" ".join(sentences)]

    body: list[str] = []
    for beat in SCHEMAS[schema]:
        if isinstance(beat[0], float):
            if rng.random() > beat[0]:
                continue
            beat = beat[1:]
        body.append(cast.fill(rng.choice(beat)))
        if rng.random() < 0.06:
            ambient = cast.fill(rng.choice(_AMBIENT))
            if ambient not in body:
                body.append(ambient)
    cut = rng.randint(2, max(2, len(body) - 2)) if rng.random() < 0.6 else len(body)
    paragraphs += [" ".join(body[:cut]), " ".join(body[cut:])]
    ending = rng.choice(ENDINGS)
    if ending and rng.random() < 0.5:
        paragraphs[-1] = (paragraphs[-1] + " " + cast.fill(ending)).strip()
    text = "\n\n".join(p for p in paragraphs if p)
    return Story(seed, schema, hero, friend, obj, place, text, request)


def generate_chat_story(seed: int) -> Story:
    """A chat-wrapped story: a random request, then a story that follows it."""
    rng = random.Random(seed ^ 0x5EED)
    request = random_request(rng)
    return generate_story(seed, request)


def training_document(seed: int, chat_fraction: float = 0.3) -> str:
    """The text of training document ``seed``: chat-wrapped with probability ``chat_fraction``."""
    chat = random.Random(seed * 7919 + 1).random() < chat_fraction
    return (generate_chat_story(seed) if chat else generate_story(seed)).document()


def request_from_text(text: str) -> StoryRequest:
    """Parse "Tell me a story about a cat and a ball" the way the generator writes requests
    (used by tests and the model card to check that a sample follows its prompt)."""
    import re
    m = re.search(r"about (?:an? )?([a-z ]+?) and (?:an? )?([a-z -]+?)[.?!]*$", text.strip())
    if m:
        first, second = m.group(1), m.group(2)
        if second in L.ANIMALS:
            return StoryRequest(kind=first, friend_kind=second, text=text)
        return StoryRequest(kind=first, obj=second, text=text)
    m = re.search(r"about (?:an? )?([a-z -]+?)[.?!]*$", text.strip())
    if m and m.group(1) in L.ANIMALS + L.PEOPLE_KINDS:
        return StoryRequest(kind=m.group(1), text=text)
    if m and m.group(1) in L.TOYS:
        return StoryRequest(obj=m.group(1), text=text)
    return StoryRequest(text=text)
