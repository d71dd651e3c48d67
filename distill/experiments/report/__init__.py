"""`distill report`: the markdown tables, exploratory effects, plots, staged before/after sections
and verdict tables written from a sweep directory or its archive, and the verdict blocks the docs
quote. Imports `distill.experiments.run` and `distill.experiments.stats`.
"""
