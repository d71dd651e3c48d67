"""Special ids as hub instruct models have them: Llama-3-Instruct has no pad id anywhere and ends
turns with a second EOS id its tokenizer does not name; Qwen2.5 lists two EOS ids and a pad id.
The sampler must decode them without being told, and prompts must not change from day to day."""

from __future__ import annotations

import time

import pytest
import torch

from distill.data.prompts import PromptCollator
from distill.models.tiny import char_tokenizer
from distill.rollout import RolloutSampler
from distill.rollout.special_ids import special_ids

VOCAB = 104
EOT = 50  # an ordinary char id standing in for Llama-3's <|eot_id|>


def _llama_shaped(model):
    """No pad id in config or generation config; generation config lists two EOS ids."""
    model.config.pad_token_id = model.generation_config.pad_token_id = None
    model.generation_config.eos_token_id = [2, EOT]
    return model


def _no_pad_tokenizer():
    tok = char_tokenizer()
    tok.pad_token = None
    return tok


def test_llama_shaped_ids_merge_eos_and_fall_back_to_an_eos_for_pad(student, teacher):
    student, teacher = _llama_shaped(student), _llama_shaped(teacher)
    assert special_ids(None, None, student, teacher) == ([2, EOT], 2)
    # the tokenizer's EOS joins the list; its pad is used before falling back to an EOS
    assert special_ids(None, None, student, teacher, ([7], None)) == ([2, EOT, 7], 2)
    assert special_ids(None, None, student, teacher, ([2], 0)) == ([2, EOT], 0)
    # ids given to the sampler win
    assert special_ids([9], 3, student, teacher, ([2], 0)) == ([9], 3)


def test_qwen_shaped_ids_keep_the_configured_pad(student, teacher):
    for model in (student, teacher):
        model.generation_config.eos_token_id, model.generation_config.pad_token_id = [EOT, 2], 0
    assert special_ids(None, None, student, teacher, ([2], 0)) == ([EOT, 2], 0)


def test_sampler_decodes_a_llama_shaped_pair_stopping_at_either_eos(student, teacher, prompts):
    student, teacher = _llama_shaped(student), _llama_shaped(teacher)
    tok = _no_pad_tokenizer()
    sampler = RolloutSampler(0.5, "token", max_new_tokens=12, temperature=1.0).use_tokenizer(tok)
    assert sampler.vocab_size == VOCAB and sampler.tokenizer_ids == ([2], None)
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    comp = batch.input_ids[:, batch.prompt_length :]
    mask = batch.completion_mask[:, batch.prompt_length :]
    for row, keep in zip(comp, mask):
        written = row[keep]
        ends = [i for i, t in enumerate(written.tolist()) if t in (2, EOT)]
        assert not ends or ends[0] == len(written) - 1  # nothing is written after either EOS
        assert torch.all(row[~keep] == 2)  # padded with the first EOS


DATED = (
    "{% if date_string is not defined %}{% set date_string = strftime_now('%d %b %Y') %}{% endif %}"
    "Today: {{ date_string }}|{% for m in messages %}{{ m['content'] }}{% endfor %}="
)


def test_a_fixed_date_string_keeps_chat_prompts_the_same_every_day():
    tok = char_tokenizer()
    tok.chat_template = DATED
    rows = [{"prompt": "1 2=3:", "messages": [{"role": "user", "content": "1 2=3:"}]}]
    fixed = PromptCollator(tok, chat_template=True, chat_template_kwargs={"date_string": "26 Jul 2024"})
    assert tok.decode(fixed(rows)["input_ids"][0]) == "Today: 26 Jul 2024|1 2=3:="
    today = tok.decode(PromptCollator(tok, chat_template=True)(rows)["input_ids"][0])
    assert today == f"Today: {time.strftime('%d %b %Y')}|1 2=3:="


def test_without_any_eos_the_error_says_where_to_set_it(student, teacher):
    for model in (student, teacher):
        model.generation_config.eos_token_id = model.config.eos_token_id = None
    with pytest.raises(ValueError, match="eos_token_id is unset: pass it to RolloutSampler, or set it in"):
        special_ids(None, None, student, teacher)
