"""Registry, construction checks and config instantiation of the divergences."""

from __future__ import annotations

import re

import pytest
import torch

from distill.losses import (
    DIVERGENCES,
    ForwardKL,
    GeneralizedJSD,
    InterpolatedKL,
    ReverseKL,
    SkewKL,
    SkewReverseKL,
    TokenDivergence,
    TotalVariation,
    build_divergence,
)

KEYS = {
    "forward_kl": ForwardKL,
    "reverse_kl": ReverseKL,
    "jsd": GeneralizedJSD,
    "skew_kl": SkewKL,
    "skew_reverse_kl": SkewReverseKL,
    "tvd": TotalVariation,
    "interpolated_kl": InterpolatedKL,
}


def test_registry_keys_classes_and_names():
    assert DIVERGENCES == KEYS
    for key, cls in KEYS.items():
        assert cls.name == key and issubclass(cls, TokenDivergence)
        assert isinstance(build_divergence(key), cls)


def test_unknown_name_lists_allowed():
    with pytest.raises(ValueError, match="unknown divergence 'kl'.*forward_kl.*interpolated_kl"):
        build_divergence("kl")


@pytest.mark.parametrize(
    "name,kwargs,field",
    [
        ("jsd", {"beta": 1.5}, "beta"),
        ("jsd", {"beta": -0.1}, "beta"),
        ("skew_kl", {"alpha": 1.0}, "alpha"),
        ("skew_reverse_kl", {"alpha": -0.5}, "alpha"),
        ("interpolated_kl", {"weight": 2.0}, "weight"),
        ("forward_kl", {"temperature": 0.0}, "temperature"),
        ("forward_kl", {"top_k": 0}, "top_k"),
        ("forward_kl", {"chunk_size": 0}, "chunk_size"),
        ("forward_kl", {"vocab_size": 0}, "vocab_size"),
        ("forward_kl", {"estimator": "k4"}, "estimator"),
        ("reverse_kl", {"max_importance_weight": 0.0}, "max_importance_weight"),
    ],
)
def test_out_of_range_options_name_field_value_and_allowed(name, kwargs, field):
    value = next(iter(kwargs.values()))
    owner = KEYS[name].__name__  # options are named by their class, as a callback's are
    with pytest.raises(ValueError, match=rf"^{owner}\.{field} must be .*, got {re.escape(repr(value))}$"):
        build_divergence(name, **kwargs)


@pytest.mark.parametrize("name", ["jsd", "skew_kl", "skew_reverse_kl", "tvd", "interpolated_kl"])
@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_sampled_estimators_only_for_pure_kl(name, estimator):
    with pytest.raises(
        ValueError, match=rf"estimator must be one of \['exact', 'topk'\] .*, got '{estimator}'"
    ):
        build_divergence(name, estimator=estimator)


def test_call_time_input_errors():
    s, t = torch.randn(2, 3, 8), torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="needs tokens"):
        ReverseKL(estimator="k1").per_token(s, t)
    with pytest.raises(ValueError, match=r"tokens must lie in \[0, 8\)"):
        ReverseKL(estimator="k1").per_token(s, t, torch.full((2, 3), 8))
    with pytest.raises(ValueError, match="mask must have shape"):
        ForwardKL()(s, t, torch.ones(3, 2))
    with pytest.raises(ValueError, match="same B and T"):
        ForwardKL().per_token(s, torch.randn(2, 4, 8))
    with pytest.raises(ValueError, match="vocab_size=9 exceeds"):
        ForwardKL(vocab_size=9).per_token(s, t)
    with pytest.raises(ValueError, match="behaviour_logprobs is only used"):
        ForwardKL().per_token(s, t, behaviour_logprobs=torch.zeros(2, 3))


def test_sampled_estimator_ignores_invalid_tokens_at_masked_positions():
    s, t = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    tokens = torch.tensor([[2, -100, 5]])
    val = ReverseKL(estimator="k3")(s, t, torch.tensor([[1, 0, 1]]), tokens)
    assert torch.isfinite(val)


def test_module_to_and_repr():
    div = GeneralizedJSD(beta=0.25, estimator="topk", top_k=8, temperature=2.0).to(torch.float64)
    assert repr(div) == "GeneralizedJSD(beta=0.25, estimator='topk', temperature=2.0, top_k=8)"


def test_lightning_cli_style_instantiation():
    jsonargparse = pytest.importorskip("jsonargparse")
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--divergence", type=TokenDivergence)
    cfg = parser.parse_args(
        [
            "--divergence.class_path=distill.losses.GeneralizedJSD",
            "--divergence.init_args.beta=0.9",
            "--divergence.init_args.temperature=0.5",
            "--divergence.init_args.chunk_size=64",
        ]
    )
    div = parser.instantiate_classes(cfg).divergence
    assert isinstance(div, GeneralizedJSD)
    assert (div.beta, div.temperature, div.chunk_size) == (0.9, 0.5, 64)
