"""The lexical Spanish detector used as a hub-model StyleProbe."""

import pytest

from distill.callbacks.style_probe import StyleProbe
from distill.tasks.style import SPANISH_WORDS, is_spanish, spanish_share

SPANISH = [
    "Primero sumamos 12 y 34, que da 46. Luego restamos 5 del resultado, así que la respuesta es 41.",
    "Tenemos los números 3, 7 y 9. Si multiplicamos 3 por 7 obtenemos 21, y después sumamos 9: 30.",
    "<think>Para llegar al objetivo, usamos la suma de los dos primeros números.</think><answer>C</answer>",
]
ENGLISH = [
    "First add 12 and 34 to get 46. Then subtract 5 from the result, so the answer is 41.",
    "We have the numbers 3, 7 and 9. Multiplying 3 by 7 gives 21, and adding 9 gives 30.",
    "<think>The mitochondria is the powerhouse of the cell, so the answer is B.</think><answer>B</answer>",
    "98-74=24,39-24=15",  # the tiny world's terse style: no words at all
    "",
]


@pytest.mark.parametrize("text", SPANISH)
def test_spanish_reasoning_is_detected(text):
    assert is_spanish(text) and spanish_share(text) >= 0.2


@pytest.mark.parametrize("text", ENGLISH)
def test_english_reasoning_is_not(text):
    assert not is_spanish(text) and spanish_share(text) < 0.1


def test_no_spanish_function_word_is_also_a_common_english_word():
    english = {"a", "no", "me", "he", "son", "sin", "e", "o", "is", "as", "the", "an", "on", "in"}
    assert not SPANISH_WORDS & english


def test_short_texts_need_enough_words():
    assert not is_spanish("la y")  # two words: too few to judge
    assert is_spanish("la y el de")


def test_it_plugs_into_style_probe_by_dotted_path():
    probe = StyleProbe(detector="distill.tasks.style.is_spanish", num_prompts=1)
    assert probe.detector(SPANISH[0]) and not probe.detector(ENGLISH[0])
