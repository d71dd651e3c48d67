"""RolloutSampler: equivalence with `generate()`, teacher shares, masks, EOS, seeds, validation."""

from __future__ import annotations

import pytest
import torch

from distill.rollout import GRANULARITIES, RolloutSampler
from distill.rollout.special_ids import special_ids

VOCAB = 100  # the char tokenizer's real vocabulary; the models' logits are wider
N = 12


def reference_generate(model, prompts, max_new_tokens: int, eos: int = 2, vocab: int = VOCAB):
    """`generate()` greedy output with ids at or above `vocab` suppressed (as the sampler slices)."""
    return model.generate(
        prompts.input_ids,
        attention_mask=prompts.attention_mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        eos_token_id=eos,
        pad_token_id=0,
        suppress_tokens=list(range(vocab, model.config.vocab_size)) or None,
    )


def teacher_forced_logits(model, batch):
    """Logits over a finished rollout in one pass (no KV cache): an independent recomputation."""
    mask = batch.attention_mask.long()
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions).logits[
            ..., :VOCAB
        ]


def greedy(granularity: str, mix: float, **kw) -> RolloutSampler:
    # Speculative ignores `mix`: top-k = vocabulary never replaces (student), k = 1 always takes
    # the teacher's top-1 under greedy decoding (teacher).
    k = VOCAB if mix == 0 else 1
    return RolloutSampler(
        mix, granularity, max_new_tokens=N, temperature=0, vocab_size=VOCAB, speculative_top_k=k, **kw
    )


def stop_token(model, prompts) -> int:
    """An id the model emits greedily in row 1 at step 3, used as EOS so rows stop at different steps."""
    free = reference_generate(model, prompts, N)[:, prompts.input_ids.shape[1] :]
    eos = int(free[1, 3])
    stops = [(row == eos).nonzero()[0, 0].item() if (row == eos).any() else N for row in free]
    assert len(set(stops)) > 1, stops  # the test needs rows that stop at different steps
    return eos


@pytest.mark.parametrize("granularity", GRANULARITIES)
@pytest.mark.parametrize("mix", [0.0, 1.0])
def test_greedy_end_points_reproduce_generate(granularity, mix, student, teacher, prompts):
    writer = teacher if mix == 1 else student
    eos = stop_token(writer, prompts)
    batch = greedy(granularity, mix, eos_token_id=eos).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask
    )
    expected = reference_generate(writer, prompts, N, eos=eos)
    assert torch.equal(batch.input_ids, expected)
    lengths = batch.completion_mask.sum(1)
    assert (lengths < lengths.max()).any()  # some row stopped early and was padded
    if granularity != "speculative":  # there a proposal the teacher agrees with stays student-written
        assert torch.equal(batch.teacher_token_mask, batch.completion_mask & (mix == 1))


def test_default_vocab_is_smaller_logit_width(student, teacher, prompts):
    """vocab_size=None slices to min(128, 112): the student's full width, so plain generate() agrees."""
    sampler = RolloutSampler(0.0, "sequence", max_new_tokens=N, temperature=0)
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    expected = student.generate(**prompts, do_sample=False, max_new_tokens=N, eos_token_id=2, pad_token_id=0)
    assert torch.equal(batch.input_ids, expected)


def test_padded_ids_never_sampled(student, teacher, prompts):
    """Push all probability onto padded logit columns: the sampler still writes only real ids."""
    for model in (student, teacher):
        with torch.no_grad():
            model.get_output_embeddings().weight[VOCAB:] *= 50
    for granularity in GRANULARITIES:
        sampler = RolloutSampler(0.5, granularity, max_new_tokens=8, vocab_size=VOCAB)
        batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
        assert batch.input_ids[batch.completion_mask].max() < VOCAB


def test_eos_padding_and_masks(student, teacher, prompts):
    eos = stop_token(student, prompts)
    batch = greedy("token", 0.5, eos_token_id=eos).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask, seed=1
    )
    p = batch.prompt_length
    assert p == prompts.input_ids.shape[1]
    assert torch.equal(batch.input_ids[:, :p], prompts.input_ids)
    assert not batch.completion_mask[:, :p].any()
    expected_attention = torch.cat([prompts.attention_mask, batch.completion_mask[:, p:].long()], dim=1)
    assert torch.equal(batch.attention_mask, expected_attention)
    for row, written in zip(batch.input_ids[:, p:], batch.completion_mask[:, p:]):
        n = int(written.sum())
        assert written[:n].all() and not written[n:].any()  # completions are right-padded
        ended = (row[:n] == eos).nonzero()
        if len(ended):  # stopped at its first EOS, then pad only
            assert ended[0, 0] == n - 1 and (row[n:] == 0).all()
        else:
            assert n == batch.input_ids.shape[1] - p
    assert not (batch.teacher_token_mask & ~batch.completion_mask).any()
    assert batch.teacher_generated_tokens + batch.student_generated_tokens == batch.completion_tokens


def test_early_exit_when_all_rows_stop(student, teacher, prompts):
    first = reference_generate(student, prompts, 1)[:, -1]
    sampler = RolloutSampler(
        0.0, "batch", max_new_tokens=N, temperature=0, eos_token_id=first.tolist(), vocab_size=VOCAB
    )
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    assert batch.input_ids.shape[1] == prompts.input_ids.shape[1] + 1
    assert batch.completion_tokens == 3


def test_batch_share_over_many_batches(student, teacher, char_tok):
    enc = char_tok(["7=", "8="], return_tensors="pt", padding=True)
    sampler = RolloutSampler(0.3, "batch", max_new_tokens=1, vocab_size=VOCAB)
    gen = torch.Generator().manual_seed(0)
    shares = [
        sampler.sample(student, teacher, enc.input_ids, enc.attention_mask, generator=gen).teacher_share
        for _ in range(200)
    ]
    assert set(shares) == {0.0, 1.0}  # all-or-nothing per batch
    assert abs(sum(shares) / 200 - 0.3) < 0.1  # 3 sigma for 200 Bernoulli(0.3) draws


def test_sequence_share_exact_per_batch(student, teacher, char_tok):
    enc = char_tok([f"{i}+{i}=" for i in range(10)], return_tensors="pt", padding=True)
    sampler = RolloutSampler(0.3, "sequence", max_new_tokens=2, vocab_size=VOCAB)
    gen = torch.Generator().manual_seed(0)
    chosen = set()
    for _ in range(8):
        batch = sampler.sample(student, teacher, enc.input_ids, enc.attention_mask, generator=gen)
        rows = batch.teacher_token_mask.any(1)
        assert int(rows.sum()) == 3
        # Teacher rows are entirely teacher-written; the other rows entirely student-written.
        assert torch.equal(batch.teacher_token_mask[rows], batch.completion_mask[rows])
        chosen.add(tuple(rows.nonzero().flatten().tolist()))
    assert len(chosen) > 1  # the rows come from a permutation, not a fixed choice


def test_token_share_and_writers(student, teacher, char_tok):
    enc = char_tok([f"{i}*{i}=" for i in range(12)], return_tensors="pt", padding=True)
    # EOS outside the sliced vocabulary: never drawn, so every row runs the full length.
    sampler = RolloutSampler(0.3, "token", max_new_tokens=24, vocab_size=VOCAB, eos_token_id=[VOCAB])
    batch = sampler.sample(student, teacher, enc.input_ids, enc.attention_mask, seed=0)
    assert batch.completion_tokens == 12 * 24
    assert abs(batch.teacher_share - 0.3) < 0.08  # 3 sigma for 288 Bernoulli(0.3) draws
    per_row = batch.teacher_token_mask.sum(1).float() / batch.completion_mask.sum(1)
    assert (per_row > 0).sum() > 6 and (per_row < 1).all()  # mixed within rows, not per row


def test_token_greedy_writer_is_argmax_of_its_model(student, teacher, prompts):
    """Each token flagged teacher is the teacher's argmax given the prefix; the others the student's."""
    batch = greedy("token", 0.5).sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=3)
    p = batch.prompt_length
    s_pred = teacher_forced_logits(student, batch).argmax(-1)[:, p - 1 : -1]
    t_pred = teacher_forced_logits(teacher, batch).argmax(-1)[:, p - 1 : -1]
    written, by_teacher, tokens = (
        batch.completion_mask[:, p:],
        batch.teacher_token_mask[:, p:],
        batch.input_ids[:, p:],
    )
    assert 0 < by_teacher.sum() < written.sum()
    assert torch.equal(tokens[by_teacher], t_pred[by_teacher])
    assert torch.equal(tokens[written & ~by_teacher], s_pred[written & ~by_teacher])
    assert (s_pred != t_pred)[written].any()  # the models disagree, so the check has teeth


def test_speculative_full_vocab_never_replaces(student, teacher, prompts):
    sampler = RolloutSampler(0.7, "speculative", max_new_tokens=N, vocab_size=VOCAB, speculative_top_k=VOCAB)
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
    assert batch.teacher_generated_tokens == 0 and batch.completion_tokens > 2 * N
    sampler.speculative_top_k = 1  # the same draws with a strict teacher: replacements happen
    batch = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
    assert batch.teacher_generated_tokens > 0


def test_speculative_top1_replacements_are_teacher_top1(student, teacher, prompts):
    batch = greedy("speculative", 1.0).sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    p = batch.prompt_length
    s_pred = teacher_forced_logits(student, batch).argmax(-1)[:, p - 1 : -1]
    t_pred = teacher_forced_logits(teacher, batch).argmax(-1)[:, p - 1 : -1]
    replaced, tokens = batch.teacher_token_mask[:, p:], batch.input_ids[:, p:]
    assert replaced.any()
    assert torch.equal(tokens[replaced], t_pred[replaced])
    assert (s_pred[replaced] != t_pred[replaced]).all()  # replaced exactly where the student disagreed
    kept = batch.completion_mask[:, p:] & ~replaced
    assert torch.equal(tokens[kept], s_pred[kept])


def test_sampling_filters_reduce_to_greedy(student, teacher, prompts):
    expected = (
        greedy("sequence", 0.0).sample(student, teacher, prompts.input_ids, prompts.attention_mask).input_ids
    )
    for kw in ({"top_k": 1}, {"top_p": 1e-6}):
        sampler = RolloutSampler(0.0, "sequence", max_new_tokens=N, temperature=1.0, vocab_size=VOCAB, **kw)
        assert torch.equal(
            sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=4).input_ids,
            expected,
        )


@pytest.mark.parametrize("granularity", GRANULARITIES)
def test_seed_determinism(granularity, student, teacher, prompts):
    sampler = RolloutSampler(0.5, granularity, max_new_tokens=N, vocab_size=VOCAB)
    a, b, c = (
        sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=s) for s in (7, 7, 8)
    )
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.teacher_token_mask, b.teacher_token_mask)
    assert not torch.equal(a.input_ids, c.input_ids)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    d = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, generator=g1)
    e = sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask, generator=g2)
    assert torch.equal(d.input_ids, e.input_ids)


def test_seeded_row_independent_of_batch_mates(student, teacher, char_tok):
    sampler = RolloutSampler(1.0, "sequence", max_new_tokens=N, vocab_size=VOCAB)
    full = char_tok(["12 34=46:", "5 6=", "5 6="], return_tensors="pt", padding=True)
    alone = char_tok(["5 6="], return_tensors="pt")
    together = sampler.sample(student, teacher, full.input_ids, full.attention_mask, seed=9).completion_ids()
    single = sampler.sample(student, teacher, alone.input_ids, alone.attention_mask, seed=9).completion_ids()
    assert together[1] == single[0]
    assert together[1] != together[2]  # a repeated prompt gets a fresh sample


def test_forward_token_counts(student, teacher, prompts):
    eos = stop_token(student, prompts)
    batch = greedy("batch", 0.0, eos_token_id=eos).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask
    )
    lengths = batch.completion_mask.sum(1)
    # Prefill of real prompt tokens, then every generated token but each row's last is fed back.
    assert batch.student_forward_tokens == int(prompts.attention_mask.sum() + (lengths - 1).sum())
    assert batch.teacher_forward_tokens == 0 and batch.rollout_seconds > 0
    both = greedy("token", 0.5).sample(student, teacher, prompts.input_ids, prompts.attention_mask, seed=0)
    assert (
        both.student_forward_tokens
        == both.teacher_forward_tokens
        == int(prompts.attention_mask.sum()) + 3 * (N - 1)
    )


def test_modes_restored_and_no_grad(student, teacher, prompts):
    student.train()
    student.model.layers[0].eval()  # a mixed state must come back exactly
    before = {name: m.training for name, m in student.named_modules()}
    batch = RolloutSampler(0.5, "token", max_new_tokens=4, vocab_size=VOCAB).sample(
        student, teacher, prompts.input_ids, prompts.attention_mask
    )
    assert {name: m.training for name, m in student.named_modules()} == before
    assert not teacher.training and not batch.input_ids.requires_grad


def test_special_ids_from_config_and_errors(student, teacher, prompts):
    sampler = RolloutSampler(0.0, "batch", max_new_tokens=2, vocab_size=VOCAB)
    assert special_ids(sampler.eos_token_id, sampler.pad_token_id, student, teacher) == ([2], 0)
    teacher.generation_config.pad_token_id = 5
    with pytest.raises(ValueError, match="disagree on pad_token_id"):
        sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask)
    for model in (student, teacher):
        model.generation_config.eos_token_id = model.config.eos_token_id = None
    with pytest.raises(ValueError, match="eos_token_id is unset"):
        RolloutSampler(0.0, pad_token_id=0).sample(
            student, teacher, prompts.input_ids, prompts.attention_mask
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mix": 1.5}, r"mix must be in \[0, 1\], got 1.5"),
        ({"mix": True}, "mix must be in"),
        ({"granularity": "row"}, "granularity must be one of batch, sequence, token, speculative; got 'row'"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1, got 0"),
        ({"temperature": -1.0}, "temperature must be a finite number >= 0"),
        ({"top_k": 0}, "top_k must be None or an integer >= 1, got 0"),
        ({"top_p": 0.0}, r"top_p must be None or in \(0, 1\], got 0.0"),
        ({"eos_token_id": []}, "eos_token_id must be None"),
        ({"pad_token_id": -1}, "pad_token_id must be None or an id >= 0, got -1"),
        ({"vocab_size": 0}, "vocab_size must be None or an integer >= 1, got 0"),
        ({"speculative_top_k": 0}, "speculative_top_k must be an integer >= 1, got 0"),
    ],
)
def test_constructor_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RolloutSampler(**{"mix": 0.5, **kwargs})


def test_sample_input_validation(student, teacher, prompts):
    sampler = RolloutSampler(0.5, max_new_tokens=2)
    right_padded = prompts.attention_mask.flip(1)
    with pytest.raises(ValueError, match="left-padded"):
        sampler.sample(student, teacher, prompts.input_ids, right_padded)
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        sampler.sample(student, teacher, prompts.input_ids, prompts.attention_mask[:, 1:])
    with pytest.raises(ValueError, match=r"vocab_size must be <= the models' logit widths \(112\), got 120"):
        RolloutSampler(0.5, vocab_size=120).sample(
            student, teacher, prompts.input_ids, prompts.attention_mask
        )
