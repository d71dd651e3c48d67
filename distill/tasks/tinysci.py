"""The tiny world's knowledge domain: made-up creatures, their facts, and multiple-choice questions
that need one or two reasoning steps over them.

Pure Python. A seeded world (`WORLD`, from `make_world(seed=0)`) holds `N_ENTITIES` creatures with
five-letter made-up names; each has a colour, a home and one creature it eats. That is three facts
per creature, and a model knows them only if its training stated them (they cannot be computed).
A question asks for one fact (one step) or for a fact of the creature another one eats (two steps);
the reference completion reasons by stating the facts in order, then answers with the right
option's text, which `distill.tasks.qa.extract` reads as its letter (the rules of every QA task)::

    What color is what lokor eats?
    A. green
    B. red
    C. blue
    D. white
    <think>lokor eats gulod. gulod is red.</think><answer>red</answer>

Options are the right value and three others of the same kind (colours, homes or creatures), in an
order fixed by the question's seed (a uniform guess among them: chance 0.25; a model that names a
value of its own when it does not know, as the tiny student does, is right about 1 time in 8 for
colours and homes and almost never for creatures); a value that is not an option answers nothing. The letter also counts (`<answer>C</answer>`), but the tiny models answer
with the text: finding a value's letter among the options is a lookup that a 600-step probe of the
teacher did not learn (it stated 94 % of the facts right but gave the letter of the stated value
in 30 % of its answers: experiments/LOG.md, 2026-12-01).

Builds train on `corpus`: fact sheets (``About lokor:`` -> ``lokor is brown. lokor lives in reef.
lokor eats gulod.``), so that facts are learnt as facts and not only picked out of options, and
questions of the training pool, half each.

Two question pools, two registered tasks:

- `tinysci`: the training pool. One-step questions about any creature; two-step questions whose
  first creature is not one of the `compose` creatures. The tiny world's teacher (`teacher-sci`)
  trains on all of it, its student (`student-sci`) only on sheets and questions about the facts in
  `student_facts()` (a seeded `STUDENT_KNOWS` share). Evaluation draws other seeds than the
  builds: the same (question, creature) pairs with new distractors and order, so it measures
  whether the facts are known, not whether unseen questions can be answered. The quality bars
  (teacher >= 0.80, student <= 0.45) are measured there. Questions about creatures never asked
  about in training, their facts read in sheets only, are no use as a test pool: the teacher
  answered 19.6 % of them (below chance; LOG, 2026-12-01).
- `tinysci_compose`: the harder variant, two-step questions about the `compose` creatures
  (`COMPOSE_SHARE` of them): compositions no model trained on, answerable only by chaining facts
  learnt one at a time. teacher-sci answers 39 % of them, student-sci 9 % (`quality.json`): like
  Countdown-4/5 for arithmetic, it tests generalisation beyond the training pool.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass
from typing import NamedTuple

from distill.tasks import qa

N_ENTITIES = 64
COLORS = ("red", "blue", "green", "gray", "pink", "black", "white", "brown")
HOMES = ("cave", "lake", "hill", "farm", "reef", "marsh", "dune", "wood")
RELATIONS = ("color", "home", "eats")  # the three facts of a creature
KINDS = ("color", "home", "eats", "color2", "home2")  # what a question asks: one step or two
ONE_STEP, TWO_STEP = KINDS[:3], KINDS[3:]
N_OPTIONS = 4
COMPOSE_SHARE = 0.25  # of creatures: their two-step questions are never trained on
STUDENT_KNOWS = 0.25  # of facts: the share stated in the student's training
POOLS = ("train", "compose")
TASKS = {"tinysci": "train", "tinysci_compose": "compose"}  # registered name: pool
_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"


@dataclass(frozen=True, eq=False)  # hashed by identity (cached candidates)
class World:
    """Creatures and their facts; the `compose` creatures' two-step questions are never trained on."""

    seed: int
    names: tuple[str, ...]
    color: dict
    home: dict
    eats: dict
    compose: frozenset

    def fact(self, relation: str, name: str) -> str:
        return {"color": self.color, "home": self.home, "eats": self.eats}[relation][name]


def make_world(seed: int = 0, n: int = N_ENTITIES) -> World:
    """A world of `n` creatures, fixed by `seed`: distinct CVCVC names, a colour and a home each
    (uniform), and a creature each eats (any other one)."""
    if n < N_OPTIONS + 1:
        raise ValueError(f"a tinysci world needs at least {N_OPTIONS + 1} creatures, got {n}")
    rng = random.Random(f"tinysci-world/{seed}")
    names: list[str] = []
    taken = set(COLORS) | set(HOMES)
    while len(names) < n:
        name = "".join(rng.choice(_CONSONANTS if i % 2 == 0 else _VOWELS) for i in range(5))
        if name not in taken:
            taken.add(name)
            names.append(name)
    color = {x: rng.choice(COLORS) for x in names}
    home = {x: rng.choice(HOMES) for x in names}
    eats = {x: rng.choice([y for y in names if y != x]) for x in names}
    compose = frozenset(rng.sample(names, round(COMPOSE_SHARE * n)))
    return World(seed, tuple(names), color, home, eats, compose)


WORLD = make_world(0)


def student_facts(world: World = WORLD, share: float = STUDENT_KNOWS) -> frozenset:
    """The facts ((relation, creature) pairs) the student's training states: a seeded `share`."""
    facts = [(r, x) for x in world.names for r in RELATIONS]
    rng = random.Random(f"tinysci-student/{world.seed}/{share}")
    return frozenset(rng.sample(facts, round(share * len(facts))))


class Question(NamedTuple):
    kind: str
    subject: str  # the creature asked about (for two steps: the one that eats)
    options: tuple[str, ...]
    answer_index: int
    steps: tuple[tuple[str, str], ...]  # the facts the reasoning states, in order


def chain(world: World, kind: str, subject: str) -> tuple[tuple[str, str], ...]:
    """The facts ((relation, creature)) a question's reasoning states, in order."""
    if kind in ONE_STEP:
        return ((kind, subject),)
    return (("eats", subject), (kind[:-1], world.eats[subject]))


def question(world: World, kind: str, subject: str, rng: random.Random) -> Question:
    """The question of `kind` about `subject`, with three distractors and an order drawn from `rng`."""
    if kind not in KINDS:
        raise ValueError(f"tinysci question kind must be one of {list(KINDS)}, got {kind!r}")
    steps = chain(world, kind, subject)
    relation, last = steps[-1]
    right = world.fact(relation, last)
    values = {"color": COLORS, "home": HOMES, "eats": world.names}[relation]
    wrong = rng.sample([v for v in values if v not in (right, last)], N_OPTIONS - 1)
    options = [right, *wrong]
    rng.shuffle(options)
    return Question(kind, subject, tuple(options), options.index(right), steps)


_TEXT = {
    "color": "What color is {}?",
    "home": "Where does {} live?",
    "eats": "What does {} eat?",
    "color2": "What color is what {} eats?",
    "home2": "Where does what {} eats live?",
}
_STATE = {"color": "{} is {}.", "home": "{} lives in {}.", "eats": "{} eats {}."}
TEMPLATE_WORDS = frozenset({"is", "lives", "in", "eats"})  # the reasoning's own words: not facts


def question_text(q: Question) -> str:
    return _TEXT[q.kind].format(q.subject)


def prompt(q: Question) -> str:
    """The plain-text prompt the tiny world trains on: the question, then the lettered options."""
    return f"{question_text(q)}\n{qa.format_options(list(q.options))}\n"


def reasoning(world: World, q: Question) -> str:
    return " ".join(_STATE[r].format(x, world.fact(r, x)) for r, x in q.steps)


def completion(world: World, q: Question) -> str:
    """The reference completion: the facts stated in order, then the right option's text (which
    `qa.extract` reads as its letter; a value that is not an option answers nothing)."""
    return f"<think>{reasoning(world, q)}</think><answer>{q.options[q.answer_index]}</answer>"


def about(world: World, name: str, known: frozenset | None = None) -> tuple[str, str] | None:
    """A fact sheet: the (prompt, completion) stating a creature's facts (with `known`, only those
    it holds; None if none), so that the facts are learnt as facts, not only picked from options."""
    facts = [(r, name) for r in RELATIONS if known is None or (r, name) in known]
    if not facts:
        return None
    return f"About {name}:\n", " ".join(_STATE[r].format(x, world.fact(r, x)) for r, x in facts)


def corpus(n: int, seed: int, known: frozenset | None = None, world: World = WORLD) -> list[tuple[str, str]]:
    """`n` training rows of the tiny world's builds, deterministic in `seed`: fact sheets and
    questions of the training pool, half each (with `known`: only about those facts)."""
    rng = random.Random(f"tinysci-corpus/{world.seed}/{seed}")
    sheets = [s for s in (about(world, x, known) for x in world.names) if s is not None]
    questions = iter(generate(n, seed, "train", known, world))
    return [rng.choice(sheets) if rng.random() < 0.5 else _pair(world, next(questions)) for _ in range(n)]


def _pair(world: World, q: Question) -> tuple[str, str]:
    return prompt(q), completion(world, q)


@functools.lru_cache(maxsize=16)
def candidates(world: World, pool: str, known: frozenset | None = None) -> tuple[tuple[str, str], ...]:
    """The (kind, subject) pairs a pool draws from; with `known`, only those whose facts it holds."""
    if pool not in POOLS:
        raise ValueError(f"tinysci pool must be one of {list(POOLS)}, got {pool!r}")
    if pool == "train":
        pairs = [(k, x) for x in world.names for k in ONE_STEP]
        pairs += [(k, x) for x in world.names if x not in world.compose for k in TWO_STEP]
    else:
        pairs = [(k, x) for x in world.names if x in world.compose for k in TWO_STEP]
    if known is not None:
        pairs = [(k, x) for k, x in pairs if all(f in known for f in chain(world, k, x))]
    return tuple(pairs)


def generate(
    n: int, seed: int = 0, pool: str = "train", known: frozenset | None = None, world: World = WORLD
) -> list[Question]:
    """`n` questions from a pool, deterministic in (`pool`, `seed`): each a uniform draw of its
    (kind, subject) pair, then of its distractors and order."""
    pairs = candidates(world, pool, known)
    rng = random.Random(f"tinysci/{world.seed}/{pool}/{seed}")
    return [question(world, *rng.choice(pairs), rng) for _ in range(n)]
