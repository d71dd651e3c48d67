"""Pure measurement functions (no Lightning): coverage of sampled answers, update sparsity, entropy."""

from distill.metrics.coverage import distinct_answers, normalize_answer, pass_at_k
from distill.metrics.entropy import masked_sum_count, token_entropy
from distill.metrics.sampled_coverage import coverage_metrics
from distill.metrics.sparsity import (
    MODULE_TYPES,
    SparsityReport,
    UpdateCounts,
    module_type,
    tensor_update_counts,
    update_sparsity,
)

__all__ = [
    "MODULE_TYPES",
    "SparsityReport",
    "UpdateCounts",
    "coverage_metrics",
    "distinct_answers",
    "masked_sum_count",
    "module_type",
    "normalize_answer",
    "pass_at_k",
    "tensor_update_counts",
    "token_entropy",
    "update_sparsity",
]
