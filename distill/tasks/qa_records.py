"""A dataset record as a QA item, or why it is not one: option lists in their many written forms,
which option a gold answer names (text, explanation, letter, PubMedQA decision), and the reasons a
row cannot be scored. `qa_datasets.build` reads every record of a split through `read`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from distill.tasks import qa

if TYPE_CHECKING:
    from distill.tasks.qa_datasets import Spec

DROPPED = "dropped"  # `read`'s answer for a row left out on purpose (`free_form=drop`)

_OPTION_LINE = re.compile(r"^\s*[\(\[]?([A-Za-z])[\)\]]?\s*[.:)][.:]?\s*(.+?)\s*$")  # "A. x", "A.: x"
_OPTION_BARE = re.compile(r"^\s*\(([A-Za-z])\)\s*(.+?)\s*$")
_EXPLANATION = re.compile(r"\bexplanation[ \t]*:", re.I)  # MedMCQA's "<option>. Explanation: …"
_LONE_LETTER = re.compile(r"[(\[]?[ \t]*[A-Za-z][ \t]*[)\]]?[ \t]*[.:)]?")
_DECISION = re.compile(r"\bdecision[ \t]+is[ \t]*:?[ \t*]*(yes|no|maybe)\b", re.I)  # PubMedQA's


def parse_options(value) -> list[str]:
    """A list, a dict keyed by letter, or a string of lettered lines -> the option texts, in order."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [str(value[k]).strip() for k in sorted(value) if value[k] is not None]
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    found: dict[str, str] = {}
    for line in str(value).splitlines():
        match = _OPTION_LINE.match(line) or _OPTION_BARE.match(line)
        if match and match.group(1).upper() not in found:
            found[match.group(1).upper()] = match.group(2)
    letters = sorted(found)
    if letters != list(qa.LETTERS[: len(letters)]):  # not A, B, C, … in sequence: not options
        return []
    return [found[k] for k in letters]


def _by_text(text: str, options: list[str]) -> int | None:
    """The one option whose normalised text is `text`'s; None if none or several."""
    found = [i for i, option in enumerate(options) if qa.normalise(option) == qa.normalise(text)]
    return found[0] if len(found) == 1 else None


def gold_index(value, options: list[str]) -> int | None:
    """Which option `value` names; None if none (or several). `value` is a 0-based index, or a text:
    the option's text, that text then an explanation ("Colle's fascia. Explanation: …"), a letter
    ("B", "(B)", "B. text", "B) text", "option B", "The answer is B"), or a PubMedQA decision ("The
    final decision is: yes"). Texts are tried first, so an option written "E. coli" is not E."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value if 0 <= value < len(options) else None
    text = str(value).strip()
    head = _EXPLANATION.split(text, maxsplit=1)[0].strip()
    decision = _DECISION.search(head)
    # A lone letter is a letter even where an option reads "A" (blood groups): datasets that give
    # letters are many, and that was always its reading.
    for said in () if _LONE_LETTER.fullmatch(text) else (text, head, decision and decision.group(1)):
        found = _by_text(said, options) if said else None
        if found is not None:
            return found
    found = qa.resolve(head, options) if head else None
    return None if found is None else qa.LETTERS.index(found)


@dataclass(frozen=True)
class Item:
    question: str
    options: tuple[str, ...]  # shuffled; empty for free form
    answer_index: int | None
    answer_text: str
    reasoning: str
    source_index: int


def _text(value) -> str:
    return str(value if value is not None else "").strip()


def read(record: dict, index: int, mapping: dict, parsed: Spec) -> Item | str:
    """A record as an `Item`, or why it is not one: `DROPPED`, or the reason it cannot be scored."""
    question = _text(record[mapping["question"]])
    reasoning = _text(record.get(mapping["reasoning"])) if "reasoning" in mapping else ""
    if not question:
        return "no question"
    if "correct" in mapping:
        correct = _text(record[mapping["correct"]])
        wrong = [_text(record[f]) for f in mapping["distractors"].split(",")]
        options, answer = [correct, *[w for w in wrong if w]], 0
        if not correct:
            return "no answer"
    else:
        given = record[mapping["options"]] if "options" in mapping else None
        options, raw = parse_options(given), record[mapping["answer"]]
        if not options and (given if isinstance(given, (list, tuple, dict)) else _text(given)):
            return "options not lettered A, B, C..."
        if not options and not _text(raw):
            return "no answer"
        if not options and parsed.free_form == "drop":
            return DROPPED
        if not options:
            return Item(question, (), None, _text(raw), reasoning, index)
        answer = gold_index(raw, options)
        if answer is None:
            return "answer names no option"
    if len(options) > qa.MAX_OPTIONS:
        return f"more than {qa.MAX_OPTIONS} options"
    shuffled = qa.shuffle_options(question, options, answer, parsed.seed)
    return Item(question, tuple(shuffled.options), shuffled.answer_index, options[answer], reasoning, index)
