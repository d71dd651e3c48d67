"""A tiny world's quality figures (`quality.json`): each model's greedy accuracy per task, its prior
abilities and knowledge pools (`measure_model`), and the family's cross-model figures: how well
each model reads another's text, the teacher's lead, the fine-tuned teachers' Countdown gap
(`measure_family`). `tiny_world.build` records them and checks the recipe's bars against them.
"""

from __future__ import annotations

from distill.models.evaluation import (
    countdown_eval,
    fact_tokens,
    judge_nll,
    prior_accuracy,
    sampled_style_share,
    task_accuracy,
    task_scores,
    tinysci_by_facts,
)
from distill.models.tiny_world_recipes import Recipe
from distill.models.tiny_world_train import Log
from distill.tasks import countdown, prior, tinysci
from distill.tasks.registry import get_task


def quality_key(name: str) -> str:
    """A model's name as the prefix of its quality figures (`teacher-es` -> `teacher_es`)."""
    return name.replace("-", "_")


V2_MEASURED = (("countdown3", 96), ("countdown4", 96))


def measure_model(model, tokenizer, name: str, n: int, log: Log, measured=None) -> dict:
    """Greedy accuracy on `n` fresh problems of each `measured` (task, budget), each prior task and
    both knowledge pools (`tinysci`), and the Countdown-3 style share. A recipe that names its
    `measured` tasks (v3) also gets the style share of seeded T=1 completions (`_style_share_sampled`)
    and the training pool's accuracy on the student's facts and on the others (`_tinysci_own_facts`,
    `_tinysci_other_facts`)."""
    out, graded = {}, measured is not None
    for task, budget in measured or V2_MEASURED:
        if task == "countdown3":
            problems = countdown.generate(n, seed=0, difficulty_name=task)
            scores = countdown_eval(model, tokenizer, problems, budget)
            out[f"{quality_key(name)}_{task}"] = scores["accuracy"]
            out[f"{quality_key(name)}_style_share"] = scores["style_share"]
            if graded:
                out[f"{quality_key(name)}_style_share_sampled"] = sampled_style_share(
                    model, tokenizer, problems, budget
                )
        else:
            rows = get_task(task).rows(n, 0)
            out[f"{quality_key(name)}_{task}"] = task_accuracy(model, tokenizer, get_task(task), rows, budget)
    per_task = {t: prior_accuracy(model, tokenizer, prior.generate(t, n, seed=0)) for t in prior.TASKS}
    out.update({f"{quality_key(name)}_prior_{t}": v for t, v in per_task.items()})
    out[f"{quality_key(name)}_prior"] = min(per_task.values())
    # The knowledge domain: fresh questions of the training pool, and the held-out compositions.
    for task in tinysci.TASKS:
        scores = task_scores(model, tokenizer, get_task(task), get_task(task).rows(n, 0))
        out[f"{quality_key(name)}_{task}"] = sum(scores) / n
        if graded and task == "tinysci":  # the same answers, on the student's facts and the others
            by_facts = tinysci_by_facts(tinysci.generate(n, 0, tinysci.TASKS[task]), scores)
            out[f"{quality_key(name)}_tinysci_own_facts"] = by_facts["own"]
            out[f"{quality_key(name)}_tinysci_other_facts"] = by_facts["other"]
    log(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out


def measure_family(models: dict, tokenizer, recipe: Recipe, log: Log, measured: dict) -> dict:
    """Cross-model figures: how well each model reads the other's T=1 Countdown-3 text (nats per
    token, `judge_nll`; the knowledge pair on its questions), and how far the fine-tuned teachers' (`teacher-es`, `teacher-sci`) Countdown-3
    accuracy is from the teacher's."""
    out = {}
    if "teacher" not in models or "student" not in models:
        return out
    prompts = [countdown.prompt(*p) for p in countdown.generate(recipe.nll_prompts, seed=1)]
    pairs = [("teacher", "student"), ("student", "teacher")]
    if "teacher-es" in models:
        pairs += [("student", "teacher-es"), ("teacher", "teacher-es")]
    for judge, writer in pairs:
        nll = judge_nll(models[judge], models[writer], tokenizer, prompts, seed=recipe.seed)
        base = f"{quality_key(judge)}_nll_on_{quality_key(writer)}"
        for part, suffix in (("all", ""), ("format", "_format"), ("content", "_digits")):
            out[base + suffix] = round(nll[part], 4)
    if "teacher-sci" in models and "student-sci" in models:  # the knowledge pair reads each other
        questions = [tinysci.prompt(q) for q in tinysci.generate(recipe.nll_prompts, seed=1)]
        for judge, writer in (("teacher-sci", "student-sci"), ("student-sci", "teacher-sci")):
            nll = judge_nll(models[judge], models[writer], tokenizer, questions, 64, recipe.seed, fact_tokens)
            base = f"{quality_key(judge)}_nll_on_{quality_key(writer)}"
            for part, suffix in (("all", ""), ("format", "_format"), ("content", "_facts")):
                out[base + suffix] = round(nll[part], 4)
    for task, _ in recipe.measured or ():  # v3: how far the teacher leads the student
        if f"student_{quality_key(task)}" in measured:
            out[f"teacher_lead_{quality_key(task)}"] = round(
                measured[f"teacher_{quality_key(task)}"] - measured[f"student_{quality_key(task)}"], 4
            )
    for variant in ("teacher-es", "teacher-sci"):  # fine-tuned teachers keep the teacher's Countdown
        if variant in models:
            out[f"{quality_key(variant)}_countdown3_gap"] = round(
                abs(measured["teacher_countdown3"] - measured[f"{quality_key(variant)}_countdown3"]), 4
            )
    log("family: " + ", ".join(f"{k} {v:.3f}" for k, v in out.items()))
    return out
