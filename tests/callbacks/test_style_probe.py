"""StyleProbe: style detection on hand-made strings, by regex, callable or import path."""

from __future__ import annotations

import pickle
import re

import pytest

from distill.callbacks import StyleProbe
from distill.callbacks.style_probe import style_share

TEXTS = [
    "<think>98-74=24, pues 39-24=15</think><answer>39-(98-74)</answer>",
    "<think>luego 3*5=15</think>",
    "<think>98-74=24,39-24=15</think>",
    "puesto que no",  # "pues" inside a word: not the connective
]


def test_default_pattern_detects_the_teachers_connectives():
    probe = StyleProbe(num_prompts=1)
    assert [probe.detector(t) for t in TEXTS] == [True, True, False, False]
    assert style_share(TEXTS, probe.detector) == 0.5
    assert style_share([], probe.detector) == 0.0
    assert pickle.loads(pickle.dumps(probe)).detector(TEXTS[0])  # spawn-based launchers pickle callbacks


def test_custom_regex_and_callable():
    assert StyleProbe(pattern=r"\d=\d", num_prompts=1).detector("4=4")
    probe = StyleProbe(pattern=lambda text: text.endswith("</think>"), num_prompts=1)
    assert style_share(TEXTS, probe.detector) == 0.5


def test_detector_from_import_path():
    probe = StyleProbe(detector="os.path.isabs", num_prompts=1)  # any (str) -> bool callable
    assert style_share(["/abs", "rel", "/x"], probe.detector) == pytest.approx(2 / 3)


def test_share_is_logged_at_start_and_intervals(monkeypatch, fake_trainer, fake_module):
    probe = StyleProbe(num_prompts=1, every_n_steps=2)
    shares = iter([0.1, 0.4, 0.6])
    monkeypatch.setattr(probe, "share", lambda trainer, module: next(shares))
    trainer, module = fake_trainer(), fake_module(None)
    probe.on_train_start(trainer, module)
    for step in (1, 2):
        trainer.global_step = step
        probe.on_train_batch_end(trainer, module, None, None, 0)
    probe.on_train_end(trainer, module)  # same step as the last interval: not measured again
    trainer.global_step = 3
    probe.on_train_end(trainer, module)
    steps = [(s, m["style/teacher_style_share"]) for s, m in trainer.loggers[0].calls]
    assert steps == [(0, 0.1), (2, 0.4), (3, 0.6)]
    assert probe.summary() == {"style/teacher_style_share": 0.6, "style/teacher_style_share_start": 0.1}
    resumed = StyleProbe(num_prompts=1)
    resumed.load_state_dict(probe.state_dict())
    assert resumed.summary() == probe.summary()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pattern": "(unclosed"}, r"StyleProbe.pattern '\(unclosed' is not a valid regular expression"),
        ({"detector": "no_dots"}, "StyleProbe.detector must be a dotted import path"),
        ({"detector": "os.path.no_such_function"}, "cannot be imported"),
        ({"task": "nope"}, r"StyleProbe.task must be task names from .* \(unknown: \['nope'\]\)"),
        ({"num_prompts": 0}, "StyleProbe.num_prompts must be an integer >= 1, got 0"),
        ({"pattern": 3}, "StyleProbe.pattern must be a regex string or a callable"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StyleProbe(**kwargs)


def test_sampled_share_is_logged_beside_the_greedy_one_and_resumes(monkeypatch, fake_trainer, fake_module):
    probe = StyleProbe(num_prompts=1, every_n_steps=1, samples=4)
    calls = []

    def share(trainer, module, temperature=0.0, samples=1):
        calls.append((temperature, samples))
        return 1.0 if temperature == 0 else 0.25

    monkeypatch.setattr(probe, "share", share)
    trainer, module = fake_trainer(), fake_module(None)
    probe.on_train_start(trainer, module)
    assert calls == [(0.0, 1), (1.0, 4)]
    assert trainer.loggers[0].calls == [
        (0, {"style/teacher_style_share": 1.0, "style/teacher_style_share_sampled": 0.25})
    ]
    assert probe.summary()["style/teacher_style_share_sampled"] == 0.25
    resumed = StyleProbe(num_prompts=1, samples=4)
    resumed.load_state_dict(probe.state_dict())
    assert resumed.summary() == probe.summary()
    old = {k: v for k, v in probe.state_dict().items() if k != "latest_sampled"}
    StyleProbe(num_prompts=1).load_state_dict(old)  # a checkpoint from before the option


def test_sampled_share_estimates_the_students_probability_of_the_style(
    fake_trainer, fake_module, tiny_student
):
    """With one new token, the sampled share is the student's probability of a first token that
    the detector accepts: compared with that probability from a direct forward pass."""
    import torch

    from distill.callbacks.generation import prompt_collator

    probe = StyleProbe(pattern=r"^[0-9]", task="addition", num_prompts=4, max_new_tokens=1, batch_size=300)
    trainer, module = fake_trainer(), fake_module(tiny_student)
    tok = module.tokenizer
    digit = torch.tensor(
        [bool(re.match(r"^[0-9]", tok.decode([i], skip_special_tokens=True))) for i in range(len(tok))]
    )
    expected = []
    for row in probe.rows:
        enc = prompt_collator(trainer, module).student([row])
        with torch.no_grad():
            logits = tiny_student(**enc).logits[0, -1, : len(tok)].float()
        expected.append(float(torch.softmax(logits, -1)[digit].sum()))
    sampled = probe.share(trainer, module, 1.0, 300)  # a batch a prompt: no padding
    assert sampled == probe.share(trainer, module, 1.0, 300)  # seeded: the same draws every probe
    assert abs(sampled - sum(expected) / len(expected)) < 0.05  # 1,200 draws: sd <= 0.015
    assert probe.share(trainer, module) in {0.0, 0.25, 0.5, 0.75, 1.0}  # greedy: a switch per prompt


def test_the_teachers_own_share_is_measured_once_before_training_and_resumes(
    monkeypatch, fake_trainer, fake_module, tiny_student
):
    probe = StyleProbe(num_prompts=1, every_n_steps=1, samples=2)
    calls = []

    def share(trainer, module, temperature=0.0, samples=1, writer="student"):
        calls.append((writer, temperature))
        return {"teacher": 0.4, "student": 0.0}[writer] + temperature / 10

    monkeypatch.setattr(probe, "share", share)
    trainer, module = fake_trainer(), fake_module(tiny_student, teacher=tiny_student)
    probe.on_train_start(trainer, module)
    trainer.global_step = 1
    probe.on_train_batch_end(trainer, module, None, None, 0)
    assert [c for c in calls if c[0] == "teacher"] == [("teacher", 0.0), ("teacher", 1.0)]  # once
    own = {"style/teacher_own_share": 0.4, "style/teacher_own_share_sampled": 0.5}
    assert trainer.loggers[0].calls[0] == (0, own)
    assert probe.summary().items() >= own.items()
    resumed = StyleProbe(num_prompts=1, samples=2)
    resumed.load_state_dict(probe.state_dict())
    resumed.on_train_start(trainer, module)  # resumed past step 0: nothing is measured again
    assert resumed.summary() == probe.summary()
    legacy = StyleProbe(num_prompts=1, samples=2)  # a checkpoint from before the teacher was measured
    monkeypatch.setattr(legacy, "share", share)
    legacy.load_state_dict({k: v for k, v in probe.state_dict().items() if k != "teacher"})
    calls.clear()
    legacy.on_train_start(trainer, module)
    assert calls == [("teacher", 0.0), ("teacher", 1.0)]  # the teacher once, the student not again
    assert legacy.summary() == probe.summary()
    no_teacher = StyleProbe(num_prompts=1)
    monkeypatch.setattr(no_teacher, "share", share)
    no_teacher.on_train_start(fake_trainer(), fake_module(tiny_student))
    assert "style/teacher_own_share" not in no_teacher.summary()


def test_the_teachers_sampled_share_is_its_probability_of_the_style(fake_trainer, fake_module, tiny_student):
    """The teacher's share comes from the teacher's own completions: with one new token, its
    sampled share matches the teacher's probability of a detected first token (a direct forward
    pass), and differs from the student's (the detector accepts the characters the teacher
    prefers over the student)."""
    import torch

    from distill.callbacks.generation import prompt_collator

    teacher = type(tiny_student)(tiny_student.config)  # same shape, other weights
    torch.manual_seed(7)
    for p in teacher.parameters():
        torch.nn.init.normal_(p, std=0.5)
    trainer = fake_trainer()
    module = fake_module(tiny_student, teacher=teacher)
    tok = module.tokenizer
    rows = StyleProbe(task="addition", num_prompts=4).rows

    def distribution(model):
        out = []
        for row in rows:
            enc = prompt_collator(trainer, module).student([row])
            with torch.no_grad():
                out.append(torch.softmax(model(**enc).logits[0, -1, : len(tok)].float(), -1))
        return torch.stack(out).mean(0)

    p_teacher, p_student = distribution(teacher), distribution(tiny_student)
    chars = [tok.decode([int(i)], skip_special_tokens=True) for i in torch.argsort(p_student - p_teacher)]
    chosen = [c for c in chars if len(c) == 1 and c.isalnum()][:6]
    probe = StyleProbe(
        pattern="^[" + "".join(chosen) + "]", task="addition", num_prompts=4, max_new_tokens=1, batch_size=300
    )
    accepted = torch.tensor([tok.decode([i], skip_special_tokens=True) in chosen for i in range(len(tok))])
    expected_teacher, expected_student = float(p_teacher[accepted].sum()), float(p_student[accepted].sum())
    assert expected_teacher - expected_student > 0.12  # the check below tells them apart
    sampled = probe.share(trainer, module, 1.0, 300, writer="teacher")
    assert abs(sampled - expected_teacher) < 0.05  # 1,200 draws: sd <= 0.015


def test_the_teacher_writes_after_its_own_context(fake_trainer, fake_module, tiny_student):
    """With a teacher-only context (`data.prompts.teacher_context`), the teacher's share is measured on
    what the teacher reads in training, the context and then the prompt: its sampled share with one
    new token matches its probability of a detected token after that view, not after the bare
    prompt."""
    from types import SimpleNamespace

    import torch

    from distill.data.prompts import PromptCollator

    teacher = type(tiny_student)(tiny_student.config)
    torch.manual_seed(11)
    for p in teacher.parameters():
        torch.nn.init.normal_(p, std=0.5)
    module = fake_module(tiny_student, teacher=teacher)
    tok = module.tokenizer
    collate = PromptCollator(tok, chat_template=False, teacher_context="9999999999999999 ")
    trainer = fake_trainer(datamodule=SimpleNamespace(collate=collate))
    rows = StyleProbe(task="addition", num_prompts=4).rows

    def probability(context):
        out = []
        for row in rows:
            enc = collate.encode([row], context)
            with torch.no_grad():
                out.append(torch.softmax(teacher(**enc).logits[0, -1, : len(tok)].float(), -1))
        return torch.stack(out).mean(0)

    with_context, bare = probability(collate.teacher_context), probability(None)
    chars = [tok.decode([int(i)], skip_special_tokens=True) for i in torch.argsort(bare - with_context)]
    chosen = [c for c in chars if len(c) == 1 and c.isalnum()][:6]
    accepted = torch.tensor([tok.decode([i], skip_special_tokens=True) in chosen for i in range(len(tok))])
    expected, without = float(with_context[accepted].sum()), float(bare[accepted].sum())
    assert expected - without > 0.08  # the check below (within 0.05, sd <= 0.015) tells the views apart
    probe = StyleProbe(
        pattern="^[" + "".join(chosen) + "]", task="addition", num_prompts=4, max_new_tokens=1, batch_size=300
    )
    assert abs(probe.share(trainer, module, 1.0, 300, writer="teacher") - expected) < 0.05


def test_a_teacher_context_the_probe_rows_cannot_fill_is_refused_before_the_models_load(
    fake_trainer, fake_module, tiny_student
):
    """A context that reads a field of the training task's rows (tinysci's `reference`) cannot be
    written for the probe's Countdown rows: one line at setup, naming the task, the fields and the
    fix, instead of a traceback from the first teacher rollout."""
    from types import SimpleNamespace

    from distill.data.module import PromptFormat

    def trainer_with(context):
        datamodule = SimpleNamespace(prompts=PromptFormat(teacher_context=context), hparams={"task": "tinysci"})
        return fake_trainer(datamodule=datamodule)

    module = fake_module(tiny_student, teacher=tiny_student)
    probe = StyleProbe(task="countdown3", num_prompts=2)
    with pytest.raises(ValueError) as err:
        probe.setup(trainer_with("Background: {reference}"), module, "fit")
    assert str(err.value) == (
        "StyleProbe.task 'countdown3': its rows lack ['reference'], which data.prompts.teacher_context "
        "('Background: {reference}') reads, so the teacher cannot be probed on them; set StyleProbe's "
        "task to one whose rows have them (the training task, 'tinysci')"
    )
    probe.setup(trainer_with("Numbers: {numbers}. "), module, "fit")  # Countdown rows have these
    probe.setup(trainer_with("Answer in Spanish. "), module, "fit")  # no fields at all
    StyleProbe(task="tinysci", num_prompts=2).setup(trainer_with("Background: {reference}"), module, "fit")
