"""The story generator's vocabulary, grouped by the role a word can play in a sentence.

Every list is plain words in one string so the lexicon reads like a word list, not code.
Groups are chosen so any member fits the templates that use the group ("played with the
<TOY>", "felt <FEELING>", "went to the <PLACE>"), which is what keeps generated sentences
grammatical. ``all_words()`` is the lexicon the issue counts (>= 2,000 distinct words).
"""
from __future__ import annotations

import re


def _words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(text.split()))


def _pairs(text: str) -> tuple[tuple[str, str], ...]:
    """``"base/past base/past ..."`` -> ((base, past), ...)."""
    return tuple(tuple(p.split("/")) for p in dict.fromkeys(text.split()))  # type: ignore[misc]


GIRL_NAMES = _words("""
Lily Mia Emma Sue Anna Lucy Sara Zoe Amy Ella Ava Chloe Grace Ruby Rosie Daisy Molly Sophie Kate Jane
Ivy Lola Nora Hannah Alice Clara Maya Eva Julia Tara Nina Lena Rita Sally Poppy Holly Hazel Iris Jenny
Kim Lisa Mary Olive Pearl Penny Rose Stella Tina Wendy Abby Bella Cora Dora Elsie Fiona Gina Hope Jade
Kara Leah Mira Nell Opal Paula Quinn Rachel Sadie Tess Una Vera Willa Yara Zara Beth Cindy Dana Erin
Faye Gwen Heidi Isla Joy June Kitty Luna Mabel Nadia Freya Greta Ada Bea Amber Flora Maisie Ellie
Millie Ruth Meg Becky Lottie Naomi Carla Dina Emily Lara
""")
BOY_NAMES = _words("""
Tom Ben Max Sam Jack Leo Tim Joe Dan Finn Jake Luke Mark Noah Owen Paul Ryan Theo Will Adam Alex Bob
Carl Dave Eli Fred Gus Hank Ian Jim Kai Liam Matt Ned Oscar Pete Ray Seth Ted Vic Zack Andy Billy
Chris Danny Eddie Frank George Harry Henry Jamie Jason Kevin Larry Mike Nick Ollie Percy Rex Rudy
Simon Toby Ollie Victor Walter Arlo Bruno Caleb Dexter Ezra Felix Gabe Hugo Jasper Kit Louis Miles
Nate Otto Quentin Rocco Spencer Timmy Ugo Wes Yusuf Zane Albert Barney Cody Dylan Elliot Archie Ethan
Jonah Lenny Mason Reggie Ronnie Stanley Teddy Rufus Oliver Peter
""")
# Animals a story can star: each works as "a little <ANIMAL> named Tom".
ANIMALS = _words("""
cat dog rabbit bear fox bird mouse duck frog owl pig horse cow lion tiger elephant monkey turtle fish
squirrel hedgehog deer wolf goat sheep lamb chick hen goose swan parrot penguin seal whale dolphin
octopus crab snail ant bee butterfly ladybug spider worm beaver otter raccoon badger mole bat kitten
puppy bunny pony donkey camel giraffe zebra hippo rhino kangaroo koala panda sloth gorilla crocodile
lizard snake dragonfly moth firefly robin sparrow crow pigeon eagle hawk peacock flamingo stork
chipmunk hamster gerbil ferret llama yak moose elk buffalo cricket grasshopper caterpillar beetle
tadpole toad newt shark starfish jellyfish seahorse lobster walrus polar_bear calf piglet foal duckling
""")
# Human heroes: "a little <PERSON> named Tom" (gender comes from the name).
PEOPLE_KINDS = _words("girl boy child kid")
# Grown-ups and helpers who appear in stories; "the <HELPER>".
HELPERS = _words("""
teacher baker farmer doctor nurse fireman policeman mailman gardener fisherman sailor pilot driver
cook painter builder king queen prince princess wizard fairy giant knight pirate shopkeeper librarian
neighbor grandpa grandma uncle aunt mom dad
""")
PARENTS = ("mom", "dad", "grandma", "grandpa")
# Things a hero can own, carry, lose, share and play with: "his red <TOY>".
TOYS = _words("""
ball kite doll car truck train boat plane robot teddy drum whistle yo-yo top puzzle crayon book hat
box bucket shovel balloon bike wagon scooter sled block marble rope ribbon bell flute guitar piano
trumpet harmonica tambourine rattle puppet mask crown wand sword shield cape scarf mitten sock shoe
boot umbrella basket bag backpack lunchbox bottle cup bowl spoon plate jar lamp lantern flashlight
clock watch key coin button bead necklace bracelet ring brush comb mirror pillow blanket quilt rug
chair stool ladder bench swing slide tent flag map compass telescope camera radio phone letter
postcard card sticker stamp pencil pen marker paintbrush notebook journal diary album picture
painting drawing poster shell pebble stone feather leaf acorn pinecone flower seed stick twig
nest egg bone net fishing_rod jump_rope hula_hoop skateboard helmet glove whistle bubble_wand
paper_boat paper_plane toy_car toy_train rocking_horse dollhouse spinning_top sandcastle snowman
cookie_jar music_box treasure_chest magic_lamp gift present parcel envelope kettle teapot basket
pot pan rolling_pin apron glasses badge medal trophy bow arrow drumstick jigsaw chalk slate
marble_bag beach_ball soccer_ball basketball football baseball bat racket frisbee skipping_rope
""")
FOODS = _words("""
apple banana orange pear grape cherry plum peach lemon melon strawberry blueberry raspberry carrot
pea bean corn potato tomato pumpkin cabbage lettuce onion mushroom cookie cake pie muffin cupcake
bread toast sandwich pizza soup stew rice noodle pancake waffle egg cheese butter honey jam jelly
candy lollipop chocolate ice_cream popcorn pretzel cracker cereal milk juice tea lemonade nut acorn
seed berry carrot_cake pudding yogurt donut bagel biscuit sausage fish_stick salad taco burrito
dumpling bun roll pickle olive apricot mango pineapple coconut kiwi fig date walnut peanut almond
cinnamon_roll gingerbread marshmallow caramel fudge
""")
# "to the <PLACE>", "in the <PLACE>".
PLACES = _words("""
park forest garden beach pond lake river meadow field farm barn hill mountain valley cave castle
village town city school library zoo market shop bakery kitchen playground yard backyard attic
basement house cottage cabin island harbor dock bridge tower lighthouse jungle desert swamp orchard
vineyard museum circus fair station airport street road path trail camp tent hut den nest burrow
hollow glade clearing woods seaside shore cliff waterfall spring stream canyon volcano pier marina
greenhouse stable shed workshop classroom playroom bedroom bathroom treehouse igloo palace
""")
NATURE = _words("""
tree flower leaf grass rock stone cloud rain snow wind sun moon star sky rainbow puddle mud sand
wave shell branch log bush hedge vine root petal thorn rose daisy tulip lily sunflower dandelion
clover moss fern weed pebble boulder hill breeze storm thunder lightning fog mist frost ice icicle
dew sunrise sunset shadow light dark night morning evening afternoon noon dawn dusk spring summer
autumn winter season sea ocean water fire smoke ash dust bark trunk acorn pinecone berry bloom bud
""")
COLORS = _words("""
red blue green yellow orange purple pink brown black white gray golden silver gold violet turquoise
crimson scarlet beige tan maroon navy teal lavender cream
""")
SIZES = _words("big small little tiny huge giant tall short long round fat thin wide narrow short")
# Adjectives that fit any toy or object: "a <QUALITY> ball".
QUALITIES = _words("""
shiny soft fluffy smooth rough bumpy sparkly glittery bright dull old new clean dirty wet dry warm
cold heavy light pretty beautiful lovely ugly funny strange special magic secret favorite colorful
striped spotted fuzzy furry silky sticky squishy bouncy wobbly broken shabby fancy plain simple
wooden plastic metal glass paper woolen velvet golden painted dusty muddy sandy rusty squeaky noisy
quiet gentle precious rare odd curious lucky famous mysterious delicate sturdy crooked straight
tangled twisty spiky lumpy hollow empty full loud brand-new tattered patched faded glowing glossy
""")
FEELINGS = _words("""
happy sad glad angry mad scared afraid worried excited proud shy sorry lonely bored tired sleepy
hungry thirsty grumpy cheerful calm nervous surprised amazed curious jealous brave thankful grateful
upset silly confused hopeful joyful merry cross gloomy anxious relieved pleased delighted thrilled
frightened puzzled embarrassed disappointed content eager impatient restless cozy safe sick
""")
TRAITS = _words("""
kind brave clever smart gentle friendly helpful polite honest funny silly shy curious playful busy
lazy careful careless quick slow strong wise patient generous loving caring cheerful bold quiet
noisy naughty good sweet grumpy bossy messy neat tidy proud humble adventurous cautious creative
clumsy graceful hardworking stubborn thoughtful fair loyal trusty cheeky chatty dreamy sleepy
""")
# Things heroes like to do, intransitive, as base/past: "liked to <DO>", "<DID> all day".
ACTIVITIES = _pairs("""
run/ran jump/jumped play/played sing/sang dance/danced swim/swam climb/climbed skip/skipped hop/hopped
draw/drew paint/painted read/read write/wrote build/built dig/dug fly/flew ride/rode race/raced
explore/explored laugh/laughed giggle/giggled whistle/whistled hum/hummed twirl/twirled spin/spun
roll/rolled slide/slid splash/splashed paddle/paddled bake/baked cook/cooked garden/gardened
fish/fished hike/hiked camp/camped skate/skated ski/skied sled/sledded bounce/bounced wiggle/wiggled
wander/wandered stroll/strolled march/marched tiptoe/tiptoed crawl/crawled waddle/waddled
gallop/galloped trot/trotted leap/leaped dive/dove float/floated drift/drifted sail/sailed
rest/rested nap/napped dream/dreamed snooze/snoozed chat/chatted talk/talked shout/shouted
count/counted clap/clapped stomp/stomped drum/drummed knit/knitted sew/sewed rhyme/rhymed
""")
# Transitive verbs done to an object: "<VERB>ed the <TOY>".
ACTIONS = _pairs("""
find/found lose/lost hold/held carry/carried throw/threw catch/caught kick/kicked push/pushed
pull/pulled drop/dropped hide/hid share/shared fix/fixed wash/washed paint/painted hug/hugged
clean/cleaned open/opened close/closed fill/filled empty/emptied wrap/wrapped unwrap/unwrapped
shake/shook toss/tossed grab/grabbed lift/lifted hang/hung fold/folded stack/stacked drag/dragged
polish/polished mend/mended decorate/decorated squeeze/squeezed tap/tapped sniff/sniffed
""")
ADVERBS = _words("""
quickly slowly softly loudly happily sadly gently carefully quietly proudly bravely kindly slowly
suddenly finally slowly eagerly shyly sleepily angrily calmly brightly warmly politely patiently
gladly sweetly merrily nervously curiously excitedly cheerfully wisely boldly silently swiftly
""")
# Animal -> the sound it makes (others use "said").
SOUNDS = {
    "cat": "meow", "kitten": "mew", "dog": "woof", "puppy": "yip", "cow": "moo", "calf": "moo",
    "duck": "quack", "duckling": "peep", "pig": "oink", "piglet": "oink", "sheep": "baa", "lamb": "baa",
    "goat": "maa", "horse": "neigh", "pony": "neigh", "foal": "neigh", "donkey": "hee-haw",
    "owl": "hoot", "frog": "ribbit", "toad": "croak", "bird": "tweet", "robin": "chirp",
    "sparrow": "cheep", "chick": "cheep", "hen": "cluck", "goose": "honk", "lion": "roar",
    "tiger": "growl", "bear": "grr", "wolf": "howl", "mouse": "squeak", "bee": "buzz", "snake": "hiss",
    "crow": "caw", "pigeon": "coo", "monkey": "ooh-ooh", "seal": "ark", "elephant": "toot",
}
CLOTHES = _words("""
dress shirt coat jacket sweater skirt pants shorts jeans cap bonnet hood raincoat pajamas slippers
sandals sneakers boots vest belt tie bowtie gloves mittens socks earmuffs costume uniform overalls
tutu cloak hoodie cardigan apron tights leggings poncho shawl
""")
# Spots in and around a house where things hide: "under the <SPOT>", "behind the <SPOT>".
SPOTS = _words("""
bed table sofa couch desk shelf closet cupboard drawer rug curtain door window stairs chimney
fireplace fence gate wall porch step mailbox doghouse flowerpot wheelbarrow woodpile haystack bush
log bookcase dresser wardrobe armchair cushion bathtub sink stove oven fridge doormat hedge shed
""")
PLACE_ADJECTIVES = _words("""
quiet sunny shady busy crowded peaceful enormous ancient hidden deep dark misty leafy grassy rocky
snowy dusty cozy warm cool green wild sleepy magical noisy windy muddy bright lovely still calm
""")
GAMES = _words("""
hide-and-seek tag catch chess checkers dominoes marbles hopscotch leapfrog charades dress-up
pretend house school treasure-hunt peekaboo puzzles cards jacks tic-tac-toe
""")
JOBS = _words("""
astronaut doctor teacher chef dancer singer painter pilot farmer vet firefighter scientist inventor
explorer sailor artist writer baker builder zookeeper gardener clown magician detective
""")
SHAPES = _words("circle square triangle star heart diamond oval crescent spiral zigzag")
SMELLS = _words("""
roses pine smoke rain soap cookies bread cinnamon lemons grass mint vanilla oranges honey popcorn
""")
CONTAINERS = _words("box basket bag drawer jar chest bucket pocket backpack cupboard")
WEATHER = _words("sunny rainy windy snowy cloudy foggy stormy chilly warm hot cold bright gray misty")
TIMES = _words("morning afternoon evening night day weekend holiday birthday")
WEEKDAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
NUMBERS = _words("one two three four five six seven eight nine ten eleven twelve twenty hundred")
BODY = _words("nose ears tail paws feet hands eyes whiskers wings fur feathers head tummy knees")
# Glue and story words the templates use, listed so the lexicon count is honest.
STORY_WORDS = _words("""
once upon a time there was an the named who lived in on at with and but so then one day after that
because when while until after before soon later next suddenly finally all everyone someone nobody
something nothing everything anything friend friends family together alone home away back again
very too really almost always never sometimes often every each both other another same different
said asked replied shouted whispered cried laughed smiled nodded frowned sighed gasped yelled called
answered agreed promised thought wondered knew wanted needed liked loved hoped wished tried looked
saw heard felt went came ran walked took gave made got put told showed helped looked found began
started stopped kept left stayed waited watched listened learned remembered forgot decided noticed
big little many much more most some few lot lots best better good bad great nice fun new old first
last next yes no please thank thanks sorry hello goodbye oh wow look come let us we you they them
their our my your his her its he she it i me him am is are was were be been being have has had do
does did can could will would should shall may might must not dont cant wont didnt couldnt isnt
of to from into onto over under above below behind beside between near far inside outside up down
around through across along past toward about like as than if what where why how which this that
these those here now just only even still also yet ever
lesson moral heart idea plan secret surprise wish dream problem answer reason trouble adventure
game story song party picnic race trip journey visit walk ride present gift prize treasure map
end happily ever loud quiet fast slow high low hard easy open closed safe full hungry
""")


def _expand(words: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(w.replace("_", " ") for w in words)


def article(noun_phrase: str) -> str:
    """'a ball', 'an apple', 'an old ball' — by the first letter of the phrase."""
    return ("an " if noun_phrase[:1].lower() in "aeiou" else "a ") + noun_phrase


_ING_EXCEPTIONS = {"lie": "lying", "die": "dying", "ski": "skiing", "see": "seeing", "be": "being"}
_DOUBLE_FINAL = set("run swim hop skip dig nap chat clap stomp drum spin trot tap drop grab sled hug".split())


def ing(base: str) -> str:
    """Present participle of a base verb: run -> running, dance -> dancing, play -> playing."""
    if base in _ING_EXCEPTIONS:
        return _ING_EXCEPTIONS[base]
    if base in _DOUBLE_FINAL and base not in ("stomp",):
        return base + base[-1] + "ing"
    if base.endswith("e") and not base.endswith(("ee", "ye", "oe")):
        return base[:-1] + "ing"
    return base + "ing"


_PLURAL_SAME = set("sheep fish deer moose elk buffalo yak bison corn rice juice milk tea honey jam jelly "
                   "butter cheese cereal bread sand mud grass snow rain fog mist frost ice dew dust smoke "
                   "ash fire water light dark night popcorn lemonade chocolate candy soup stew fudge caramel "
                   "moss bark thunder lightning".split())
_PLURAL_IRREGULAR = {"mouse": "mice", "goose": "geese", "leaf": "leaves", "wolf": "wolves", "calf": "calves",
                     "knife": "knives", "child": "children", "person": "people", "foot": "feet", "tooth": "teeth",
                     "shelf": "shelves", "loaf": "loaves", "octopus": "octopuses", "cactus": "cacti",
                     "scarf": "scarves", "hoof": "hooves"}


def plural(noun: str) -> str:
    """Plural of a (possibly two-word) noun: the last word takes the ending."""
    *head, last = noun.split(" ")
    if last in _PLURAL_SAME:
        out = last
    elif last in _PLURAL_IRREGULAR:
        out = _PLURAL_IRREGULAR[last]
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        out = last + "es"
    elif last.endswith("y") and last[-2:-1] not in tuple("aeiou"):
        out = last[:-1] + "ies"
    elif last.endswith("o") and last in ("potato", "tomato", "mango", "hero"):
        out = last + "es"
    else:
        out = last + "s"
    return " ".join(head + [out])


def all_words() -> set[str]:
    """Every distinct lower-case word the generator can emit from its lists."""
    groups = [GIRL_NAMES, BOY_NAMES, ANIMALS, PEOPLE_KINDS, HELPERS, TOYS, FOODS, PLACES, NATURE, COLORS,
              SIZES, QUALITIES, FEELINGS, TRAITS, ADVERBS, CONTAINERS, WEATHER, TIMES, WEEKDAYS, NUMBERS, BODY,
              STORY_WORDS, tuple(SOUNDS.values()), CLOTHES, SPOTS, PLACE_ADJECTIVES, GAMES, JOBS, SHAPES,
              SMELLS, tuple(plural(n) for n in NATURE + ANIMALS + TOYS + FOODS)]
    words = set()
    for group in groups:
        for phrase in group:
            words.update(re.findall(r"[a-z'-]+", phrase.lower().replace("_", " ")))
    for pairs in (ACTIVITIES, ACTIONS):
        for base, past in pairs:
            words.update((base, past, ing(base)))
    return words


# Public, space-separated forms the generator uses.
ANIMALS = _expand(ANIMALS)
TOYS = _expand(TOYS)
FOODS = _expand(FOODS)
