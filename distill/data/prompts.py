"""Prompt batches: task rows -> left-padded token tensors, for the student and, with a teacher-only
context, for the teacher.

A teacher-only context is text only the teacher reads: a system prompt ("Reason in Spanish."), or
privileged context from the row itself ("Background: {reasoning}"). It is a `str.format` template
over the row's fields (`{{`/`}}` for literal braces). With a chat template it becomes a system
message (joined after a blank line to a system message the row already has); with plain-text
prompts it is put straight before the prompt, so include any separator (e.g. a newline) in it.
The student's prompt is unchanged unless a `student_context` is given the same way (rarely
wanted: a sweep's teacher reference uses it to test the teacher, in the student's place, with the
context it reads in training).
"""

from __future__ import annotations

import string

import torch


def context_fields(template: str, owner: str = "data.teacher_context") -> list[str]:
    """The row fields `template` reads; raises ValueError (naming `owner`) for a malformed
    template or a field that is not a plain name (no attribute or index access)."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as err:
        raise ValueError(f"{owner} is not a valid format template ({err}): {template!r}") from None
    fields = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"{owner} may only name row fields as {{field}} (no indexing, attributes, format specs "
                f"or conversions), got {{{name}{'!' + conversion if conversion else ''}"
                f"{':' + spec if spec else ''}}} in {template!r}"
            )
        fields.append(name)
    return fields


def render_context(template: str, row: dict, owner: str = "data.teacher_context") -> str:
    """`template` filled from `row`; a missing field names the fields the row has."""
    missing = [f for f in context_fields(template, owner) if f not in row]
    if missing:
        raise ValueError(
            f"{owner} reads row field(s) {missing}, which the task's rows lack; they have {sorted(row)}"
        )
    return template.format_map({k: row[k] for k in context_fields(template, owner)})


def with_system(messages: list[dict], context: str) -> list[dict]:
    """`messages` with `context` as the system message (after an existing one's text)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{context}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": context}, *messages]


class PromptCollator:
    """Rows -> left-padded prompt tensors (plain prompt, or the tokenizer's chat template).

    With `teacher_context` the batch also holds `teacher_input_ids` / `teacher_attention_mask`: the
    same rows as the teacher reads them; `student_context` is put in the student's own prompt
    (see the module docstring)."""

    def __init__(
        self,
        tokenizer,
        chat_template: bool,
        chat_template_kwargs: dict | None = None,
        teacher_context: str | None = None,
        student_context: str | None = None,
    ):
        self.tokenizer, self.chat_template = tokenizer, chat_template
        self.template_kwargs = dict(chat_template_kwargs or {})
        for name, context in (("teacher_context", teacher_context), ("student_context", student_context)):
            if context is not None:
                if not isinstance(context, str) or not context:
                    raise ValueError(f"data.{name} must be None or a non-empty string, got {context!r}")
                context_fields(context, f"data.{name}")
        self.teacher_context, self.student_context = teacher_context, student_context

    def encode(
        self, rows: list[dict], context: str | None = None, owner: str = "data.teacher_context"
    ) -> dict:
        """Left-padded `input_ids` and `attention_mask` of the rows' prompts, with `context` (a
        template, named `owner` in errors) given as context when not None."""
        if self.chat_template:
            texts = []
            for r in rows:
                messages = r["messages"]
                if context is not None:
                    messages = with_system(messages, render_context(context, r, owner))
                texts.append(
                    self.tokenizer.apply_chat_template(
                        messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
                    )
                )
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        else:
            prefix = [render_context(context, r, owner) if context is not None else "" for r in rows]
            enc = self.tokenizer(
                [p + r["prompt"] for p, r in zip(prefix, rows)], return_tensors="pt", padding=True
            )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def student(self, rows: list[dict]) -> dict:
        """The student's prompt batch alone (what callbacks that roll out the student read)."""
        return self.encode(rows, self.student_context, "data.student_context")

    def __call__(self, rows: list[dict]) -> dict:
        batch = {**self.student(rows), "rows": rows}
        if self.teacher_context is not None:
            teacher = self.encode(rows, self.teacher_context)
            batch["teacher_input_ids"] = teacher["input_ids"]
            batch["teacher_attention_mask"] = teacher["attention_mask"]
        return batch


def repeat_rows(batch: dict, group_size: int) -> dict:
    """A prompt batch with each row repeated `group_size` times (consecutive), tensors and rows."""
    if group_size == 1:
        return batch
    out = {k: v.repeat_interleave(group_size, dim=0) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    out["rows"] = [row for row in batch["rows"] for _ in range(group_size)]
    return out
