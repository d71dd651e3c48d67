"""The names in `distill.names` are the ones the layers use: the divergence classes the losses
register, the sampler's granularities, the estimators each divergence accepts."""

from __future__ import annotations

import pytest

from distill import losses, names
from distill.losses.divergences import DIVERGENCES
from distill.rollout import RolloutSampler


def test_divergence_class_paths_name_the_registered_classes():
    registered = {name: f"distill.losses.{cls.__name__}" for name, cls in DIVERGENCES.items()}
    assert registered == names.DIVERGENCE_CLASSES
    for path in names.DIVERGENCE_CLASSES.values():  # each path resolves to the class
        assert getattr(losses, path.rsplit(".", 1)[1]) in DIVERGENCES.values()


@pytest.mark.parametrize("granularity", names.GRANULARITIES)
def test_every_granularity_builds_a_sampler(granularity):
    assert RolloutSampler(mix=0.5, granularity=granularity).granularity == granularity


def test_estimators_are_what_the_divergences_accept():
    accepted = {e for cls in DIVERGENCES.values() for e in cls.estimators}
    assert accepted == set(names.ESTIMATORS) == set(names.EXACT_ESTIMATORS) | set(names.SAMPLED_ESTIMATORS)
