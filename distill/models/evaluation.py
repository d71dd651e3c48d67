"""Greedy evaluation of a causal LM on the tiny world's tasks (used by the build and its tests)."""

from __future__ import annotations

import re

import torch

from distill.tasks import countdown, prior


@torch.no_grad()
def greedy_completions(
    model, tokenizer, prompts: list[str], max_new_tokens: int, batch_size: int = 250
) -> list[str]:
    """Greedy completions (special tokens dropped) for left-padded batches of prompts."""
    was_training = model.training
    model.eval()
    texts: list[str] = []
    for i in range(0, len(prompts), batch_size):
        enc = tokenizer(prompts[i : i + batch_size], return_tensors="pt", padding=True).to(model.device)
        out = model.generate(
            **enc,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    return texts


def countdown_eval(model, tokenizer, problems, max_new_tokens: int = 96) -> dict[str, float]:
    """Greedy accuracy and the share of completions in the teacher's style."""
    texts = greedy_completions(model, tokenizer, [countdown.prompt(*p) for p in problems], max_new_tokens)
    correct = [countdown.score(t, *p) for t, p in zip(texts, problems)]
    styled = [bool(re.search(countdown.STYLE_PATTERN, t)) for t in texts]
    return {"accuracy": sum(correct) / len(problems), "style_share": sum(styled) / len(problems)}


def prior_accuracy(model, tokenizer, examples: list[prior.Example], max_new_tokens: int = 16) -> float:
    texts = greedy_completions(
        model, tokenizer, [prior.prompt(e.task, e.query) for e in examples], max_new_tokens
    )
    return sum(prior.score(t, e.task, e.query) for t, e in zip(texts, examples)) / len(examples)
