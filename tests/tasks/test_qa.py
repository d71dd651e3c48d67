"""QA answer extraction (the forms real models write, and hostile text) and option shuffling."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from distill.tasks import qa

OPTIONS = ["mitochondria", "ribosome", "nucleus", "golgi body"]
# Loose bound for megabyte inputs: catches quadratic behaviour, not a benchmark.
FAST = 1.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>ATP is made there.</think><answer>A</answer>", "A"),
        ("<answer> c </answer>", "C"),
        ("<ANSWER>\n(C)\n</Answer>", "C"),
        ("< answer >C</ answer >", "C"),
        ("<answer>**C**</answer>", "C"),
        ("<answer>C.</answer>", "C"),
        ("<answer>[d]</answer>", "D"),
        ("<answer>Option B</answer>", "B"),
        ("<answer>C. nucleus</answer>", "C"),
        ("<answer>  NUCLEUS </answer>", "C"),  # the option's text instead of its letter
        ("<answer>the Golgi   Body.</answer>", "D"),
        ("<answer>The answer is (D).</answer>", "D"),
        ("<answer>\\boxed{B}</answer>", "B"),
        ("The answer is (C)", "C"),
        ("so the answer is: b", "B"),
        ("Answer: C", "C"),
        ("**Answer:** **C**", "C"),
        ("The final answer is nucleus.", "C"),
        ("The answer is a ribosome", "B"),
        ("The answer is B because it translates mRNA.", "B"),
        ("\\boxed{C}", "C"),
        ("\\boxed{\\text{C}}", "C"),
        ("$\\boxed{ribosome}$", "B"),
        # several answers: the last one wins
        ("<answer>A</answer> wait, no. <answer>C</answer>", "C"),
        ("Answer: A. Hmm, actually the answer is D.", "D"),
        ("\\boxed{A} then \\boxed{B}", "B"),
        # an answer tag beats phrases, a boxed answer beats phrases
        ("<answer>C</answer> The answer is correct because of ATP.", "C"),
        ("The answer is A. \\boxed{B}", "B"),
        ("Answer: A\n<answer>B</answer>\nanswer: D", "B"),
        # nested and unclosed tags
        ("<answer><answer>B</answer></answer>", "B"),
        ("<answer>A</answer><answer>", "A"),
        ("<answer>B", None),
        # Unicode: full-width letters and words
        ("Ａｎｓｗｅｒ: Ｃ", "C"),
        ("<answer>ｃ</answer>", "C"),
        # nothing, or nothing that names one option
        ("", None),
        ("I do not know.", None),
        ("<answer></answer>", None),
        ("<answer>A or B</answer>", None),
        ("<answer>E</answer>", None),  # out of range for four options
        ("<answer>cytoplasm</answer>", None),
        ("The answer is unclear.", None),
        ("I hope this answers your question: C", None),
        ("<answer>__import__('os').system('echo hi')</answer>", None),
    ],
)
def test_extract_multiple_choice(completion, expected):
    assert qa.extract(completion, OPTIONS) == expected
    if expected is not None:
        assert qa.score(completion, OPTIONS, expected) == 1.0
        wrong = next(letter for letter in "ABCD" if letter != expected)
        assert qa.score(completion, OPTIONS, wrong) == 0.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<think>it is the capital</think><answer> Paris </answer>", "paris"),
        ("<answer>New   York.</answer>", "new york"),
        ("The answer is Paris. It is the capital.", "paris"),
        ("\\boxed{\\text{42}}", "42"),
        ("<answer>Rome</answer> The answer is Paris", "rome"),
        ("no answer here", None),
        ("<answer>  </answer>", None),
    ],
)
def test_extract_free_form(completion, expected):
    assert qa.extract(completion) == expected
    assert qa.score(completion, [], "  PARIS ") == (1.0 if expected == "paris" else 0.0)


HOSTILE = [
    None,
    12,
    b"<answer>A</answer>",
    "\x00" * 1000,
    "<answer>" * 200_000,
    "</answer>" * 200_000,
    "< answer >" * 100_000 + "x",
    "answer: " * 200_000,
    "The answer is " * 100_000,
    "\\boxed{" * 200_000,
    "{" * 1_000_000,
    "\\boxed{" + "{}" * 300_000 + "}",
    "<answer>" + "A" * 1_000_000 + "</answer>",
    " " * 1_000_000 + "answer:" + " " * 1_000_000,
    "é" * 500_000 + "İ" * 500_000,
    "\u202eA\u202c" * 10_000,
    "".join(map(chr, random.Random(0).choices(range(0x20, 0x2FFF), k=200_000))),
]


@pytest.mark.parametrize("text", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_never_raises_and_stays_fast(text):
    for options in (OPTIONS, []):
        start = time.perf_counter()
        found = qa.extract(text, options)
        assert time.perf_counter() - start < FAST
        assert found is None or isinstance(found, str)
        assert qa.score(text, options, "A") in (0.0, 1.0)


def test_a_real_answer_after_a_megabyte_of_noise_is_found():
    noise = "".join(random.Random(1).choices("ab <>/{}\\:", k=1_000_000))
    start = time.perf_counter()
    assert qa.extract(noise + "<answer>D</answer>", OPTIONS) == "D"
    assert qa.extract(noise + "\nThe answer is (B)", OPTIONS) == "B"
    assert time.perf_counter() - start < 2 * FAST


def test_extraction_never_evaluates_text(monkeypatch):
    import builtins

    def refuse(*args, **kwargs):
        raise AssertionError("text was evaluated")

    monkeypatch.setattr(builtins, "eval", refuse)
    monkeypatch.setattr(builtins, "exec", refuse)
    assert qa.extract("<answer>__import__('os')</answer>", OPTIONS) is None
    assert qa.extract("<answer>1+1</answer>") == "1+1"


def test_shuffling_is_deterministic_per_seed_and_question():
    options = ["right", "w1", "w2", "w3", "w4"]
    first = qa.shuffle_options("Q1?", options, 0, seed=0)
    assert first == qa.shuffle_options("Q1?", options, 0, seed=0)
    assert first.options[first.answer_index] == "right"
    assert sorted(first.options) == sorted(options)
    orders = {tuple(qa.shuffle_options("Q1?", options, 0, seed=s).options) for s in range(20)}
    assert len(orders) > 10  # the seed matters
    orders = {tuple(qa.shuffle_options(f"Q{i}?", options, 0, seed=0).options) for i in range(20)}
    assert len(orders) > 10  # the question matters


@pytest.mark.parametrize("n_options", [2, 4, 5])
def test_the_correct_letter_is_about_uniform(n_options):
    """The correct option always comes first in the source; after shuffling its letter is uniform:
    a chi-square statistic far below what a biased shuffle gives (df <= 4, p ~ 1e-6 at 35)."""
    n = 4000
    options = [f"option {k}" for k in range(n_options)]
    counts = Counter(qa.shuffle_options(f"question {i}?", options, 0, seed=7).answer_index for i in range(n))
    expected = n / n_options
    chi2 = sum((counts[k] - expected) ** 2 / expected for k in range(n_options))
    assert set(counts) == set(range(n_options))
    assert chi2 < 35, (chi2, counts)


def test_prompts_list_the_lettered_options_and_the_reference_scores():
    prompt = qa.prompt("Which organelle makes ATP?", OPTIONS)
    assert prompt.splitlines()[1:5] == ["A. mitochondria", "B. ribosome", "C. nucleus", "D. golgi body"]
    assert prompt.isascii()
    messages = qa.chat_messages("Which organelle makes ATP?", OPTIONS)
    assert messages[0]["role"] == "user" and "D. golgi body" in messages[0]["content"]
    ref = qa.reference("ATP synthase sits in the inner membrane.", OPTIONS, 0, "mitochondria")
    assert qa.score(ref, OPTIONS, "A") == 1.0
    assert qa.score(qa.reference("Capital.", [], None, "Paris"), [], "Paris") == 1.0
