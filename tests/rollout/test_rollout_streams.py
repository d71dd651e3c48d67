"""Keyed per-row random streams: the counter-based hash, inverse-CDF sampling, batch invariance."""

from __future__ import annotations

import pytest
import torch

from distill.errors import Diverged
from distill.rollout import RolloutSampler
from distill.rollout.decoding import choose_tokens, filter_logits
from distill.rollout.sampler import token_rule
from distill.rollout.streams import PURPOSES, RowStreams, inverse_cdf, keyed_uniform, mix64, stream_key

CPU = torch.device("cpu")
U64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
VOCAB = 100  # the char tokenizer's real vocabulary
N = 12


def splitmix64(seed: int, n: int) -> list[int]:
    """Reference SplitMix64 (Steele, Lea & Flood 2014; Vigna's C code) in unsigned Python ints."""
    out, state = [], seed
    for _ in range(n):
        state = (state + GOLDEN) & U64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & U64
        out.append(z ^ (z >> 31))
    return out


def as_int64(values: list[int]) -> torch.Tensor:
    return torch.tensor([v - (1 << 64) if v >> 63 else v for v in values], dtype=torch.int64)


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = probs > 0
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def test_mix64_matches_splitmix64_reference():
    # Published SplitMix64 outputs for seed 1234567 anchor the reference implementation.
    assert splitmix64(1234567, 5) == [
        6457827717110365317,
        3203168211198807973,
        9817491932198370423,
        4593380528125082431,
        16408922859458223821,
    ]
    # The int64 tensor version (wrap-around multiply, masked shifts) agrees bit for bit, including
    # on words with the top bit set, where an arithmetic shift or a saturating multiply would not.
    states = [(s + GOLDEN * k) & U64 for s in (0, 1, 1234567, 2**63 - 1, 2**63, U64) for k in (1, 2, 3)]
    expected = [splitmix64((st - GOLDEN) & U64, 1)[0] for st in states]
    assert [v & U64 for v in mix64(as_int64(states)).tolist()] == expected
    assert stream_key(1234567) & U64 == 6457827717110365317  # a row key is SplitMix64's first output


def test_uniforms_in_unit_interval_and_uniform():
    keys = torch.tensor([stream_key(s) for s in range(20000)])
    u = keyed_uniform(keys, 3, "token")
    assert u.dtype == torch.float64 and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.bincount((u * 20).long(), minlength=20).double()
    assert chi_square(counts, torch.full((20,), 1 / 20, dtype=torch.float64)) < 50  # df 19, p ~ 1e-4


def test_streams_differ_by_seed_position_and_purpose():
    keys = torch.tensor([stream_key(s) for s in range(20000)])
    base = keyed_uniform(keys, 0, "token")
    others = [
        keyed_uniform(keys, 1, "token"),
        keyed_uniform(keys, 0, "mix"),
        keyed_uniform(keys, 0, "replacement"),
    ]
    others.append(keyed_uniform(torch.tensor([stream_key(s) for s in range(1, 20001)]), 0, "token"))
    for other in others:
        assert not torch.equal(base, other)
        assert int((base == other).sum()) == 0
        # Independent-looking: correlation within ~4 standard errors (1/sqrt(20000) = 0.007) of 0.
        assert abs(float(torch.corrcoef(torch.stack([base, other]))[0, 1])) < 0.03
    assert len(set(PURPOSES.values())) == len(PURPOSES)


def test_row_draws_independent_of_batch_and_position():
    probs = torch.softmax(torch.randn(1, 40, generator=torch.Generator().manual_seed(0)), -1)
    alone = RowStreams.per_row([7], CPU)
    for seeds, row in (([7, 1, 2], 0), ([3, 7], 1), ([5, 6, 8, 9, 10, 7, 11], 5)):
        mates = RowStreams.per_row(seeds, CPU)
        for position in (0, 1, 17, 31, 32, 70):  # across the blocks that RowStreams hashes at once
            for purpose in PURPOSES:
                batch_probs = probs.repeat(len(seeds), 1)
                ours = mates.at(position).categorical(batch_probs, purpose)[row]
                assert ours == alone.at(position).categorical(probs, purpose)[0]
                assert mates.at(position).uniform(len(seeds), purpose)[row] == alone.at(position).uniform(
                    1, purpose
                )
        assert torch.equal(mates.subset([row]).keys, alone.keys)
    # Looked-up uniforms are the direct hash of (key, position, purpose).
    keys = RowStreams.per_row([7, 8], CPU)
    for position in (40, 3, 63, 64):
        for purpose in PURPOSES:
            assert torch.equal(
                keys.at(position).uniform(2, purpose), keyed_uniform(keys.keys, position, purpose)
            )


def test_inverse_cdf_matches_probabilities():
    """Frequencies over 40000 rows against known probabilities: an off-by-one in `searchsorted`
    (shifting each token's mass to a neighbour) or an argmax would give a chi-square in the thousands."""
    probs = torch.tensor([0.05, 0.3, 0.0, 0.15, 0.4, 0.07, 0.03])
    n = 40000
    draws = RowStreams.per_row(range(n), CPU).at(0).categorical(probs.repeat(n, 1))
    counts = torch.bincount(draws, minlength=7).double()
    assert counts[2] == 0  # a zero-probability token is never drawn
    assert chi_square(counts, probs.double()) < 25  # df 5: p ~ 1e-4
    # One row along its positions is as good a sample as many rows at one position.
    row = RowStreams.per_row([123], CPU)
    along = torch.cat([row.at(t).categorical(probs[None]) for t in range(4000)])
    assert chi_square(torch.bincount(along, minlength=7).double(), probs.double()) < 25


def test_inverse_cdf_edges_skip_zero_probability_tokens():
    probs = torch.tensor([[0.0, 0.0, 0.5, 0.0, 0.5, 0.0, 0.0]] * 3)
    u = torch.tensor([0.0, 0.5, 1 - 2.0**-53], dtype=torch.float64)
    assert inverse_cdf(probs, u).tolist() == [2, 4, 4]
    # Unnormalised rows are scaled by their total.
    assert inverse_cdf(torch.tensor([[2.0, 6.0]]), torch.tensor([0.3], dtype=torch.float64)).tolist() == [1]
    # u * total rounding up to the total (u = 1 stands in for it) still picks a token with p > 0.
    assert inverse_cdf(probs[:1], torch.tensor([1.0], dtype=torch.float64)).tolist() == [4]


@pytest.mark.parametrize(("top_k", "top_p"), [(3, None), (None, 0.5), (5, 0.8)])
def test_filtered_tokens_never_drawn(top_k, top_p):
    n = 5000
    logits = torch.randn(n, 30, generator=torch.Generator().manual_seed(1)) * 2
    kept = ~torch.isinf(filter_logits(logits, 1.0, top_k, top_p))
    draws = choose_tokens(logits, RowStreams.per_row(range(n), CPU).at(2), 1.0, top_k, top_p)
    assert kept.gather(1, draws[:, None]).all()
    assert (kept.sum(-1) > 1).any()  # some rows had a choice, so the draws were not forced


def test_greedy_ignores_streams():
    logits = torch.randn(8, 30, generator=torch.Generator().manual_seed(2))
    for streams in (RowStreams.per_row(range(8), CPU).at(4), RowStreams.shared_from(0, CPU)):
        assert torch.equal(choose_tokens(logits, streams, 0.0, None, None), logits.argmax(-1))


@pytest.mark.parametrize("streams", [RowStreams.per_row([1, 2], CPU), RowStreams.shared_from(0, CPU)])
def test_non_finite_probabilities_raise_diverged(streams):
    for bad in (float("nan"), float("inf")):
        probs = torch.tensor([[0.5, 0.5], [bad, 0.5]])
        with pytest.raises(Diverged):
            streams.categorical(probs)


def test_token_mixture_follows_both_models():
    """The token rule's writer draw and token draw give (1 - mix)·p_S + mix·p_T, and flag the
    teacher at rate mix."""
    n, mix = 40000, 0.3
    p_s = torch.tensor([0.6, 0.3, 0.1, 0.0])
    p_t = torch.tensor([0.0, 0.2, 0.3, 0.5])
    rule = token_rule(RolloutSampler(mix, "token", vocab_size=4))
    logits = [p.log().repeat(n, 1) for p in (p_s, p_t)]
    tokens, by_teacher = rule(logits, RowStreams.per_row(range(n), CPU).at(0))
    assert abs(float(by_teacher.double().mean()) - mix) < 0.01
    expected = ((1 - mix) * p_s + mix * p_t).double()
    assert chi_square(torch.bincount(tokens, minlength=4).double(), expected) < 22  # df 3
    assert (tokens[by_teacher] != 0).all() and (tokens[~by_teacher] != 3).all()  # each from its writer


@pytest.mark.parametrize(
    ("granularity", "mix"), [("sequence", 1.0), ("batch", 0.0), ("token", 0.5), ("speculative", 0.5)]
)
def test_seeded_row_same_in_any_batch(granularity, mix, student, teacher, char_tok):
    """A row's completion depends on its seed only: not on batch size, its index, or padding."""
    sampler = RolloutSampler(mix, granularity, max_new_tokens=N, vocab_size=VOCAB, speculative_top_k=3)
    target = "5 6="
    batches = [[target], ["12 34=46:", target, "7="], ["8=", "a much longer prompt=", "ab", "9 9=", target]]
    rows = []
    for texts in batches:
        enc = char_tok(texts, return_tensors="pt", padding=True)
        out = sampler.sample(student, teacher, enc.input_ids, enc.attention_mask, seed=9).completion_ids()
        rows.append(out[texts.index(target)])
    assert rows[0] == rows[1] == rows[2]
    enc = char_tok([target], return_tensors="pt")
    other_seed = sampler.sample(student, teacher, enc.input_ids, enc.attention_mask, seed=10).completion_ids()
    assert other_seed[0] != rows[0]  # the seed does reach the row
