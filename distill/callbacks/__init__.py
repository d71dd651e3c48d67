"""Measurement callbacks: coverage, forgetting, update sparsity, logit-gradient norms, style and cost.

Each logs its scalars to TensorBoard and returns its final values from `summary()`, which
`distill fit` merges into the run's `metrics.json`.
"""

from distill.callbacks.cost_meter import CostMeter
from distill.callbacks.forgetting import Forgetting
from distill.callbacks.gradient_stats import GradientStats
from distill.callbacks.style_probe import StyleProbe
from distill.callbacks.task_evaluation import TaskEvaluation
from distill.callbacks.update_sparsity import UpdateSparsity

__all__ = ["CostMeter", "Forgetting", "GradientStats", "StyleProbe", "TaskEvaluation", "UpdateSparsity"]
