"""The mechanism task: a built-in task where what the reward wants is in the retrieved exemplars only.

Owns: the task's topics, code words and client-message templates, a world (a seeded topic -> code
word table), its dialogue states, its exemplar chunks, the two-stage SFT demonstrations and the rule
``mechanism_reward`` (registered with ``reward_server.rules`` as ``mechanism:WORLD[/TRAIN]`` on import).
README.md beside this file says why.

A state is one client turn naming a topic. Each exemplar chunk of a world pairs one topic with that
world's code word. The reward pays 1 when the final response holds the state's topic's code word of
the reward's world and no other code word (listing every code earns nothing). The retriever's query
is the draft's response text (paper eq. 8), so the right exemplar comes back only when the draft names
the topic. Valid and test use other message templates and other worlds, each a derangement of the
train world: a policy that memorised the train table scores 0 there; only reading the exemplar pays.
Not in the paper: the paper has no task with a known optimum.
"""

from __future__ import annotations

import random
import re

from escrag.data import DialogueState
from escrag.errors import UserError
from escrag.formats import compose
from escrag.prompts import chunk_text
from reward_server import rules

TOPICS = ("exam", "landlord", "sister", "garden", "debt", "wedding", "boss", "dog", "move", "surgery",
          "car", "neighbour")
# One token each (with a leading space) in SmolLM2's tokenizer: copying one is attending to one
# token. Made-up words of 2-4 tokens were not copied by the tiny SFT start (results/README.md).
CODES = ("apple", "river", "candle", "tiger", "violin", "marble", "anchor", "comet", "pepper", "maple",
         "falcon", "copper", "lantern", "meadow", "harbor", "velvet")
TEMPLATES = {
    "train": ("I can't stop worrying about my {t}.", "My {t} has been weighing on me lately.",
              "Everything about my {t} makes me anxious.", "I feel lost when I think about my {t}.",
              "Can we talk about my {t}? It upsets me."),
    "valid": ("Honestly my {t} keeps me up at night.", "I am so stressed about my {t}."),
    "test": ("It is my {t} again, I feel awful.", "I keep crying because of my {t}.",
             "Nobody understands how hard my {t} is for me.", "My {t} is all I can think about."),
}
GENERIC_DRAFT = ("The client is upset.", "Tell me more about how you feel.")
_WORDS = re.compile(r"[a-z]+")


def world(seed: int, avoid: dict[str, str] | None = None) -> dict[str, str]:
    """A seeded topic -> code table (distinct codes); with ``avoid``, no topic keeps ``avoid``'s code."""
    rng = random.Random(f"mechanism/{seed}")
    while True:
        table = dict(zip(TOPICS, rng.sample(CODES, len(TOPICS))))
        if not avoid or all(table[t] != avoid[t] for t in TOPICS):
            return table


def worlds(mc) -> dict[str, dict[str, str]]:
    """The train, valid and test tables of a ``MechanismConfig``."""
    train = world(mc.train_world)
    return {"train": train, "valid": world(mc.valid_world, train), "test": world(mc.test_world, train)}


def shuffled(table: dict[str, str], seed: int) -> dict[str, str]:
    """The control's index table: every topic shows another topic's code (a derangement of ``table``)."""
    rng, topics = random.Random(f"mechanism-shuffle/{seed}"), list(TOPICS)
    while True:
        order = rng.sample(topics, len(topics))
        if all(a != b for a, b in zip(topics, order)):
            return {a: table[b] for a, b in zip(topics, order)}


def topic_of(history: list[dict]) -> str | None:
    """The topic the client's last turn names (None when it names none)."""
    said = words(history[-1]["content"]) if history else set()
    return next((t for t in TOPICS if t in said), None)


def states(split: str, n: int | None = None, seed: int = 0) -> list[DialogueState]:
    """The split's states: every topic x the split's templates, then a seeded sample of ``n``."""
    rows = [DialogueState(f"mech-{split}-{t}-{i}", 0, [{"role": "user", "content": tpl.format(t=t)}], problem=t)
            for t in TOPICS for i, tpl in enumerate(TEMPLATES[split])]
    return random.Random(f"{seed}/{split}").sample(rows, n) if n and n < len(rows) else rows


def chunks(table: dict[str, str], name: str) -> list[dict]:
    """One exemplar chunk per topic, carrying that topic's code word in ``table``."""
    out = []
    for t in TOPICS:
        history = f"Client: I am worried about my {t}."
        response = f"About your {t}: hold on to the word {table[t]}."
        out.append({"id": f"{name}-{t}", "dialogue_id": f"{name}-{t}", "history": history, "response": response,
                    "strategies": [], "stage": "", "problem": "", "emotion": "", "text": chunk_text(history, response)})  # no labels: the prompt shows none
    return out


def draft(topic: str | None, code: str | None) -> str:
    """A stage-1 output: names ``topic`` (None: generic), ends with ``code`` when given."""
    think, response = (f"The client worries about the {topic}.", f"Tell me more about your {topic}.") \
        if topic else GENERIC_DRAFT
    return compose(think, f"{response} {code}." if code else response)


def final(topic: str, exemplar_code: str) -> str:
    """A stage-2 output that copies the code word of the first exemplar."""
    return compose(f"Exemplar 1 gives the word {exemplar_code}.", f"I hear you about your {topic}. {exemplar_code}.")


def words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def codes_in(text: str) -> set[str]:
    return words(text) & set(CODES)


def mechanism_reward(table: dict[str, str], history: list[dict], text: str) -> float:
    """1.0 when ``text`` holds the code of the state's topic in ``table`` and no other code, else 0.0."""
    topic = topic_of(history)
    return float(topic is not None and codes_in(text) == {table[topic]})


def make_mechanism(arg: str | None) -> rules.Rule:
    """``mechanism:WORLD[/TRAIN]``: 1 when the response holds the code word of the client's topic in
    world WORLD of the mechanism task (``world``; with TRAIN, the derangement of world
    TRAIN that valid and test use) and no other code word, else 0."""
    try:
        seeds = [int(x) for x in (arg or "").split("/")]
    except ValueError:
        seeds = []
    if len(seeds) not in (1, 2):
        raise UserError(f"mechanism rule needs a world seed, as in mechanism:1 or mechanism:3/1 (got {arg!r})")
    table = world(seeds[0], world(seeds[1]) if len(seeds) == 2 else None)
    return lambda history, text: mechanism_reward(table, history, text)


rules.register("mechanism", make_mechanism)
