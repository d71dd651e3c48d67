"""Question answering: multiple choice (lettered options) and short free-form answers, reasoning
first, then the answer.

Pure Python. A completion reasons, then states its answer; `extract` finds that answer the way real
models write it, and `score` judges it. Extraction rules (case and whitespace tolerant; never raises,
never evaluates text, linear time on hostile text):

1. The last closed ``<answer>…</answer>`` decides, if there is one (nested tags: the innermost
   last one). Its content may itself say ``\\boxed{C}`` or "The answer is (C)".
2. Else the last ``\\boxed{…}`` (``\\text{…}`` inside is unwrapped).
3. Else the last phrase whose rest of line resolves: "answer is …" / "answer: …" (e.g. "The
   answer is (C)", "**Answer**: C", "the final answer is mitochondria"), "the correct / right /
   best / final option (choice, response) is …" (e.g. "The correct option is B) ibuprofen."), or,
   with options, a letter stated as chosen: "Option B is correct", "B is the correct answer",
   "I choose (B)".

A fragment resolves to an option by its letter (``C``, ``(c)``, ``C.``, ``**C**``, ``option C``,
``C. mitochondria``) within the options' range, or by the option's text (normalised: Unicode NFKC,
case-folded, whitespace collapsed, end punctuation dropped). A letter outside the range, two letters
("A or B") or text matching no option resolve to nothing. Free-form answers (no options) compare
the normalised fragment with the normalised gold text.

Options are shuffled deterministically per (seed, question) so that the letter of the correct
option carries no bias; `chance` is 1 / number of options.

    >>> shuffled = shuffle_options("Which is a noble gas?", ["argon", "iron", "tin", "salt"], 0, seed=0)
    >>> shuffled.options[shuffled.answer_index]
    'argon'
    >>> extract("Argon is inert. The answer is (b).", ["x", "y", "z"])
    'B'
    >>> extract("<answer>  Iron </answer>", ["argon", "iron"])
    'B'
"""

from __future__ import annotations

import random
import re
import string
import unicodedata
from collections import deque
from typing import NamedTuple

LETTERS = string.ascii_uppercase
MAX_OPTIONS = len(LETTERS)
# A phrase answer is read up to 400 characters (rest of its line); a boxed one likewise.

_OPEN = re.compile(r"<[ \t]*answer[ \t]*>", re.IGNORECASE)
_CLOSE = re.compile(r"<[ \t]*/[ \t]*answer[ \t]*>", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed[ \t]*\{((?:[^{}]|\{[^{}]*\}){0,400})\}")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm)\{([^{}]*)\}")
# The rest of line is read by a lookahead, so phrases on one line do not hide each other.
_PHRASE = re.compile(
    r"(?:\banswer|\b(?:correct|right|best|final)[ \t]+(?:option|choice|response))[*_ \t]*"
    r"(?:\b(?:is|would[ \t]+be|should[ \t]+be)\b[ \t]*:?|:)[ \t]*(?=([^\n]{0,400}))",
    re.I,
)
# A letter stated as the choice (multiple choice only): "option B is correct", "B is the correct
# answer" (the letter is read behind "is", so the scan starts at a word, not at every capital),
# "I choose (B)". A bare letter must be a capital: "choose a drug" chooses nothing.
_CHOSEN = re.compile(
    r"\b(?:option|choice)[ \t]*[(\[]?([A-Za-z])[)\]]?[ \t]+is[ \t]+(?:the[ \t]+)?(?:correct|right|best)\b"
    r"|\bis(?:(?<=(?<![\w'])(?-i:([A-Z])) is)|(?<=[(\[](?-i:([A-Z]))[)\]] is))"
    r"[ \t]+the[ \t]+(?:correct|right|best)[ \t]+(?:answer|option|choice)\b"
    r"|\b(?:choose|select|pick)[ \t]+(?:(?:option|choice)[ \t]*[(\[]?([A-Za-z])[)\]]?|[(\[]?((?-i:[A-Z]))[)\]]?)"
    r"(?![\w'])",
    re.I,
)
_SENTENCE_END = re.compile(r"(?<=\S)[.!?;](?:\s|$)")
_MAX_PHRASES = 64  # phrase answers tried, from the last one back
# Phrases are read in a text's last 100,000 characters (a completion states its answer at its end),
# which bounds their cost on hostile text whatever its length.
_PHRASE_WINDOW = 100_000
_WRAP = " \t\r\n*_`'\"“”‘’«»"
# A bare letter: "C", "(C)", "[c]", "C.", "C)", "option C", "choice (c):" ("a bacterium" is text).
_LETTER = re.compile(r"(?:(?:option|choice)\s+)?[\(\[]?\s*([A-Za-z])\s*[\)\]]?\s*[.:)]?", re.I)
_CAPITAL_WORD = re.compile(r"([A-Z])(?=\s+\w)")
_ARTICLE = re.compile(r"^(?:the|an|a)\s+")
_LEADING_LETTER = re.compile(
    r"(?:(?:option|choice)\s+)?(?:\(([A-Za-z])\)|\[([A-Za-z])\]|([A-Z])[.):])\s+(\S.*)", re.I | re.S
)


def normalise(text: str) -> str:
    """NFKC, case-folded, whitespace collapsed, wrapping quotes/markup and end punctuation dropped."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = " ".join(text.split())
    return text.strip(_WRAP + ".,;:!?").strip()


class Shuffled(NamedTuple):
    options: list[str]
    answer_index: int


def shuffle_options(question: str, options: list[str], answer_index: int, seed: int = 0) -> Shuffled:
    """`options` in an order fixed by (`seed`, `question`, the options), and where the answer went."""
    order = list(range(len(options)))
    random.Random(f"qa/{seed}/{question}/{len(options)}").shuffle(order)
    return Shuffled([options[i] for i in order], order.index(answer_index))


def chance(options: list[str] | tuple[str, ...]) -> float:
    """Accuracy of a uniform guess among `options`; 0 for a free-form question (none)."""
    return 1 / len(options) if options else 0.0


def letter(index: int) -> str:
    return LETTERS[index]


def format_options(options: list[str]) -> str:
    return "\n".join(f"{letter(i)}. {text}" for i, text in enumerate(options))


def prompt(question: str, options: list[str]) -> str:
    """The plain-text prompt (base models): question, lettered options, then where to answer."""
    if options:
        return (
            f"{question.strip()}\n{format_options(options)}\nReason, then answer <answer>letter</answer>.\n"
        )
    return f"{question.strip()}\nReason, then answer <answer>text</answer>.\n"


def chat_messages(question: str, options: list[str]) -> list[dict[str, str]]:
    """The same question for instruct models, for `tokenizer.apply_chat_template`."""
    if options:
        body = f"{question.strip()}\n\n{format_options(options)}"
        ask = "the letter of the correct option in <answer> </answer> tags, for example <answer>A</answer>"
    else:
        body, ask = question.strip(), "a short final answer in <answer> </answer> tags"
    content = f"{body}\n\nThink step by step in <think> </think> tags, then give {ask}."
    return [{"role": "user", "content": content}]


def reference(reasoning: str, options: list[str], answer_index: int | None, answer_text: str) -> str:
    """A reference completion (reasoning, then answer) in the format `extract` reads."""
    final = letter(answer_index) if options and answer_index is not None else answer_text
    return f"<think>{reasoning.strip()}</think><answer>{final}</answer>"


# --- extraction ----------------------------------------------------------------------------------


def _last(pattern: re.Pattern, text: str, end: int | None = None):
    found = None
    for found in pattern.finditer(text, 0, len(text) if end is None else end):  # noqa: B007
        pass
    return found


def _tag_content(text: str) -> str | None:
    """The content of the last closed answer tag: from the last opening tag before the last
    closing tag, to that closing tag."""
    close = _last(_CLOSE, text)
    if close is None:
        return None
    opening = _last(_OPEN, text, close.start())
    if opening is None:
        return None
    first_close = _CLOSE.search(text, opening.end())  # nested tags: the innermost pair
    return text[opening.end() : first_close.start()]


def _phrases(text: str, options: list[str]) -> list[str]:
    """The fragments of the last `_MAX_PHRASES` answer phrases of `text`, last first: a phrase's
    rest of line, or (with options) the letter a statement chose."""
    text = text[-_PHRASE_WINDOW:]
    found = deque(_PHRASE.finditer(text), maxlen=_MAX_PHRASES)
    if options:
        chosen = deque(_CHOSEN.finditer(text), maxlen=_MAX_PHRASES)
        found = deque(sorted([*found, *chosen], key=lambda m: m.start()), maxlen=_MAX_PHRASES)
    return [m.group(1) if m.re is _PHRASE else next(g for g in m.groups() if g) for m in reversed(found)]


def _last_phrase(text: str) -> str | None:
    """The rest of line of the last "answer is …" phrase of `text`."""
    found = _last(_PHRASE, text[-_PHRASE_WINDOW:])
    return None if found is None else found.group(1)


def _boxed(text: str) -> str | None:
    found = _last(_BOXED, text)
    return None if found is None else _TEXT.sub(r"\1", found.group(1))


def _resolve_letter(fragment: str, options: list[str], phrase: bool = False) -> str | None:
    """A letter in range, from a fragment that is just a letter or starts with one ("C. text"; in
    a phrase's rest of line also a capital letter then a word: "B because …")."""
    bare = fragment.strip(_WRAP)
    match = _LETTER.fullmatch(bare)
    if match:
        raw = match.group(1)
        index = LETTERS.index(raw.upper())
        return letter(index) if index < len(options) else None
    lead = _LEADING_LETTER.fullmatch(bare) or (_CAPITAL_WORD.match(bare) if phrase else None)
    if lead:
        raw = next(g for g in lead.groups()[:3] if g)
        index = LETTERS.index(raw.upper())
        return letter(index) if index < len(options) else None
    return None


def resolve(fragment: str, options: list[str], depth: int = 0) -> str | None:
    """A fragment -> the letter of the option it names (multiple choice), or its normalised text
    (free form, `options` empty); None if it names nothing."""
    if not options:
        text = normalise(_TEXT.sub(r"\1", fragment))
        inner = _boxed(fragment)
        if inner is not None and depth == 0:
            return resolve(inner, options, 1)
        phrase = _last_phrase(fragment) if depth == 0 else None
        if phrase is not None:
            return resolve(phrase, options, 1)
        if depth > 0:  # a phrase's rest of line: its first sentence ("Paris. It is the capital")
            text = normalise(_SENTENCE_END.split(text, 1)[0])
        return text or None
    found = _resolve_letter(fragment, options, phrase=depth > 0)
    if found is not None:
        return found
    text = _ARTICLE.sub("", normalise(_TEXT.sub(r"\1", fragment)))
    matches = [i for i, option in enumerate(options) if _ARTICLE.sub("", normalise(option)) == text]
    if len(matches) == 1:
        return letter(matches[0])
    if depth == 0:  # "<answer>The answer is (C)</answer>", "<answer>\boxed{C}</answer>"
        for inner in (_boxed(fragment), _last_phrase(fragment)):
            if inner:
                found = resolve(inner, options, 1)
                if found is not None:
                    return found
    return None


def extract(completion: str, options: list[str] | tuple[str, ...] = ()) -> str | None:
    """The answer of `completion` (see the module docstring): a letter for multiple choice, the
    normalised text for free form, or None. Never raises."""
    try:
        if not isinstance(completion, str):
            return None
        completion = unicodedata.normalize("NFKC", completion)  # full-width letters, ligatures
        options = [str(o) for o in options]
        content = _tag_content(completion)
        if content is not None:
            return resolve(content, options)
        boxed = _boxed(completion)
        if boxed is not None:
            return resolve(boxed, options, 1)
        for fragment in _phrases(completion, options):
            found = resolve(fragment, options, 1)
            if found is not None:
                return found
        return None
    except Exception:  # an answer extractor must never crash a training run on hostile text
        return None


def score(completion: str, options: list[str], answer: str) -> float:
    """1.0 iff the extracted answer is `answer` (a letter, or the normalised free-form text)."""
    try:
        found = extract(completion, options)
        gold = answer if options else normalise(answer)
        return 1.0 if found is not None and found == gold else 0.0
    except Exception:
        return 0.0
