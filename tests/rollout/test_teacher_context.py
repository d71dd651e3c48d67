"""Teacher-only context: the teacher decodes and is scored after a prompt of its own, the student
after its own, both on the same completion tokens."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from distill.data.prompts import PromptCollator
from distill.models.tiny import char_tokenizer
from distill.rollout import GRANULARITIES, RolloutBatch, RolloutSampler
from distill.rollout.cache import RolloutCache

from .test_rollout_sampler import VOCAB, N, greedy, reference_generate, teacher_forced_logits

CONTEXT = "9 9=18:"  # plain-text context: put before the teacher's prompt


@pytest.fixture
def views(char_tok):
    rows = [{"prompt": p, "messages": [{"role": "user", "content": p}]} for p in ("12 34=46:", "5 6=", "ab")]
    return PromptCollator(char_tok, chat_template=False, teacher_context=CONTEXT)(rows)


def test_the_collator_gives_the_teacher_its_context_and_the_student_none(views, char_tok):
    student = [char_tok.decode(r, skip_special_tokens=True) for r in views["input_ids"]]
    teacher = [char_tok.decode(r, skip_special_tokens=True) for r in views["teacher_input_ids"]]
    assert student == ["12 34=46:", "5 6=", "ab"]
    assert teacher == [CONTEXT + s for s in student]
    assert views["teacher_attention_mask"][:, -1].all() and not views["teacher_attention_mask"][:, 0].all()


def _sample(sampler, student, teacher, views, **kw):
    return sampler.sample(
        student,
        teacher,
        views["input_ids"],
        views["attention_mask"],
        teacher_input_ids=views["teacher_input_ids"],
        teacher_attention_mask=views["teacher_attention_mask"],
        **kw,
    )


@pytest.mark.parametrize("granularity", ["batch", "sequence"])
def test_teacher_rows_are_generate_after_the_teacher_prompt(granularity, student, teacher, views):
    batch = _sample(greedy(granularity, 1.0), student, teacher, views)
    t_prompts = type(
        "P", (), {"input_ids": views["teacher_input_ids"], "attention_mask": views["teacher_attention_mask"]}
    )
    expected = reference_generate(teacher, t_prompts, N)[:, views["teacher_input_ids"].shape[1] :]
    got = batch.input_ids[:, batch.prompt_length :]
    assert torch.equal(
        got[batch.completion_mask[:, batch.prompt_length :]],
        expected[batch.completion_mask[:, batch.prompt_length :]],
    )
    # Without the context the teacher writes something else (the context matters here).
    plain = greedy(granularity, 1.0).sample(student, teacher, views["input_ids"], views["attention_mask"])
    assert plain.completion_ids() != batch.completion_ids()
    # The teacher's view ends in the very same completion columns; its prompt is the context one.
    width = batch.completion_width
    assert torch.equal(batch.teacher_input_ids[:, -width:], batch.input_ids[:, -width:])
    assert torch.equal(batch.teacher_input_ids[:, :-width], views["teacher_input_ids"])
    assert torch.equal(batch.teacher_attention_mask[:, -width:], batch.attention_mask[:, -width:])
    assert batch.teacher_inputs()[0] is batch.teacher_input_ids


def test_student_rows_ignore_the_teacher_context(student, teacher, views):
    with_context = _sample(greedy("sequence", 0.0), student, teacher, views)
    without = greedy("sequence", 0.0).sample(student, teacher, views["input_ids"], views["attention_mask"])
    assert torch.equal(with_context.input_ids, without.input_ids)
    assert without.teacher_input_ids is None and without.teacher_inputs()[0] is without.input_ids


def test_token_mixing_reads_each_model_on_its_own_prompt(student, teacher, views):
    """Greedy token mixing: every teacher-written token is the argmax of the teacher's logits over
    its own view, every student token the argmax over the student's (one full forward each: an
    independent recomputation of the KV-cached decode)."""
    batch = _sample(greedy("token", 0.5), student, teacher, views, seed=3)
    assert 0 < batch.teacher_share < 1
    width = batch.completion_width
    s_logits = teacher_forced_logits(student, batch)[:, -width - 1 : -1]
    t_view = type(
        "V", (), {"input_ids": batch.teacher_input_ids, "attention_mask": batch.teacher_attention_mask}
    )
    t_logits = teacher_forced_logits(teacher, t_view)[:, -width - 1 : -1]
    written = batch.completion_mask[:, -width:]
    by_teacher = batch.teacher_token_mask[:, -width:]
    tokens = batch.input_ids[:, -width:]
    expected = torch.where(by_teacher, t_logits.argmax(-1), s_logits.argmax(-1))
    assert torch.equal(tokens[written], expected[written])
    # The teacher's forward tokens count its own (longer) prompt.
    assert batch.teacher_forward_tokens - batch.student_forward_tokens == int(
        views["teacher_attention_mask"].sum() - views["attention_mask"].sum()
    )


def test_speculative_replacements_use_the_teacher_prompt(student, teacher, views):
    batch = _sample(greedy("speculative", 1.0), student, teacher, views)  # top-1: all teacher
    t_prompts = type(
        "P", (), {"input_ids": views["teacher_input_ids"], "attention_mask": views["teacher_attention_mask"]}
    )
    expected = reference_generate(teacher, t_prompts, N)[:, views["teacher_input_ids"].shape[1] :]
    mask = batch.completion_mask[:, batch.prompt_length :]
    assert torch.equal(batch.input_ids[:, batch.prompt_length :][mask], expected[mask])


def test_the_cache_keeps_teacher_rows_of_each_context_apart(student, teacher, views, tmp_path, char_tok):
    sampler = RolloutSampler(1.0, "sequence", max_new_tokens=N, vocab_size=VOCAB, cache_dir=str(tmp_path))
    first = _sample(sampler, student, teacher, views, seed=5)
    again = _sample(sampler, student, teacher, views, seed=5)
    assert again.cached_teacher_rows == 3 and again.completion_ids() == first.completion_ids()
    plain = sampler.sample(student, teacher, views["input_ids"], views["attention_mask"], seed=5)
    assert plain.cached_teacher_rows == 0  # same student prompts, no context: a different key
    other = PromptCollator(char_tok, chat_template=False, teacher_context="7 1=8:")(
        [{"prompt": p} for p in ("12 34=46:", "5 6=", "ab")]
    )
    assert _sample(sampler, student, teacher, other, seed=5).cached_teacher_rows == 0
    assert len(list(RolloutCache(tmp_path).directory.rglob("*.json"))) == 9


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_the_teacher_prompt_is_checked(granularity, student, teacher, views):
    sampler = greedy(granularity, 0.5)
    ids, mask = views["input_ids"], views["attention_mask"]
    with pytest.raises(ValueError, match="must be given together"):
        sampler.sample(student, teacher, ids, mask, teacher_input_ids=views["teacher_input_ids"])
    with pytest.raises(ValueError, match="teacher_input_ids must have 3 rows like input_ids, got 2"):
        sampler.sample(
            student,
            teacher,
            ids,
            mask,
            teacher_input_ids=views["teacher_input_ids"][:2],
            teacher_attention_mask=views["teacher_attention_mask"][:2],
        )
    with pytest.raises(ValueError, match="left-padded"):
        sampler.sample(
            student,
            teacher,
            ids,
            mask,
            teacher_input_ids=views["teacher_input_ids"].flip(1),
            teacher_attention_mask=views["teacher_attention_mask"].flip(1),
        )


def test_the_batch_checks_and_moves_the_teacher_view(student, teacher, views):
    batch = _sample(greedy("sequence", 1.0), student, teacher, views)
    fields = dataclasses.asdict(batch)  # the DataModule's reuse state round-trips like this
    assert torch.equal(RolloutBatch(**fields).teacher_input_ids, batch.teacher_input_ids)
    moved = batch.to("cpu")
    assert moved.teacher_attention_mask is not None
    broken = dict(fields, teacher_input_ids=fields["teacher_input_ids"].clone())
    broken["teacher_input_ids"][0, -1] += 1
    with pytest.raises(ValueError, match="same completion columns"):
        RolloutBatch(**broken)
    with pytest.raises(ValueError, match="given together"):
        RolloutBatch(**dict(fields, teacher_attention_mask=None))
    short = dict(
        fields,
        teacher_input_ids=fields["input_ids"][:, -2:],
        teacher_attention_mask=fields["attention_mask"][:, -2:],
    )
    with pytest.raises(ValueError, match=r"prompt \+ \d+ completion columns"):
        RolloutBatch(**short)


# --- the collator's context: chat templates, row fields, errors ----------------------------------

CHAT = "{% for m in messages %}<{{ m['role'][0] }}>{{ m['content'] }}{% endfor %}="


def _chat_tok():
    tok = char_tokenizer()
    tok.chat_template = CHAT
    return tok


def test_with_a_chat_template_the_context_is_a_system_message():
    tok = _chat_tok()
    rows = [
        {"prompt": "1 2", "messages": [{"role": "user", "content": "1 2"}], "reasoning": "r1"},
        {
            "prompt": "3",
            "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "3"}],
            "reasoning": "r2",
        },
    ]
    batch = PromptCollator(tok, chat_template=True, teacher_context="hint {reasoning}")(rows)
    decode = lambda ids: [tok.decode(r, skip_special_tokens=True) for r in ids]  # noqa: E731
    assert decode(batch["input_ids"]) == ["<u>1 2=", "<s>s<u>3="]
    assert decode(batch["teacher_input_ids"]) == ["<s>hint r1<u>1 2=", "<s>s\n\nhint r2<u>3="]


def test_context_templates_are_checked_before_any_model_loads():
    tok = _chat_tok()
    with pytest.raises(ValueError, match=r"only name row fields as \{field\}.*\{x\.y\}"):
        PromptCollator(tok, chat_template=True, teacher_context="a {x.y}")
    with pytest.raises(ValueError, match=r"only name row fields.*\{x:>3\}"):
        PromptCollator(tok, chat_template=True, teacher_context="{x:>3}")
    with pytest.raises(ValueError, match="not a valid format template"):
        PromptCollator(tok, chat_template=True, teacher_context="a {")
    with pytest.raises(ValueError, match="non-empty string"):
        PromptCollator(tok, chat_template=True, teacher_context="")
    collate = PromptCollator(tok, chat_template=False, teacher_context="{support} ")
    with pytest.raises(
        ValueError, match=r"reads row field\(s\) \['support'\].*they have \['messages', 'prompt'\]"
    ):
        collate([{"prompt": "1", "messages": []}])
    literal = PromptCollator(tok, chat_template=False, teacher_context="{{a}} ")(
        [{"prompt": "1", "messages": []}]
    )
    assert tok.decode(literal["teacher_input_ids"][0], skip_special_tokens=True) == "{a} 1"
