"""Tasks by name, behind one small interface that data loading and evaluation use.

A task turns a seed into rows (plain dicts, ready for `datasets.Dataset.from_list`) and scores a
completion against a row. Rows always hold `prompt` (plain text) and `messages` (chat form).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from distill.tasks import arithmetic, countdown, countdown_chain, prior, qa, qa_datasets, tinysci


@dataclass(frozen=True)
class CountdownTask:
    name: str
    style_pattern: str = countdown.STYLE_PATTERN

    def rows(self, n: int, seed: int) -> list[dict]:
        return [
            {
                "prompt": countdown.prompt(p.numbers, p.target),
                "messages": countdown.chat_messages(p.numbers, p.target),
                "numbers": list(p.numbers),
                "target": p.target,
            }
            for p in countdown.generate(n, seed, self.name)
        ]

    def score(self, completion: str, row: dict) -> float:
        return countdown.score(completion, row["numbers"], row["target"])

    def answer(self, completion: str) -> str | None:
        """The normalised final answer (for counting distinct answers)."""
        found = countdown.expression.last_answer(completion)
        return None if found is None else re.sub(r"\s+", "", found)


@dataclass(frozen=True)
class CountdownChainTask(CountdownTask):
    """Two chained Countdown-3 problems (`distill.tasks.countdown_chain`): rows hold all five
    `numbers` and the final `target`, so scoring and answers are Countdown's."""

    name: str = countdown_chain.NAME

    def rows(self, n: int, seed: int) -> list[dict]:
        return [
            {
                "prompt": countdown_chain.prompt(p),
                "messages": countdown_chain.chat_messages(p),
                "numbers": list(p.numbers),
                "target": p.target,
                "via": p.via,
            }
            for p in countdown_chain.generate(n, seed)
        ]


@dataclass(frozen=True)
class CountdownPoolTask(CountdownTask):
    """A pool of Countdown difficulties (`weights`: (difficulty, weight) pairs) as one training task:
    each row's difficulty drawn by weight, seeded; rows record it (`difficulty`) and are scored as
    every Countdown row. `countdown_mix` holds the three forms tiny world v3 measures, so that none
    is out of the pool's form (LOG, 2026-12-03)."""

    name: str = "countdown_mix"
    weights: tuple[tuple[str, float], ...] = (
        ("countdown3", 0.6),
        ("countdown4", 0.2),
        ("countdown3_large", 0.2),
    )

    def rows(self, n: int, seed: int) -> list[dict]:
        names = [d for d, _ in self.weights]
        draws = random.Random(f"{self.name}/{seed}").choices(names, [w for _, w in self.weights], k=n)
        pools = {d: iter(CountdownTask(d).rows(draws.count(d), seed)) for d in names}
        return [{**next(pools[d]), "difficulty": d} for d in draws]


@dataclass(frozen=True)
class PriorTask:
    name: str

    def rows(self, n: int, seed: int) -> list[dict]:
        return [
            {
                "prompt": prior.prompt(e.task, e.query),
                "messages": [{"role": "user", "content": prior.prompt(e.task, e.query)}],
                "query": e.query,
                "reference": e.completion,
            }
            for e in prior.generate(self.name, n, seed)
        ]

    def score(self, completion: str, row: dict) -> float:
        return prior.score(completion, self.name, row["query"])

    def answer(self, completion: str) -> str | None:
        return completion.split("\n", 1)[0].strip()


@dataclass(frozen=True)
class ArithmeticTask:
    """One arithmetic step as a Countdown solution writes it (`distill.tasks.arithmetic`): a drill
    tried for a tiny world v3 student, measured like a prior."""

    name: str = arithmetic.NAME

    def rows(self, n: int, seed: int) -> list[dict]:
        return [
            {
                "prompt": arithmetic.prompt(s),
                "messages": [{"role": "user", "content": arithmetic.prompt(s)}],
                "a": s.a,
                "op": s.op,
                "b": s.b,
                "reference": s.completion,
            }
            for s in arithmetic.generate(n, seed)
        ]

    def score(self, completion: str, row: dict) -> float:
        return arithmetic.score(completion, arithmetic.Step(row["a"], row["op"], row["b"]))

    def answer(self, completion: str) -> str | None:
        return completion.split("\n", 1)[0].strip()


@dataclass(frozen=True)
class TinySciTask:
    """The tiny world's knowledge domain (`distill.tasks.tinysci`): `pool` "train" (`tinysci`) or
    "compose" (`tinysci_compose`), multiple choice scored like every QA task."""

    name: str
    pool: str
    chance = 1 / tinysci.N_OPTIONS
    answer_uses_row = True  # `TaskEvaluation` passes the row, so option texts resolve to letters

    def rows(self, n: int, seed: int) -> list[dict]:
        out = []
        for q in tinysci.generate(n, seed, self.pool):
            text, options = tinysci.question_text(q), list(q.options)
            out.append(
                {
                    "prompt": tinysci.prompt(q),
                    "messages": qa.chat_messages(text, options),
                    "question": text,
                    "options": options,
                    "answer": qa.letter(q.answer_index),
                    "answer_text": options[q.answer_index],
                    "kind": q.kind,
                    "reference": tinysci.completion(tinysci.WORLD, q),
                }
            )
        return out

    def score(self, completion: str, row: dict) -> float:
        return qa.score(completion, row["options"], row["answer"])

    def answer(self, completion: str, row: dict | None = None) -> str | None:
        return qa.extract(completion, row["options"] if row is not None else ())


TASKS = (
    {name: CountdownTask(name) for name in countdown.DIFFICULTIES}
    | {countdown_chain.NAME: CountdownChainTask()}
    | {CountdownPoolTask.name: CountdownPoolTask()}
    | {name: PriorTask(name) for name in prior.TASKS}
    | {arithmetic.NAME: ArithmeticTask()}
    | {name: TinySciTask(name, pool) for name, pool in tinysci.TASKS.items()}
)


def is_task(name: object) -> bool:
    """A registered task name, or a dataset spec (``<kind>:<source>…``, checked when loaded)."""
    return isinstance(name, str) and (
        name in TASKS or name in qa_datasets.LOADED or qa_datasets.is_spec(name)
    )


def get_task(name: str, field: str = "task"):
    """A registered task by name, or the QA task of a dataset spec (`distill.tasks.qa_datasets`;
    once loaded, also by its name). An unknown name is refused naming `field`, the setting that
    gave it (`data.task`, ...)."""
    if isinstance(name, str) and name not in TASKS:
        if name in qa_datasets.LOADED:  # a loaded spec's task, by its name
            return qa_datasets.LOADED[name]
        if qa_datasets.is_spec(name):
            return qa_datasets.get_qa_task(name)
    if name not in TASKS:
        raise ValueError(
            f"{field} must be one of {sorted(TASKS)} or a dataset spec '<kind>:<source>' with kind in "
            f"{list(qa_datasets.KINDS)}, got {name!r}"
        )
    return TASKS[name]
