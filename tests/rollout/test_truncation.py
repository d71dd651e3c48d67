"""`RolloutBatch.truncated_rows`: rows cut off by `max_new_tokens`."""

from __future__ import annotations

import torch

from distill.rollout import RolloutSampler


def test_truncated_rows_are_the_rows_that_wrote_no_eos(tiny_student, char_tok):
    prompts = ["Use 1 2 3 to make 6.\n", "12+7=", "abc", "Use 4 5 to make 9.\n"] * 4
    enc = char_tok(prompts, return_tensors="pt", padding=True)
    eos = char_tok.eos_token_id
    # A random model: make EOS likely, so some rows end and some are cut.
    with torch.no_grad():
        tiny_student.lm_head.weight[eos] += 3 * tiny_student.lm_head.weight.norm(dim=1).mean()
    for budget in (1, 4, 12):
        sampler = RolloutSampler(mix=0.0, max_new_tokens=budget, temperature=1.0).use_tokenizer(char_tok)
        rollout = sampler.sample(tiny_student, tiny_student, enc["input_ids"], enc["attention_mask"], seed=1)
        wrote_eos = [eos in row for row in rollout.completion_ids()]
        assert rollout.truncated_rows == wrote_eos.count(False)
        lengths = rollout.completion_mask.sum(1)
        assert all(n == budget for n, ended in zip(lengths.tolist(), wrote_eos) if not ended)
    assert 0 < rollout.truncated_rows < len(prompts)  # both kinds of row at the largest budget
