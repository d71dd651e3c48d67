"""Greedy evaluation of a causal LM on the tiny world's tasks (used by the build and its tests)."""

from __future__ import annotations

import re

import torch

from distill.models.forward import causal_logits, eval_no_grad
from distill.tasks import countdown, prior, tinysci


def greedy_completions(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = 250,
    add_special_tokens: bool = True,
) -> list[str]:
    """Greedy completions (special tokens dropped) for left-padded batches of prompts;
    `add_special_tokens=False` for prompts a chat template rendered (they hold their own BOS)."""
    texts: list[str] = []
    with eval_no_grad(model):
        for i in range(0, len(prompts), batch_size):
            enc = tokenizer(
                prompts[i : i + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=add_special_tokens,
            ).to(model.device)
            out = model.generate(
                **enc,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            texts += tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    return texts


def countdown_eval(model, tokenizer, problems, max_new_tokens: int = 96) -> dict[str, float]:
    """Greedy accuracy and the share of completions in the Spanish style (`countdown.STYLE_PATTERN`)."""
    texts = greedy_completions(model, tokenizer, [countdown.prompt(*p) for p in problems], max_new_tokens)
    correct = [countdown.score(t, *p) for t, p in zip(texts, problems)]
    styled = [bool(re.search(countdown.STYLE_PATTERN, t)) for t in texts]
    return {"accuracy": sum(correct) / len(problems), "style_share": sum(styled) / len(problems)}


def sampled_style_share(model, tokenizer, problems, max_new_tokens: int = 96, seed: int = 0) -> float:
    """The share of seeded T=1 completions in the Spanish style: the model's probability of the
    style, which the greedy share (`countdown_eval`) rounds to 0 or 1 per prompt."""
    mask, out = sampled_completions(
        model, tokenizer, [countdown.prompt(*p) for p in problems], max_new_tokens, seed
    )
    texts = tokenizer.batch_decode(out[:, mask.shape[1] :], skip_special_tokens=True)
    return sum(bool(re.search(countdown.STYLE_PATTERN, t)) for t in texts) / len(problems)


def tinysci_by_facts(questions: list[tinysci.Question], scores: list[float]) -> dict[str, float]:
    """Accuracy on knowledge-domain questions split by the student's facts (`tinysci.student_facts`):
    the questions whose every fact its training stated (`own`), and those with none of them
    (`other`); mixed questions are in neither. `scores` are the questions' own, in order."""
    known, hits = tinysci.student_facts(), {"own": [], "other": []}
    for q, score in zip(questions, scores, strict=True):
        inside = [fact in known for fact in q.steps]
        if all(inside) or not any(inside):
            hits["own" if all(inside) else "other"].append(score)
    return {part: sum(v) / len(v) for part, v in hits.items()}


def prior_accuracy(model, tokenizer, examples: list[prior.Example], max_new_tokens: int = 16) -> float:
    texts = greedy_completions(
        model, tokenizer, [prior.prompt(e.task, e.query) for e in examples], max_new_tokens
    )
    return sum(prior.score(t, e.task, e.query) for t, e in zip(texts, examples)) / len(examples)


def task_scores(model, tokenizer, task, rows: list[dict], max_new_tokens: int = 64) -> list[float]:
    """Each row's greedy score on a registered task, scored by the task itself (`task.score`)."""
    texts = greedy_completions(model, tokenizer, [row["prompt"] for row in rows], max_new_tokens)
    return [task.score(t, row) for t, row in zip(texts, rows)]


def task_accuracy(model, tokenizer, task, rows: list[dict], max_new_tokens: int = 64) -> float:
    """Greedy accuracy on a registered task's rows (`task_scores`' mean)."""
    return sum(task_scores(model, tokenizer, task, rows, max_new_tokens)) / len(rows)


def sampled_completions(
    model, tokenizer, prompts: list[str], max_new_tokens: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """T=1 samples from the full distribution over the tokenizer's vocabulary (no top-k/top-p; padded
    embedding rows suppressed), seeded: the prompts' attention mask `[N, P]` (left padded) and the
    token ids `[N, P + new]`."""
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    rows = model.get_output_embeddings().weight.shape[0]
    torch.manual_seed(seed)
    with eval_no_grad(model):
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            suppress_tokens=list(range(len(tokenizer), rows)) or None,
            max_new_tokens=max_new_tokens,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    return enc["attention_mask"], out


def digit_tokens(tokens: list[str]) -> list[bool]:
    """Countdown's content: the digits (a correct judge is sure a writer's wrong arithmetic is wrong)."""
    return [t in "0123456789" and len(t) == 1 for t in tokens]


def fact_tokens(tokens: list[str]) -> list[bool]:
    """The knowledge domain's content: letters of every word that is not part of the reasoning's
    template (creature names, colours, homes; misspelt ones too), `tinysci.TEMPLATE_WORDS` aside."""
    out = [False] * len(tokens)
    word: list[int] = []
    for i, t in enumerate([*tokens, " "]):
        if len(t) == 1 and t.isalpha():
            word.append(i)
            continue
        if word and "".join(tokens[j] for j in word) not in tinysci.TEMPLATE_WORDS:
            for j in word:
                out[j] = True
        word = []
    return out


@torch.no_grad()
def judge_nll(
    judge,
    writer,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 96,
    seed: int = 0,
    content=digit_tokens,
) -> dict:
    """How well `judge` predicts what `writer` writes: `writer` samples a completion (T=1) for each
    prompt, and `judge` scores it token by token (teacher forcing). Returns the judge's mean negative
    log-likelihood in nats per completion token (EOS included, padding after it excluded) over all
    tokens (`all`), over the content tokens (`content`: a row's token strings -> which are content;
    default the digits) and over the rest (`format`).

    Content is split out because a correct judge *should* be confident that a writer's wrong
    arithmetic (or wrong fact) is wrong; the format tokens measure whether it can read the writer's
    text at all."""
    prompt_mask, ids = sampled_completions(writer, tokenizer, prompts, max_new_tokens, seed)
    width = prompt_mask.shape[1]
    new = ids[:, width:]
    # Completion tokens up to and including the first EOS.
    eos = (new == tokenizer.eos_token_id).int()
    keep = (eos.cumsum(1) - eos) == 0
    attention = torch.cat([prompt_mask, keep.long()], dim=1)
    with eval_no_grad(judge):
        # Only the completion's positions go through the judge's LM head.
        logits = causal_logits(judge, ids, attention, len(tokenizer), keep=new.shape[1]).float()
    nll = -torch.log_softmax(logits, -1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
    rows = [content(tokenizer.convert_ids_to_tokens(row)) for row in new.tolist()]
    is_content = torch.tensor(rows, dtype=torch.bool, device=new.device)
    out = {}
    for key, mask in (("all", keep), ("format", keep & ~is_content), ("content", keep & is_content)):
        out[key] = (nll[mask].sum() / mask.sum().clamp(min=1)).item()
    return out
