"""Style detectors for `distill.callbacks.StyleProbe` (pass one as `detector: distill.tasks.style.<name>`).

`is_spanish`: does a completion reason in Spanish? The paper induces a teacher to reason in
Spanish and measures how much of that style the student takes up; with hub models the teacher is
induced by a teacher-only system prompt (`data.prompts.teacher_context`, `configs/paper/*_style_es.yaml`).
The test is lexical, so it needs no model and no download: the share of a text's words that are
Spanish function words (articles, prepositions, conjunctions, common verbs, arithmetic words),
none of which is also an English word.
"""

from __future__ import annotations

import re

SPANISH_WORDS = frozenset(
    """
    el la los las un una unos unas del al de en que y es está están por para con sobre
    entre hasta desde como pero porque pues luego entonces también cuando donde muy más menos
    este esta estos estas ese esa eso esto aquí ahora primero después tenemos podemos usamos
    necesitamos queda quedan hay sumamos restamos multiplicamos dividimos sumar restar multiplicar
    dividir resultado respuesta número números objetivo igual mayor menor cada todos todas
    paso pasos vamos así ya nos se su sus lo le les
    """.split()
)
_WORD = re.compile(r"[^\W\d_]+")  # runs of letters (accented ones included)


def spanish_share(text: str) -> float:
    """The share of `text`'s words that are Spanish function words (0.0 for a text without words)."""
    words = [w.lower() for w in _WORD.findall(text)]
    return sum(w in SPANISH_WORDS for w in words) / len(words) if words else 0.0


def is_spanish(text: str, threshold: float = 0.2, min_words: int = 4) -> bool:
    """True when at least `min_words` words are written and at least `threshold` of them are
    Spanish function words (English reasoning scores near 0, Spanish prose about 0.3–0.5)."""
    words = _WORD.findall(text)
    return len(words) >= min_words and spanish_share(text) >= threshold
