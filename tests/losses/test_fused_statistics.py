"""The logging statistics that come out of the loss's own chunked pass equal `token_statistics`
(a separate pass) at every evaluated position, on every estimator path, at temperature 1 (shared
softmaxes) and otherwise; asking for them changes neither the loss nor its gradient."""

from __future__ import annotations

import pytest
import torch

from distill.losses import build_divergence, token_statistics

PATHS = [
    ("forward_kl", "exact", 1.0),
    ("reverse_kl", "exact", 0.7),
    ("jsd", "topk", 1.0),
    ("forward_kl", "k3", 1.0),
    ("reverse_kl", "k1", 1.3),
]


@pytest.mark.parametrize("name, estimator, temperature", PATHS)
@pytest.mark.parametrize("chunk_size", [2, None])
def test_statistics_from_the_loss_pass_equal_a_separate_pass(name, estimator, temperature, chunk_size):
    g = torch.Generator().manual_seed(5)
    s = torch.randn(3, 5, 12, generator=g).requires_grad_()
    t = 2 * torch.randn(3, 5, 14, generator=g)  # wider: padded embedding rows are cut
    tokens = torch.randint(0, 12, (3, 5), generator=g)
    mask = torch.rand(3, 5, generator=g) > 0.3
    div = build_divergence(name, estimator=estimator, temperature=temperature, top_k=4, chunk_size=chunk_size)
    loss, stats = div(s, t, mask, tokens=tokens, num_items=17, return_statistics=True)
    (grad,) = torch.autograd.grad(loss, s)
    plain = div(s, t, mask, tokens=tokens, num_items=17)
    (plain_grad,) = torch.autograd.grad(plain, s)
    assert torch.equal(loss, plain) and torch.equal(grad, plain_grad)
    want = token_statistics(s.detach(), t, vocab_size=12)
    for key, value in stats.items():
        assert value.shape == (3, 5) and not value.requires_grad
        torch.testing.assert_close(value[mask], want[key][mask], rtol=1e-5, atol=1e-6)
        assert torch.all(value[~mask] == 0)


def test_a_float64_pass_keeps_float64_statistics():
    s = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    t = torch.randn(2, 3, 6, dtype=torch.float64)
    mask = torch.ones(2, 3)
    _, stats = build_divergence("reverse_kl")(s, t, mask, return_statistics=True)
    want = token_statistics(s.detach(), t)
    for key, value in stats.items():
        assert value.dtype == torch.float64
        torch.testing.assert_close(value, want[key], rtol=1e-12, atol=1e-14)
