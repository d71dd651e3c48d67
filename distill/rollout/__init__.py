"""Rollouts from a student/teacher mixture (KV-cached decoding) and the teacher-rollout cache.

Knows torch and Hugging Face models, not Lightning.
"""

from distill.rollout.batch import RolloutBatch
from distill.rollout.cache import RolloutCache, teacher_identity
from distill.rollout.decoding import filter_logits
from distill.rollout.sampler import GRANULARITIES, RolloutSampler

__all__ = [
    "GRANULARITIES",
    "RolloutBatch",
    "RolloutCache",
    "RolloutSampler",
    "filter_logits",
    "teacher_identity",
]
