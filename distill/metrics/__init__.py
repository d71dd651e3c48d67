"""Pure measurement functions (no Lightning): coverage of sampled answers, update sparsity."""

from distill.metrics.coverage import distinct_answers, normalize_answer, pass_at_k
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
    "distinct_answers",
    "module_type",
    "normalize_answer",
    "pass_at_k",
    "tensor_update_counts",
    "update_sparsity",
]
