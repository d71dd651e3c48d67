import math

import torch

from distill.models.evaluation import fact_tokens, judge_nll, sampled_completions


def _direct_nll(judge, tokenizer, prompt: str, completion: list[int]) -> list[tuple[int, float]]:
    """(token, judge's NLL of it) for one row, scored alone (no padding), with a plain softmax."""
    ids = tokenizer(prompt)["input_ids"] + completion
    with torch.no_grad():
        logits = judge(input_ids=torch.tensor([ids])).logits[0, :, : len(tokenizer)].double()
    out = []
    for i, token in enumerate(completion):
        probs = logits[len(ids) - len(completion) + i - 1].softmax(-1)
        out.append((token, -math.log(probs[token].item())))
    return out


def test_judge_nll_matches_a_row_by_row_computation(char_tok, tiny_teacher, tiny_student):
    prompts = ["Use 74 98 39 to make 15.\n", "Add 1+2=\n", "Reverse abcdef=\n"]
    got = judge_nll(tiny_teacher, tiny_student, char_tok, prompts, max_new_tokens=12, seed=3)
    mask, ids = sampled_completions(tiny_student, char_tok, prompts, max_new_tokens=12, seed=3)
    digits = {char_tok.convert_tokens_to_ids(d) for d in "0123456789"}
    scored = []
    for row in range(len(prompts)):
        new = ids[row, mask.shape[1] :].tolist()
        if char_tok.eos_token_id in new:  # up to and including the first EOS
            new = new[: new.index(char_tok.eos_token_id) + 1]
        assert all(t < len(char_tok) for t in new)  # padded embedding rows are never sampled
        scored += _direct_nll(tiny_teacher, char_tok, prompts[row], new)
    for part, keep in (
        ("all", lambda t: True),
        ("format", lambda t: t not in digits),
        ("content", lambda t: t in digits),
    ):
        values = [nll for t, nll in scored if keep(t)]
        expected = sum(values) / len(values) if values else 0.0
        assert math.isclose(got[part], expected, rel_tol=1e-4), part


def test_sampled_completions_are_seeded(char_tok, tiny_student):
    prompts = ["Add 1+2=\n", "Reverse abc=\n"]
    a = sampled_completions(tiny_student, char_tok, prompts, max_new_tokens=8, seed=1)[1]
    b = sampled_completions(tiny_student, char_tok, prompts, max_new_tokens=8, seed=1)[1]
    c = sampled_completions(tiny_student, char_tok, prompts, max_new_tokens=8, seed=2)[1]
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_fact_tokens_mark_every_word_but_the_templates():
    tokens = [
        "<think>",
        *"sasat lives in rave. x is red.",
        "</think>",
        "<answer>",
        *"red",
        "</answer>",
        "<eos>",
    ]
    marked = "".join(t if m else "_" for t, m in zip(tokens, fact_tokens(tokens)) if len(t) == 1)
    assert marked == "sasat" + "_" * 10 + "rave__x" + "_" * 4 + "red_" + "red"
    assert fact_tokens(["<think>", "i", "s"]) == [False, False, False]


def test_judge_nll_splits_by_the_content_classifier_it_is_given(char_tok, tiny_teacher, tiny_student):
    prompts = ["What color is lokor?\nA. red\nB. blue\n", "Add 1+2=\n"]
    got = judge_nll(
        tiny_teacher, tiny_student, char_tok, prompts, max_new_tokens=12, seed=1, content=fact_tokens
    )
    mask, ids = sampled_completions(tiny_student, char_tok, prompts, max_new_tokens=12, seed=1)
    scored = []
    for row in range(len(prompts)):
        new = ids[row, mask.shape[1] :].tolist()
        flags = fact_tokens(char_tok.convert_ids_to_tokens(new))  # classified on the whole row
        if char_tok.eos_token_id in new:
            new = new[: new.index(char_tok.eos_token_id) + 1]
        scored += [
            (flag, nll)
            for flag, (_, nll) in zip(flags, _direct_nll(tiny_teacher, char_tok, prompts[row], new))
        ]
    for part, keep in (("all", lambda f: True), ("format", lambda f: not f), ("content", lambda f: f)):
        values = [nll for f, nll in scored if keep(f)]
        expected = sum(values) / len(values) if values else 0.0
        assert math.isclose(got[part], expected, rel_tol=1e-4), part
