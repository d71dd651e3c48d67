"""Prompt batches: task rows -> left-padded token tensors, for the student and, with a teacher-only
context, for the teacher.

A teacher-only context is text only the teacher reads: a system prompt ("Reason in Spanish."), or
privileged context from the row itself ("Background: {reasoning}"). It is a `str.format` template
over the row's fields (`{{`/`}}` for literal braces). With plain-text prompts it is put straight
before the prompt, so include any separator (e.g. a newline) in it.

With a chat template it is added to the system message the student's prompt has, so that it is
the only difference between the two prompts: after a blank line, to the row's own system message,
else to the template's default one (Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a
helpful assistant.", which a system message of its own would otherwise replace: the teacher would
differ from the student in two ways, not one). A template that writes a system block
without a default text (Llama 3.x: its "Cutting Knowledge Date" lines) gets the context in that
block; one that writes none gets a system message holding the context. The default is found by
rendering the row with and without a probe system message (`template_default_system`).

The student's prompt is unchanged unless a `student_context` is given the same way (rarely
wanted: a sweep's teacher reference uses it to test the teacher, in the student's place, with the
context it reads in training).
"""

from __future__ import annotations

import string

import torch


def context_fields(template: str, owner: str = "data.prompts.teacher_context") -> list[str]:
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


def render_context(template: str, row: dict, owner: str = "data.prompts.teacher_context") -> str:
    """`template` filled from `row`; a missing field names the fields the row has."""
    missing = [f for f in context_fields(template, owner) if f not in row]
    if missing:
        raise ValueError(
            f"{owner} reads row field(s) {missing}, which the task's rows lack; they have {sorted(row)}"
        )
    return template.format_map({k: row[k] for k in context_fields(template, owner)})


# A system message no template writes by itself: where it lands shows where system text goes.
_PROBE = "@@distill-system-probe@@"


def template_default_system(render, messages: list[dict]) -> str | None:
    """The system text that `render` (messages -> a chat template's text) writes for `messages`,
    which have no system message: the template's default system prompt, "" for a system block
    without one (Llama 3.x), None when it writes no system block (nothing to keep)."""
    bare = render(messages)
    before, found, after = render([{"role": "system", "content": _PROBE}, *messages]).partition(_PROBE)
    fits = len(bare) >= len(before) + len(after) and bare.startswith(before) and bare.endswith(after)
    if not found or _PROBE in after or not fits:
        return None
    return bare[len(before) : len(bare) - len(after)]


def with_system(messages: list[dict], context: str, default: str | None = None) -> list[dict]:
    """`messages` with `context` in the system message: after a blank line, to the text of the
    messages' own system message, else to `default` (the template's default system prompt)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{context}")
        return [first, *messages[1:]]
    content = f"{default}\n\n{context}" if default else context
    return [{"role": "system", "content": content}, *messages]


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
        self, rows: list[dict], context: str | None = None, owner: str = "data.prompts.teacher_context"
    ) -> dict:
        """Left-padded `input_ids` and `attention_mask` of the rows' prompts, with `context` (a
        template, named `owner` in errors) given as context when not None."""
        if self.chat_template:
            texts = []
            for r in rows:
                messages = r["messages"]
                if context is not None:
                    own = bool(messages) and messages[0].get("role") == "system"
                    default = None if own else template_default_system(self.render, messages)
                    messages = with_system(messages, render_context(context, r, owner), default)
                texts.append(self.render(messages))
            enc = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        else:
            prefix = [render_context(context, r, owner) if context is not None else "" for r in rows]
            enc = self.tokenizer(
                [p + r["prompt"] for p, r in zip(prefix, rows)], return_tensors="pt", padding=True
            )
        return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}

    def render(self, messages: list[dict]) -> str:
        """`messages` through the tokenizer's chat template, ready for the reply."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.template_kwargs
        )

    def student(self, rows: list[dict]) -> dict:
        """The student's prompt batch alone (what callbacks that roll out the student read)."""
        return self.encode(rows, self.student_context, "data.prompts.student_context")

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
