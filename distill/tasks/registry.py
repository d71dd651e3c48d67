"""Tasks by name, behind one small interface that data loading and evaluation use.

A task turns a seed into rows (plain dicts, ready for `datasets.Dataset.from_list`) and scores a
completion against a row. Rows always hold `prompt` (plain text) and `messages` (chat form).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distill.tasks import countdown, prior


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


TASKS = {name: CountdownTask(name) for name in countdown.DIFFICULTIES} | {
    name: PriorTask(name) for name in prior.TASKS
}


def get_task(name: str):
    if name not in TASKS:
        raise ValueError(f"task must be one of {sorted(TASKS)}, got {name!r}")
    return TASKS[name]
