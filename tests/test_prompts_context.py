"""A teacher-only context with real chat templates' system-prompt habits: the teacher's prompt is
the student's with the context inserted, and nothing else changed.

The templates are minimal copies of the real ones' system handling: Qwen2.5 writes its default
system prompt when the messages have none (and drops it when they have one); Llama 3.1 always
writes a system block that opens with its "Cutting Knowledge Date" lines."""

from __future__ import annotations

import pytest

from distill.data import prompts
from distill.data.prompts import PromptCollator
from distill.models.tiny import char_tokenizer

QWEN_DEFAULT = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QWEN_DEFAULT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
LLAMA31 = (
    "{{- bos_token }}"
    "{%- if not date_string is defined %}{%- set date_string = '26 Jul 2024' %}{%- endif %}"
    "{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Cutting Knowledge Date: December 2023\\n' }}"
    "{{- 'Today Date: ' + date_string + '\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content']|trim"
    " + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
# No default system prompt and no system block unless given (as the Qwen3 and Mistral templates).
PLAIN = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}="
CONTEXT = "Razona en espanol. Background: {reasoning}"


def _tok(template: str):
    tok = char_tokenizer()
    tok.chat_template = template
    return tok


def _rows():
    return [
        {"prompt": "What is 2 + 3?", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "reasoning": "r1"},
        {"prompt": "Name a gas.", "messages": [{"role": "user", "content": "Name a gas."}], "reasoning": "r2"},
    ]  # fmt: skip


def _texts(tok, ids, mask) -> list[str]:
    return [tok.decode(row[keep.bool()]) for row, keep in zip(ids, mask)]


def _ids(ids, mask) -> list[list[int]]:
    return [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]


def _inserted(student, teacher):
    """Where `teacher` (a text or token ids) differs from `student` by one insertion, and what was
    inserted; fails when they differ otherwise."""
    start = 0
    while start < len(student) and student[start] == teacher[start]:
        start += 1
    end = 0
    while end < len(student) - start and student[-1 - end] == teacher[-1 - end]:
        end += 1
    assert start + end == len(student), "the teacher's prompt differs by more than one insertion"
    return start, teacher[start : len(teacher) - end]


@pytest.mark.parametrize("template", [QWEN25, LLAMA31], ids=["qwen2.5", "llama3.1"])
def test_the_teacher_reads_the_students_prompt_with_the_context_inserted_and_nothing_else(template):
    tok = _tok(template)
    rows = _rows()
    batch = PromptCollator(tok, chat_template=True, teacher_context=CONTEXT)(rows)
    students = _texts(tok, batch["input_ids"], batch["attention_mask"])
    teachers = _texts(tok, batch["teacher_input_ids"], batch["teacher_attention_mask"])
    for row, student, teacher in zip(rows, students, teachers):
        at, inserted = _inserted(student, teacher)
        assert inserted.strip() == CONTEXT.format(reasoning=row["reasoning"])
        if template is QWEN25:  # the default system prompt stays, the context follows it
            assert student.startswith(f"<|im_start|>system\n{QWEN_DEFAULT}<|im_end|>")
            assert teacher.startswith(f"<|im_start|>system\n{QWEN_DEFAULT}\n\nRazona en espanol.")
            assert inserted.startswith("\n\n")
        else:  # in Llama's system block, after its date lines
            assert student[:at].endswith("Today Date: 26 Jul 2024\n\n") and inserted == inserted.strip()
    # token for token, too: the student's ids with the context's ids inserted
    pairs = zip(
        _ids(batch["input_ids"], batch["attention_mask"]),
        _ids(batch["teacher_input_ids"], batch["teacher_attention_mask"]),
    )
    for row, (s_ids, t_ids) in zip(rows, pairs):
        assert tok.decode(_inserted(s_ids, t_ids)[1]).strip() == CONTEXT.format(reasoning=row["reasoning"])


def test_a_student_context_keeps_the_template_default_too():
    tok = _tok(QWEN25)
    rows = _rows()
    batch = PromptCollator(tok, chat_template=True, teacher_context=CONTEXT, student_context=CONTEXT)(rows)
    assert batch["input_ids"].tolist() == batch["teacher_input_ids"].tolist()
    assert QWEN_DEFAULT in _texts(tok, batch["input_ids"], batch["attention_mask"])[0]


def test_the_template_default_system_prompt_is_found_by_rendering():
    messages = [{"role": "user", "content": "hi"}]
    for template, default in ((QWEN25, QWEN_DEFAULT), (LLAMA31, ""), (PLAIN, None)):
        collate = PromptCollator(_tok(template), chat_template=True)
        assert prompts.template_default_system(collate.render, messages) == default


def test_a_rows_own_system_message_or_a_template_without_a_system_block():
    rows = [
        {"prompt": "q", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}]},
    ]  # fmt: skip
    for template in (QWEN25, LLAMA31):
        tok = _tok(template)
        batch = PromptCollator(tok, chat_template=True, teacher_context="Think in Spanish.")(rows)
        student = _texts(tok, batch["input_ids"], batch["attention_mask"])[0]
        teacher = _texts(tok, batch["teacher_input_ids"], batch["teacher_attention_mask"])[0]
        assert _inserted(student, teacher)[1] == "\n\nThink in Spanish."
        assert QWEN_DEFAULT not in teacher  # the row's system message replaces it for both
    tok = _tok(PLAIN)
    batch = PromptCollator(tok, chat_template=True, teacher_context="Think in Spanish.")(_rows()[:1])
    assert _texts(tok, batch["teacher_input_ids"], batch["teacher_attention_mask"]) == [
        "<system>Think in Spanish.<user>What is 2 + 3?="
    ]
